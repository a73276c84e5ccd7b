"""SGLang's expert-distribution recorder and `return_routed_experts` -> `Trace`.

**per_token dumps** (`--expert-distribution-recorder-mode per_token`, written by
`/dump_expert_distribution_record` as `expert_distribution_recorder_{time}_{rank}.pt`) hold a
`torch.save`d dict: `records`, one per forward pass, and `last_physical_to_logical_map`
`[layers, physical experts]`. A record has `forward_pass_id`, `rank`, `input_ids`,
`positions`, `extend_seq_lens` (per sequence of an extend pass; none in a decode pass),
`forward_mode` (1 extend, 2 decode, 3 mixed, 4 idle) and `topk_ids_of_layer` int32
`[layers, tokens, 8]`: physical expert ids, -1 where nothing was routed (dense layers, and the
columns beyond the model's top-k). Dumps carry no request ids, so requests are put back
together from positions: a sequence starting at position 0 is a new request; one starting at
p continues the open request whose next position is p (a chunked prefill, or a decode token),
ties going to the request seen first, as SGLang keeps its running batch in order; an extend
at p > 0 that continues nothing is a new request whose first p tokens came from the prefix
cache (no routing for them), a decode token that continues nothing a request that began before
the recording (no prompt rows). In a mixed pass a one-token sequence that continues a request
is its decode token. Every running request takes part in each decode (and mixed) pass, and a
chunked prompt continues in the very next prefill, so a request absent from a decode or mixed
pass has finished: it is closed there, and a later request at the same position (one served
after it) never receives its tokens. Where a decode pass has fewer tokens at a position than
open requests, requests that just completed their prefill take them before older decoding
ones (which may have stopped; see `_decode_owners`). Ids go through the map to logical experts. Ranks that recorded the same
passes (tensor parallelism) count once; others (data-parallel attention) add their requests.

**responses** (`"return_routed_experts": true`): `meta_info.routed_experts` is base64 int32
ordered (token, layer, k) over prompt + completion - 1 tokens, -1 in non-MoE layers; `text`
and `output_ids` come along. The ids hold no shape, so `top_k` (columns per layer) is needed;
with shared-expert fusion SGLang adds a column per fused shared expert (ids beyond the routed
ones): serve with `--disable-shared-experts-fusion` to record routed experts only.

`stat` dumps hold only counts: `read_sglang_counts` makes them popularity profiles (so does it
for per_pass and per_token dumps).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from casmoe.importers.engine_trace import EngineRequest, build_trace
from casmoe.importers.ktransformers import frequency_table
from casmoe.importers.torch_file import load_torch_file
from casmoe.importers.dump_files import as_int_array, b64_bytes, engine_files, json_records, text_field
from casmoe.profile import Profile, ProfileError, from_engine_counts
from casmoe.trace import Trace, TraceError

EXTEND, DECODE, MIXED, IDLE = 1, 2, 3, 4
"""SGLang's `ForwardMode` values a per_token dump can hold (speculative modes are refused)."""


@dataclass(eq=False)
class _Open:
    """A request being put back together from the passes."""

    prompt: list[np.ndarray] = field(default_factory=list)  # [n, L, K] chunks
    decode: list[np.ndarray] = field(default_factory=list)
    decode_ids: list[int] = field(default_factory=list)
    next_pos: int = 0
    decoding: bool = False
    cached: int = 0
    order: int = 0  # first appearance among the rank's requests


def physical_to_logical(ids: np.ndarray, mapping: np.ndarray | None, where: str) -> np.ndarray:
    """`ids [L, T, K]` physical -> logical through `mapping [L, P]`. -1 (SGLang's "none") stays
    -1; any other negative id, or one beyond the map, is refused naming the layer and token row
    (never read as "not computed")."""
    bad = ids < -1
    if mapping is not None:
        L, P = mapping.shape
        if ids.shape[0] != L:
            raise TraceError(f"{where}: {ids.shape[0]} layers of expert ids but the physical-to-logical map has {L}")
        bad |= ids >= P
    if bad.any():
        layer, t, j = (int(x[0]) for x in np.nonzero(bad))
        v = int(ids[layer, t, j])
        why = "ids are >= 0, and -1 alone means none" if v < -1 else f"beyond the map's {P} physical experts"
        raise TraceError(f"{where}: layer {layer}, token row {t}: physical expert id {v} ({why})")
    if mapping is None:
        return ids
    rows = np.arange(L)[:, None, None]
    return np.where(ids >= 0, mapping[rows, np.clip(ids, 0, None)], -1)


