"""External routing-trace formats -> `Trace`, and `Trace` -> the long routing CSV.

Three sources exist in the wild and all become the one casmoe format:

- **route CSV** (`route_trace v1`, written by a llama.cpp-based engine): `#` header lines with
  `n_layer`, `n_expert`, `n_expert_used` and per-layer `expert_bytes`, then one row per routed
  expert: `turn,phase,step,layer,slot,expert,weight[,...]`. Each turn is one request; each step
  one token (prefill tokens are steps too, phase 0); a missing (step, layer) is a token-layer
  the engine did not compute and becomes a `NOT_COMPUTED` row, never an invented expert.
  `write_route_csv` writes the same format plus `# casmoe ...` lines (geometry, per-request
  prompt/task/lengths, metadata) so that export then import gives the trace back (all but the
  optional logits and spec, which the CSV has no column for).
- **moe-lrc arrays**: one file per layer (`.npy`, `.npz` or `.safetensors`, ordered by the
  layer number in the name), holding expert ids `[sequences, tokens, k]`, raw router logits
  `[sequences, tokens, E]` (top-k taken here) or moe-lrc's int8 ranks `[sequences, tokens, E]`.
  Each sequence is one request; all its tokens are decode steps unless `prefill` says otherwise.
- **plain JSON**: one or more requests, each a list per layer of each token's expert ids, with
  `num_experts` and `top_k`; a dict of named single-layer entries (moe-lrc's case traces, with
  `experts_per_token`) imports too, all of them or the one `key` names.

Every fault raises `TraceError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from casmoe.geometry import Geometry, GeometryError
from casmoe.resources import check_allocation
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError

CSV_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "weight")
_CASMOE_LINE = "# casmoe "


# ---- route CSV ------------------------------------------------------------------------------


def _parse_header(lines: Iterable[str], where: str) -> tuple[dict[str, str], dict[int, int], dict[str, Any]]:
    """Key=value pairs, per-layer expert bytes, and casmoe's own JSON lines from `#` lines."""
    keys: dict[str, str] = {}
    layer_bytes: dict[int, int] = {}
    extra: dict[str, Any] = {"request": {}}
    for line in lines:
        if line.startswith(_CASMOE_LINE):
            name, _, payload = line[len(_CASMOE_LINE) :].partition("=")
            try:
                value = json.loads(payload)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: bad '# casmoe {name}=' line: {exc}") from None
            if name == "request":
                ints = ("turn", "tokens", "prefill", "first_step", "rows")
                if (
                    not isinstance(value, dict)
                    or type(value.get("turn")) is not int
                    or not all(type(value.get(n, 0)) is int and value.get(n, 0) >= 0 for n in ints)
                    or not all(isinstance(value.get(n), (str, type(None))) for n in ("prompt", "task"))
                ):
                    raise TraceError(
                        f"{where}: '# casmoe request=' needs an object with non-negative integer turn, tokens, "
                        "prefill, first_step and string prompt, task"
                    )
                extra["request"][value["turn"]] = value
            elif name in ("geometry", "meta"):
                if not isinstance(value, dict):
                    raise TraceError(f"{where}: '# casmoe {name}=' must hold a JSON object")
                extra[name] = value
            continue
        pairs = dict(tok.split("=", 1) for tok in line[1:].split() if "=" in tok)
        if "layer" in pairs and "expert_bytes" in pairs:
            try:
                layer_bytes[int(pairs["layer"])] = int(pairs["expert_bytes"])
            except ValueError:
                raise TraceError(f"{where}: bad per-layer header line {line.strip()!r}") from None
        else:
            keys.update(pairs)
    return keys, layer_bytes, extra


def _csv_geometry(keys: dict[str, str], layer_bytes: dict[int, int], extra: dict[str, Any], where: str) -> Geometry:
    try:
        if "geometry" in extra:
            return Geometry.from_dict(extra["geometry"])
        L, E, k = (_exact_int(keys[n], n, text=True) for n in ("n_layer", "n_expert", "n_expert_used"))
        complete = len(layer_bytes) >= L and all(i in layer_bytes for i in range(L))
        per_layer = tuple(layer_bytes[i] for i in range(L)) if complete else ()
        return Geometry(layers=L, experts=E, top_k=k, layer_expert_bytes=per_layer)
    except KeyError as exc:
        raise TraceError(f"{where}: header lacks {exc} (need n_layer, n_expert, n_expert_used)") from None
    except (ValueError, TypeError, GeometryError) as exc:
        raise TraceError(f"{where}: bad geometry in header: {exc}") from None