def load_map(doc: dict[str, Any], where: str) -> tuple[np.ndarray | None, int | None]:
    """The dump's physical-to-logical map and the logical expert count it implies."""
    raw = doc.get("last_physical_to_logical_map")
    if raw is None:
        return None, None
    mapping = as_int_array(raw, where, "last_physical_to_logical_map", 2)
    if mapping.size == 0 or mapping.min() < 0:
        raise TraceError(f"{where}: last_physical_to_logical_map must map every physical expert to a logical id >= 0")
    E = int(mapping.max()) + 1
    for layer, row in enumerate(mapping):
        if len(np.unique(row)) != E:
            raise TraceError(f"{where}: the map leaves some logical experts of layer {layer} without a physical copy")
    return mapping, E


def _record(rec: Any, where: str) -> dict[str, Any]:
    """One pass record, its fields checked."""
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: a record must be a dict, got {type(rec).__name__}")
    need = ("forward_pass_id", "input_ids", "positions", "forward_mode", "topk_ids_of_layer")
    missing = [n for n in need if n not in rec]
    if missing:
        hint = " (a per_pass or stat dump: counts only, use `casmoe popularity import --format sglang-stat`)" \
            if "global_physical_count" in rec else ""
        raise TraceError(f"{where}: record lacks {', '.join(missing)}{hint}")
    ids = as_int_array(rec["input_ids"], where, "input_ids", 1)
    pos = as_int_array(rec["positions"], where, "positions", 1)
    topk = as_int_array(rec["topk_ids_of_layer"], where, "topk_ids_of_layer", 3)
    mode = rec["forward_mode"]
    if type(mode) is not int:
        raise TraceError(f"{where}: forward_mode must be an integer, got {mode!r}")
    if not len(ids) == len(pos) == topk.shape[1]:
        raise TraceError(f"{where}: {len(ids)} input_ids, {len(pos)} positions, {topk.shape[1]} token rows disagree")
    lens = rec.get("extend_seq_lens")
    if mode in (EXTEND, MIXED):
        lens = as_int_array(lens, where, "extend_seq_lens", 1)
        if lens.sum() != len(ids) or (lens < 1).any():
            raise TraceError(f"{where}: extend_seq_lens {lens.tolist()[:8]} do not split its {len(ids)} tokens")
    elif mode == DECODE:
        lens = np.ones(len(ids), dtype=np.int64)
    elif mode == IDLE:
        lens = np.zeros(0, dtype=np.int64)
    else:
        raise TraceError(f"{where}: forward_mode {mode} (speculative decoding or another mode) is not supported; "
                         "record with speculative decoding off")
    fid = rec["forward_pass_id"]
    if type(fid) is not int:
        raise TraceError(f"{where}: forward_pass_id must be an integer, got {fid!r}")
    return {"id": fid, "rank": rec.get("rank", 0), "ids": ids, "pos": pos, "topk": topk, "mode": mode, "lens": lens}