def _exact_int(value: Any, what: str, text: bool = False) -> int:
    """An integer written as one (16, or "16" in a `text` header), never a float, a boolean or a
    JSON string that happens to convert."""
    if text and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{what} must be an integer, got {value!r}")


def read_route_csv(path: str | Path) -> Trace:
    """Import a `route_trace v1` CSV; one request per turn, gaps kept as `NOT_COMPUTED`."""
    import pandas as pd

    where = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            header = [line for line in fh if line.startswith("#")]
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - 1))
            cut = size > 0 and fh.read(1) != b"\n"
        if cut:
            raise TraceError(
                f"{where}: the last line has no newline, so the file looks cut mid-row; if it is complete, "
                "end it with a newline"
            )
        df = pd.read_csv(path, comment="#", skipinitialspace=True)
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(f"{where}: not a readable route CSV: {exc}") from None
    keys, layer_bytes, extra = _parse_header(header, where)
    g = _csv_geometry(keys, layer_bytes, extra, where)
    missing = [c for c in CSV_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: missing columns {missing} (have {list(df.columns)})")
    try:
        raw = {c: df[c].to_numpy(dtype=np.float64) for c in CSV_COLUMNS}
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{where}: non-numeric value in a routing column: {exc}") from None
    for c in CSV_COLUMNS[:-1]:
        bad = ~np.isfinite(raw[c]) | (raw[c] != np.round(raw[c])) | (np.abs(raw[c]) > 2**40)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {c} {raw[c][row]!r} is not an integer")
    cols = {c: raw[c].astype(np.int64) for c in CSV_COLUMNS[:-1]}
    weight = raw["weight"]
    for name, lo, hi in (("layer", 0, g.layers), ("slot", 0, g.top_k), ("expert", 0, g.experts), ("phase", 0, 2)):
        bad = (cols[name] < lo) | (cols[name] >= hi)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {name} {cols[name][row]} outside [{lo}, {hi})")
    requests = []
    turns = list(dict.fromkeys(cols["turn"].tolist()))  # order of first appearance
    declared = extra["request"]
    for turn in sorted(set(turns) | set(declared)):
        sel = np.nonzero(cols["turn"] == turn)[0]
        info = declared.get(turn, {})
        if "rows" in info and info["rows"] != len(sel):
            raise TraceError(f"{where}: turn {turn} declares {info['rows']} rows but has {len(sel)}; the file is cut or edited")
        if not len(sel) and "tokens" not in info:
            raise TraceError(f"{where}: '# casmoe request=' declares turn {turn} but neither its tokens nor any row")
        rows = {c: v[sel] for c, v in cols.items()}
        requests.append(_csv_request(g, rows, weight[sel], info, f"{where}: turn {turn}"))
    meta = {
        "source_model": keys.get("model", "unknown"),
        "arch": keys.get("arch"),
        "recorded_by": f"route CSV {Path(where).name}",
        **extra.get("meta", {}),
    }
    trace = Trace(g, requests, {k: v for k, v in meta.items() if v is not None})
    trace.validate(where)
    return trace


def _csv_request(
    g: Geometry, cols: dict[str, np.ndarray], weight: np.ndarray, info: dict[str, Any], where: str
) -> Request:
    """One turn's rows -> Request: token = step - first step, slot order kept."""
    L, k = g.layers, g.top_k
    steps = cols["step"]
    first = int(info.get("first_step", steps.min() if len(steps) else 0))
    tok = steps - first
    T = int(info.get("tokens", tok.max() + 1 if len(tok) else 0))
    seen = len(np.unique(tok))
    if T > 4 * seen + 64:  # whole tokens without rows are rare; a wide span means a damaged step column
        raise TraceError(f"{where}: {T} tokens but only {seen} steps have rows; the step column looks damaged")
    if len(tok) and (tok.min() < 0 or tok.max() >= T):
        raise TraceError(f"{where}: steps outside the declared {T} tokens")
    check_allocation(T * L * k * 14, f"{where}: {T} tokens x {L} layers x top-{k}")
    cell = (tok * L + cols["layer"]) * k + cols["slot"]  # unique per (token, layer, slot)
    uniq, counts = np.unique(cell, return_counts=True)
    if (counts > 1).any():
        c = int(uniq[counts > 1][0])
        raise TraceError(f"{where}: step {first + c // (L * k)}, layer {c // k % L}: slot {c % k} given twice")
    topk = np.full(T * L * k, NOT_COMPUTED, dtype=np.int16)
    weights = np.zeros(T * L * k, dtype=np.float32)
    topk[cell] = cols["expert"]
    weights[cell] = weight
    topk, weights = topk.reshape(T, L, k), weights.reshape(T, L, k)
    partial = (topk == NOT_COMPUTED).any(axis=2) & (topk != NOT_COMPUTED).any(axis=2)
    if partial.any():
        t, layer = (int(x[0]) for x in np.nonzero(partial))
        raise TraceError(f"{where}: step {first + t}, layer {layer}: fewer than top_k={k} experts routed")
    phase = np.full(T, -1)
    phase[tok] = cols["phase"]
    if "prefill" in info:
        prefill = int(info["prefill"])
    else:
        pre = np.nonzero(phase == 0)[0]
        prefill = int(pre.max() + 1) if len(pre) else 0
        if (phase[:prefill] == 1).any():
            raise TraceError(f"{where}: a decode step (phase 1) precedes a prefill step (phase 0)")
    return Request(topk=topk, weights=weights, prefill=prefill, prompt=info.get("prompt"), task=info.get("task"))


def write_route_csv(trace: Trace, path: str | Path, progress: bool = False) -> None:
    """Write the long routing CSV (gaps as absent rows); `read_route_csv` reads it back."""
    g = trace.geometry
    lines = [
        "# route_trace v1",
        f"# model={str(trace.meta.get('source_model', 'unknown')).replace(' ', '_')} "
        + (f"arch={trace.meta['arch']} " if trace.meta.get("arch") else "")
        + f"n_layer={g.layers} n_expert={g.experts} n_expert_used={g.top_k}",
    ]
    lines += [f"# layer={i} expert_bytes={b}" for i, b in enumerate(g.bytes_per_layer())]
    lines.append(_CASMOE_LINE + "geometry=" + json.dumps(g.to_dict()))
    meta = {k: v for k, v in trace.meta.items() if k != "arch"}
    lines.append(_CASMOE_LINE + "meta=" + json.dumps(meta))
    for i, r in enumerate(trace.requests):
        rows = int((r.topk != NOT_COMPUTED).sum())
        info = {"turn": i, "first_step": 0, "tokens": r.tokens, "prefill": r.prefill, "rows": rows}
        info.update(prompt=r.prompt, task=r.task)
        lines.append(_CASMOE_LINE + "request=" + json.dumps(info))
    lines.append(",".join(CSV_COLUMNS))
    import pandas as pd
    from tqdm import tqdm

    from casmoe.output import atomic_open

    with atomic_open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")
        for i, r in enumerate(tqdm(trace.requests, desc="export", unit="req", disable=not progress)):
            t, layer, slot = np.nonzero(r.topk != NOT_COMPUTED)  # row-major: step, layer, slot
            rows = pd.DataFrame(
                {
                    "turn": np.full(len(t), i),
                    "phase": (t >= r.prefill).astype(np.int64),
                    "step": t,
                    "layer": layer,
                    "slot": slot,
                    "expert": r.topk[t, layer, slot].astype(np.int64),
                    "weight": r.weights[t, layer, slot].astype(np.float64),
                }
            )
            rows.to_csv(fh, header=False, index=False, float_format="%.9g", lineterminator="\n")


# ---- moe-lrc arrays -------------------------------------------------------------------------

ARRAY_SUFFIXES = (".npy", ".npz", ".safetensors")


def _layer_files(sources: Sequence[str | Path]) -> list[Path]:
    """Files in layer order: a directory expands to its array files, sorted by the last number in the name."""
    files: list[Path] = []
    for src in map(Path, sources):
        if src.is_dir():
            files += [p for p in src.iterdir() if p.suffix in ARRAY_SUFFIXES]
        else:
            files.append(src)
    if not files:
        raise TraceError(f"{', '.join(map(str, sources))}: no .npy/.npz/.safetensors files")

    def layer_of(p: Path) -> tuple[int, str]:
        nums = re.findall(r"\d+", p.stem)
        return (int(nums[-1]) if nums else -1, p.name)

    return sorted(files, key=layer_of)


def _read_arrays(path: Path) -> np.ndarray:
    """All arrays of one layer file stacked as [sequences, tokens, last]; 2D arrays are one sequence."""
    where = str(path)
    try:
        if path.suffix == ".npy":
            arrays = [np.load(path, allow_pickle=False)]
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                arrays = [npz[n] for n in sorted(npz.files)]
        elif path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            loaded = load_file(str(path))
            arrays = [loaded[n] for n in sorted(loaded)]
        else:
            raise TraceError(f"{where}: unknown array file type (use {', '.join(ARRAY_SUFFIXES)})")
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except Exception as exc:  # numpy/zip/safetensors raise many types for a damaged file
        raise TraceError(f"{where}: not a readable array file: {type(exc).__name__}: {exc}") from None
    out = []
    for a in arrays:
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3:
            raise TraceError(f"{where}: array of shape {a.shape}; expected [sequences, tokens, k or E]")
        out.append(a)
    if not out:
        raise TraceError(f"{where}: holds no arrays")
    try:
        return np.concatenate(out)
    except ValueError as exc:
        raise TraceError(f"{where}: its arrays disagree in shape: {exc}") from None


def _to_topk(
    a: np.ndarray, kind: str, num_experts: int | None, top_k: int | None, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int | None]:
    """One layer's array -> topk [S, T, k], weights [S, T, k], logits [S, T, E] or None, and E
    when the array reveals it (logits and ranks have one column per expert)."""
    if kind == "auto":
        if np.issubdtype(a.dtype, np.floating):
            kind = "logits"
        elif top_k is not None and a.shape[-1] > top_k and num_experts in (None, a.shape[-1]):
            kind = "rank"
        else:
            kind = "topk"
    if kind == "topk":
        if not np.issubdtype(a.dtype, np.integer):
            raise TraceError(f"{where}: expert ids must be integers, not {a.dtype}")
        k = a.shape[-1]
        return a.astype(np.int64), np.full(a.shape, 1.0 / k, dtype=np.float32), None, None
    if kind not in ("rank", "logits"):
        raise TraceError(f"unknown array kind {kind!r} (auto, topk, logits, rank)")
    if top_k is None:
        raise TraceError(f"{where}: {kind} arrays need --top-k")
    if a.shape[-1] < top_k:
        raise TraceError(f"{where}: last dimension {a.shape[-1]} < top_k={top_k}")
    E = int(a.shape[-1])
    if kind == "rank":  # moe-lrc: rank of each expert's logit, highest = E - 1
        order = np.argsort(-a.astype(np.int64), axis=-1, kind="stable")[..., :top_k]
        return order, np.full(order.shape, 1.0 / top_k, dtype=np.float32), None, E
    logits = a.astype(np.float64)
    if not np.isfinite(logits).all():
        raise TraceError(f"{where}: router logits contain NaN or infinity")
    order = np.argsort(-logits, axis=-1, kind="stable")[..., :top_k]
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return order, np.take_along_axis(p, order, axis=-1).astype(np.float32), a.astype(np.float32), E


def read_lrc_arrays(
    sources: Sequence[str | Path],
    *,
    kind: str = "auto",
    num_experts: int | None = None,
    top_k: int | None = None,
    prefill: int = 0,
    keep_logits: bool = False,
) -> Trace:
    """Per-layer moe-lrc arrays -> one request per sequence."""
    files = _layer_files(sources)
    layers = [_to_topk(_read_arrays(f), kind, num_experts, top_k, str(f)) for f in files]
    where = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
    shapes = {t.shape for t, _, _, _ in layers}
    if len(shapes) != 1:
        raise TraceError(f"{where}: layers disagree on [sequences, tokens, k]: {sorted(shapes)}")
    S, T, k = shapes.pop()
    seen_E = {e for _, _, _, e in layers if e is not None}
    if len(seen_E) > 1:
        raise TraceError(f"{where}: layers disagree on the expert count {sorted(seen_E)}")
    if num_experts is None:
        if not seen_E:
            raise TraceError(f"{where}: expert-id arrays need --num-experts")
        num_experts = seen_E.pop()
    try:
        g = Geometry(layers=len(files), experts=num_experts, top_k=k)
    except GeometryError as exc:
        raise TraceError(f"{where}: {exc}") from None
    topk = np.stack([t for t, _, _, _ in layers], axis=2)  # [S, T, L, k]
    if ((topk < 0) | (topk >= num_experts)).any():
        raise TraceError(f"{where}: expert id outside [0, {num_experts})")
    weights = np.stack([w for _, w, _, _ in layers], axis=2)
    logits = None
    if keep_logits and all(lg is not None for _, _, lg, _ in layers):
        logits = np.stack([lg for _, _, lg, _ in layers], axis=2)
    if not 0 <= prefill <= T:
        raise TraceError(f"{where}: prefill {prefill} outside [0, {T}] tokens")
    requests = [
        Request(
            topk=topk[s].astype(np.int16),
            weights=weights[s],
            prefill=prefill,
            logits=None if logits is None else logits[s],
        )
        for s in range(S)
    ]
    trace = Trace(g, requests, {"source_model": "unknown", "recorded_by": f"moe-lrc arrays ({len(files)} layer files)"})
    trace.validate(where)
    return trace


# ---- plain JSON -----------------------------------------------------------------------------


def _json_request(entry: Any, E: int, k: int, where: str) -> tuple[Request, int]:
    """One JSON request -> (Request, its layer count)."""
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: a request must be an object, not {type(entry).__name__}")
    if "layers" in entry:
        per_layer = entry["layers"]
    elif "experts_per_token" in entry:
        per_layer = [entry["experts_per_token"]]
    else:
        raise TraceError(f"{where}: a request needs 'layers' (per layer, per token expert ids) or 'experts_per_token'")
    if not isinstance(per_layer, list) or not per_layer or not all(isinstance(x, list) for x in per_layer):
        raise TraceError(f"{where}: 'layers' must be a non-empty list of per-token lists")
    T = len(per_layer[0])
    if any(len(x) != T for x in per_layer):
        raise TraceError(f"{where}: layers disagree on the token count {sorted({len(x) for x in per_layer})}")
    L = len(per_layer)
    topk = np.full((T, L, k), NOT_COMPUTED, dtype=np.int64)
    for layer, tokens in enumerate(per_layer):
        for t, ids in enumerate(tokens):
            if ids is None or ids == []:
                continue  # not computed
            ints = isinstance(ids, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in ids)
            if not ints or len(ids) != k:
                raise TraceError(f"{where}: layer {layer}, token {t}: expected {k} integer expert ids, got {ids!r}")
            if not all(0 <= e < E for e in ids):
                raise TraceError(f"{where}: layer {layer}, token {t}: expert id outside [0, {E}) in {ids}")
            topk[t, layer] = ids
    computed = topk != NOT_COMPUTED
    if "weights" in entry:
        try:
            w = np.asarray(entry["weights"], dtype=np.float64)
        except (ValueError, TypeError):
            raise TraceError(f"{where}: 'weights' must be numbers shaped like the expert ids") from None
        if w.shape != (L, T, k):
            raise TraceError(f"{where}: 'weights' has shape {w.shape}, expected [{L}, {T}, {k}]")
        weights = np.where(computed, w.transpose(1, 0, 2), 0.0)
    else:
        weights = np.where(computed, 1.0 / k, 0.0)
    prefill = entry.get("prefill", 0)
    if type(prefill) is not int or not 0 <= prefill <= T:
        raise TraceError(f"{where}: prefill {prefill!r} outside [0, {T}] tokens")
    prompt, task = entry.get("prompt"), entry.get("task")
    for name, v in (("prompt", prompt), ("task", task)):
        if v is not None and not isinstance(v, str):
            raise TraceError(f"{where}: {name} must be a string")
    req = Request(
        topk=topk.astype(np.int16), weights=weights.astype(np.float32), prefill=prefill, prompt=prompt, task=task
    )
    return req, L


def read_json(path: str | Path, key: str | None = None) -> Trace:
    """Plain JSON routing -> Trace (see the module docstring for the accepted shapes)."""
    where = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{where}: not readable JSON: {exc}") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to be a routing trace") from None
    common: dict[str, Any] = {}
    if isinstance(doc, list):
        entries = [(f"request {i}", e) for i, e in enumerate(doc)]
    elif isinstance(doc, dict) and "requests" in doc:
        common = doc
        if not isinstance(doc["requests"], list):
            raise TraceError(f"{where}: 'requests' must be a list")
        entries = [(f"request {i}", e) for i, e in enumerate(doc["requests"])]
    elif isinstance(doc, dict) and ("layers" in doc or "experts_per_token" in doc):
        entries = [("request 0", doc)]
    elif isinstance(doc, dict):  # named entries, e.g. moe-lrc case traces; "_..." keys are notes
        entries = [(name, e) for name, e in doc.items() if not name.startswith("_")]
    else:
        raise TraceError(f"{where}: expected a JSON object or list of requests")
    if key is not None:
        entries = [(n, e) for n, e in entries if n == key]
        if not entries:
            names = [n for n in doc if not n.startswith("_")] if isinstance(doc, dict) else []
            raise TraceError(f"{where}: no entry {key!r} (entries: {', '.join(names) or 'none named'})")
    if not entries:
        raise TraceError(f"{where}: no requests")

    def shape_of(name: str, e: Any) -> tuple[int, int]:
        src = e if isinstance(e, dict) and "num_experts" in e else common
        try:
            return _exact_int(src["num_experts"], "num_experts"), _exact_int(src["top_k"], "top_k")
        except ValueError as exc:
            raise TraceError(f"{where}: {name}: {exc}") from None
        except (KeyError, TypeError):
            raise TraceError(f"{where}: {name}: needs integer num_experts and top_k") from None

    shapes = {shape_of(n, e) for n, e in entries}
    if len(shapes) != 1:
        raise TraceError(f"{where}: entries disagree on (num_experts, top_k) {sorted(shapes)}; import one with --key")
    E, k = shapes.pop()
    requests, layer_counts, models = [], set(), []
    for name, e in entries:
        req, L = _json_request(e, E, k, f"{where}: {name}")
        requests.append(req)
        layer_counts.add(L)
        if isinstance(e, dict) and e.get("model"):
            models.append(f"{e['model']}" + (f" layer {e['layer_idx']}" if "layer_idx" in e else ""))
    if len(layer_counts) != 1:
        raise TraceError(f"{where}: requests disagree on the layer count {sorted(layer_counts)}")
    try:
        g = Geometry(layers=layer_counts.pop(), experts=E, top_k=k)
    except GeometryError as exc:
        raise TraceError(f"{where}: {exc}") from None
    meta = {
        "source_model": "; ".join(dict.fromkeys(models)) or str(common.get("model", "unknown")),
        "recorded_by": f"JSON {Path(where).name}" + (f" (key {key})" if key else ""),
        "request_names": [n for n, _ in entries],
    }
    trace = Trace(g, requests, meta)
    trace.validate(where)
    return trace