def _requests(records: list[dict[str, Any]], k: int, where: str, rank: Any) -> list[EngineRequest]:
    """Requests of one rank's passes, in forward-pass order (see the module docstring)."""
    done: list[_Open] = []  # every request, in order of first appearance
    by_next: dict[int, list[_Open]] = {}  # next position -> open requests, first seen first

    def take(pos: int, decoding: bool) -> _Open | None:
        for r in by_next.get(pos, []):
            if r.decoding == decoding:
                by_next[pos].remove(r)
                return r
        return None

    for rec in records:
        rows = rec["topk"].transpose(1, 0, 2)  # [T, L, K]
        if (rows[:, :, k:] >= 0).any():
            raise TraceError(f"{where}: pass {rec['id']}: more than top_k={k} experts for a token")
        rows = rows[:, :, :k]
        segments, start = [], 0
        for n in rec["lens"].tolist():
            pos = rec["pos"][start : start + n]
            p0 = int(pos[0])
            if not np.array_equal(pos, np.arange(p0, p0 + n)):
                raise TraceError(f"{where}: pass {rec['id']}: a sequence's positions are not consecutive")
            is_decode = rec["mode"] == DECODE or (rec["mode"] == MIXED and n == 1 and bool(by_next.get(p0)))
            segments.append((p0, n, rows[start : start + n], rec["ids"][start : start + n], is_decode))
            start += n
        chosen = _decode_owners([s[0] for s in segments if s[4]], by_next)
        placed = []
        for p0, n, seg_rows, seg_ids, is_decode in segments:
            if is_decode:
                r = chosen[p0].pop(0) if chosen.get(p0) else None
                if r is None:  # began before the recording
                    r = _Open(next_pos=p0, decoding=True, order=len(done))
                    done.append(r)
                r.decoding = True
                r.decode.append(seg_rows)
                r.decode_ids += seg_ids.tolist()
            else:
                r = take(p0, False) if p0 > 0 else None
                if r is None:
                    r = _Open(next_pos=p0, cached=p0, order=len(done))
                    done.append(r)
                r.prompt.append(seg_rows)
            r.next_pos = p0 + n
            placed.append(r)
        if rec["mode"] in (DECODE, MIXED):
            by_next.clear()  # every running request takes part in a decode pass: one absent has finished
        for r in placed:
            by_next.setdefault(r.next_pos, []).append(r)
    L = records[0]["topk"].shape[0] if records else 0
    empty = np.zeros((0, L, k), dtype=np.int64)
    out = []
    for i, r in enumerate(done):
        label = f"{where} rank {rank} request {i}"
        out.append(EngineRequest(
            np.concatenate(r.prompt) if r.prompt else empty, np.concatenate(r.decode) if r.decode else empty, label,
            output_ids=np.array(r.decode_ids, dtype=np.int64), name=f"rank{rank}/{i}", cached_prefix=r.cached,
        ))
    return out


def _decode_owners(positions: list[int], by_next: dict[int, list[_Open]]) -> dict[int, list[_Open]]:
    """The open requests the decode tokens of one pass belong to, per position, in batch order.

    At a position with fewer tokens than open requests some have finished. A request whose
    prefill just completed decodes next unless it stopped at its first token, while one already
    decoding may stop at any step: so prefilled requests are chosen first, then decoding ones,
    each first seen first; the chosen take the tokens in the order they joined the batch."""
    owners: dict[int, list[_Open]] = {}
    for pos, m in Counter(positions).items():
        open_here = by_next.get(pos, [])
        ranked = [r for r in open_here if not r.decoding] + [r for r in open_here if r.decoding]
        owners[pos] = sorted(ranked[:m], key=lambda r: r.order)
        for r in owners[pos]:
            open_here.remove(r)
    return owners


def _top_k(records: list[dict[str, Any]], where: str) -> int:
    """Routed experts per token: the most non-negative ids any token-layer has."""
    k = 0
    for rec in records:
        if rec["topk"].size:
            k = max(k, int((rec["topk"] >= 0).sum(axis=2).max()))
    if k == 0:
        raise TraceError(f"{where}: no token was routed to any expert")
    return k


def _same_passes(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        x["id"] == y["id"] and np.array_equal(x["ids"], y["ids"]) and np.array_equal(x["topk"], y["topk"])
        for x, y in zip(a, b)
    )


def read_per_token(files: Sequence[Path], where: str) -> Trace:
    """per_token dumps (one or more ranks, one or more dumps) -> one trace."""
    by_rank: dict[Any, list[dict[str, Any]]] = {}
    maps: list[tuple[np.ndarray | None, int | None]] = []
    seen: dict[tuple[str, int], str] = {}
    for f in files:
        doc = load_torch_file(f, "an SGLang per_token dump (.pt)")
        if not isinstance(doc, dict) or "records" not in doc:
            hint, held = "", type(doc).__name__
            if isinstance(doc, dict):
                keys = ", ".join(map(str, list(doc)[:8])) + (" ..." if len(doc) > 8 else "")
                held = f"a dict (keys: {keys or 'none'})"
            if isinstance(doc, dict) and "logical_count" in doc:
                hint = "; a stat dump holds counts only: use `casmoe popularity import --format sglang-stat`"
            elif isinstance(doc, np.ndarray):
                held = f"a tensor {list(doc.shape)}"
                hint = "; a counts table: use `casmoe popularity import --format ktransformers`"
            raise TraceError(f"{f} is a torch.save file of {held}, not an SGLang per_token dump (a dict with "
                             f"'records'){hint}")
        if not isinstance(doc["records"], list):
            raise TraceError(f"{f}: 'records' must be a list")
        mapping, E = load_map(doc, str(f))
        maps.append((mapping, E))
        for i, rec in enumerate(doc["records"]):
            r = _record(rec, f"{f} record {i}")
            r["topk"] = physical_to_logical(r["topk"], mapping, f"{f} record {i}")
            key = (str(r["rank"]), r["id"])  # SGLang numbers passes once per server: a pass twice is a dump twice
            if key in seen:
                raise TraceError(f"{f} record {i}: forward pass {r['id']} of rank {r['rank']} again (first in "
                                 f"{seen[key]}): passes given twice would count twice; give each dump once")
            seen[key] = f"{f} record {i}"
            by_rank.setdefault(r["rank"], []).append(r)
    Es = {E for _, E in maps}
    if len(Es) > 1:
        raise TraceError(f"{where}: the dumps' maps disagree on the logical expert count {sorted(map(str, Es))}")
    E = Es.pop()
    streams: list[tuple[Any, list[dict[str, Any]]]] = []
    for rank in sorted(by_rank, key=str):
        recs = sorted(by_rank[rank], key=lambda r: r["id"])
        if not any(_same_passes(recs, other) for _, other in streams):  # a tensor-parallel copy counts once
            streams.append((rank, recs))
    all_records = [r for _, recs in streams for r in recs]
    if not all_records:
        raise TraceError(f"{where}: the dump holds no forward passes; record while requests run")
    k = _top_k(all_records, where)
    requests = [req for rank, recs in streams for req in _requests(recs, k, where, rank)]
    cached = [r.cached_prefix for r in requests]
    meta = {"ranks": [str(r) for r, _ in streams], "passes": len(all_records),
            "prefix_cached_tokens": cached if any(cached) else None,
            "started_before_recording": sum(1 for r in requests if not len(r.prompt_rows)) or None,
            "output_ids": "the generated tokens fed back; the last one generated never is"}
    return build_trace(requests, where, recorded_by=f"SGLang per_token dump ({len(files)} files)", num_experts=E,
                       meta={n: v for n, v in meta.items() if v is not None})