# ---- dispatch -------------------------------------------------------------------------------

FORMATS = ("auto", "csv", "json", "arrays", "npz")


def import_trace(sources: Sequence[str | Path], fmt: str = "auto", **options: Any) -> Trace:
    """Read any supported source; `fmt='auto'` decides by suffix (a directory means arrays)."""
    sources = [Path(s) for s in sources]
    if not sources:
        raise TraceError("no input given")
    if fmt == "auto":
        first = sources[0]
        if first.is_dir() or len(sources) > 1 or first.suffix in (".npy", ".safetensors"):
            fmt = "arrays"
        elif first.suffix == ".npz":
            fmt = "npz" if _is_casmoe_npz(first) else "arrays"
        elif first.suffix == ".json":
            fmt = "json"
        else:
            fmt = "csv"
    if fmt != "arrays" and len(sources) != 1:
        raise TraceError(f"format {fmt} takes one input file, got {len(sources)}")
    if fmt == "csv":
        return read_route_csv(sources[0])
    if fmt == "json":
        return read_json(sources[0], key=options.get("key"))
    if fmt == "npz":
        return Trace.load(sources[0])
    if fmt == "arrays":
        names = ("kind", "num_experts", "top_k", "prefill", "keep_logits")
        opts = {n: options[n] for n in names if options.get(n) is not None}
        return read_lrc_arrays(sources, **opts)
    raise TraceError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")


def read_specs(specs: Sequence[str]) -> list[tuple[str, Trace]]:
    """Each `PATH` or `PATH#KEY` (one named entry of a JSON file), any format -> (label, Trace).

    The label is the key, else the file's stem; repeated labels get their position appended."""
    loaded = []
    for spec in specs:
        path, _, key = spec.partition("#")
        loaded.append((key or Path(path).stem, import_trace([path], key=key or None)))
    names = [name for name, _ in loaded]
    return [(f"{n}[{i}]" if names.count(n) > 1 else n, tr) for i, (n, (_, tr)) in enumerate(zip(names, loaded))]



def _is_casmoe_npz(path: Path) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return "meta.npy" in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