def _response(doc: Any, where: str, top_k: int | None) -> EngineRequest:
    """One `/generate` response with `meta_info.routed_experts` -> EngineRequest."""
    info = doc.get("meta_info") if isinstance(doc, dict) else None
    if not isinstance(info, dict) or "routed_experts" not in info:
        raise TraceError(f"{where}: no meta_info.routed_experts (send \"return_routed_experts\": true)")
    if top_k is None:
        raise TraceError(f"{where}: SGLang's routed experts carry no shape; give --top-k (or --model)")
    n_prompt, n_out = info.get("prompt_tokens"), info.get("completion_tokens")
    if type(n_prompt) is not int or type(n_out) is not int or n_prompt < 0 or n_out < 0:
        raise TraceError(f"{where}: meta_info needs integer prompt_tokens and completion_tokens")
    raw = b64_bytes(info["routed_experts"], where)
    T = n_prompt + max(n_out - 1, 0)
    if len(raw) % 4 or not T or not raw or (len(raw) // 4) % (T * top_k):
        raise TraceError(f"{where}: {len(raw)} bytes of int32 ids do not split into {T} tokens x layers x top-{top_k}")
    ids = np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(T, -1, top_k)
    out_ids = doc.get("output_ids")
    out_ids = None if out_ids is None else as_int_array(out_ids, where, "output_ids", 1)
    if out_ids is not None and len(out_ids) != n_out:
        raise TraceError(f"{where}: {len(out_ids)} output_ids but meta_info.completion_tokens says {n_out}")
    engine_id = text_field(info.get("id"), where, "meta_info.id")
    return EngineRequest(ids[:n_prompt], ids[n_prompt:], where, output=text_field(doc.get("text"), where, "text"),
                         output_ids=out_ids, name=engine_id, request_id=engine_id)


def is_sglang_json(doc: Any) -> bool:
    """Whether a parsed JSON object looks like an SGLang response with routing."""
    if isinstance(doc, list) and doc:
        doc = doc[0]
    return isinstance(doc, dict) and isinstance(doc.get("meta_info"), dict) and "routed_experts" in doc["meta_info"]


def read_sglang(sources: Sequence[str | Path], *, top_k: int | None = None, num_experts: int | None = None) -> Trace:
    """SGLang per_token dumps (`.pt`) or responses (`.json`/`.jsonl`) -> one trace."""
    files = engine_files(sources, (".pt", ".json", ".jsonl"), "SGLang")
    where = ", ".join(map(str, files[:3])) + (" ..." if len(files) > 3 else "")
    kinds = {f.suffix == ".pt" for f in files}
    if len(kinds) > 1:
        raise TraceError(f"{where}: mixes .pt dumps and JSON responses; import them one kind at a time")
    if kinds == {True}:
        trace = read_per_token(files, where)
        if num_experts is not None and not trace.meta.get("experts_inferred") and num_experts != trace.geometry.experts:
            raise TraceError(f"{where}: {num_experts} experts per layer (--num-experts or --model), but the dump's map "
                             f"has {trace.geometry.experts} logical experts")
        return trace  # without a map the count is the largest id + 1, a lower bound (`checks.agree`)
    requests = [_response(doc, label, top_k) for f in files for label, doc in json_records(f)]
    return build_trace(requests, where, recorded_by=f"SGLang responses ({len(files)} files)", num_experts=num_experts)


def read_sglang_counts(sources: Sequence[str | Path], *, model_layers: int | None = None) -> Profile:
    """SGLang recorder dumps -> a popularity profile over logical experts, summed over files.

    `stat` dumps give `logical_count [steps, layers, experts]`; `per_pass` dumps a
    `global_physical_count [layers, physical]` per record and `per_token` dumps ids per token,
    both mapped to logical experts through `last_physical_to_logical_map`."""
    files = engine_files(sources, (".pt",), "SGLang", ProfileError)
    tables = []
    for f in files:
        doc = load_torch_file(f, "an SGLang expert-distribution dump (.pt)", ProfileError)
        if isinstance(doc, dict) and "records" in doc:
            tables.append(_pass_counts(doc, str(f)))
        else:
            tables.append(frequency_table(doc, str(f)))
    if len({t.shape for t in tables}) != 1:
        raise ProfileError(f"the dumps disagree on [layers, experts]: {sorted({t.shape for t in tables})}")
    return from_engine_counts(sum(tables), ", ".join(map(str, files)), model_layers=model_layers, meta={
        "source": "SGLang expert distribution recorder", "files": [f.name for f in files]})


def _pass_counts(doc: dict[str, Any], where: str) -> np.ndarray:
    """[layers, logical experts] counts of a per_pass or per_token dump."""
    mapping, E = load_map(doc, where)
    if mapping is None:
        raise ProfileError(f"{where}: a records dump needs last_physical_to_logical_map to count logical experts")
    L, P = mapping.shape
    counts = np.zeros((L, E))
    rows = np.repeat(np.arange(L)[:, None], P, axis=1)
    records = doc["records"] if isinstance(doc["records"], list) else []
    for i, rec in enumerate(records):
        label = f"{where} record {i}"
        if isinstance(rec, dict) and "global_physical_count" in rec:
            phys = as_int_array(rec["global_physical_count"], label, "global_physical_count", 2)
            if phys.shape != (L, P) or (phys < 0).any():
                raise ProfileError(f"{label}: global_physical_count must be {L} x {P} counts >= 0, got {phys.shape}")
            np.add.at(counts, (rows, mapping), phys)
        else:
            ids = physical_to_logical(_record(rec, label)["topk"], mapping, label)  # [L, T, K]
            layer = np.broadcast_to(np.arange(L)[:, None, None], ids.shape)
            np.add.at(counts, (layer[ids >= 0], ids[ids >= 0]), 1)
    return counts
