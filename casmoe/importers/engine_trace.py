"""What a serving engine's per-request routing becomes: a casmoe `Trace`.

vLLM and SGLang record every decoder layer of the model, MoE or not, and only expert ids (no
router weights). The two readers reduce their dumps to `EngineRequest`s (prompt rows and decode
rows over all layers, in the engine's own ids); this module checks that all requests share one
geometry, drops the layers no token was routed in (dense layers: all -1 in SGLang, all 0 in
vLLM's zero-filled buffer), turns the remaining blank token-layers into `NOT_COMPUTED` rows and
gives every routed expert the weight 1/k (the dumps carry none).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from casmoe.geometry import Geometry, GeometryError
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError
from casmoe.trace_io import checked_trace


@dataclass
class EngineRequest:
    """One request as an engine dump holds it: expert ids `[tokens, all layers, k]` for the prompt
    tokens and for the generated tokens fed back (the last generated token never is)."""

    prompt_rows: np.ndarray
    decode_rows: np.ndarray
    where: str
    prompt: str | None = None
    output: str | None = None
    output_ids: np.ndarray | None = None
    arrival: float | None = None
    name: str | None = None
    cached_prefix: int = 0
    """Leading tokens served from a prefix cache: computed by an earlier request, so not routed here."""
    request_id: str | None = None
    """The engine's own id of the request (and choice), when the dump has one: two requests with
    one id are one response given twice."""

    def fingerprint(self) -> bytes:
        """Everything the request holds, arrival time included: two equal ones are one record twice."""
        h = hashlib.sha256(repr((self.arrival, self.prompt, self.output, self.prompt_rows.shape,
                                 self.decode_rows.shape)).encode())
        for a in (self.prompt_rows, self.decode_rows, self.output_ids):
            if a is not None:
                h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.digest()


def refuse_duplicates(requests: Sequence[EngineRequest]) -> None:
    """One request given twice (the same response pasted twice, a file listed twice under two
    names) would count twice in every statistic: refused, naming both places. Twice means the
    same engine request id (and choice) or, for a record without an id, the same content with
    the same arrival time. Requests with two ids, or equal routing but neither id nor time, are
    two requests (a prompt sent twice decodes the same greedily)."""
    seen: dict[tuple[str, Any], str] = {}
    for r in requests:
        if r.request_id is not None:
            key: tuple[str, Any] = ("id", r.request_id)
        elif r.arrival is not None:
            key = ("content", r.fingerprint())
        else:
            continue
        if key in seen:
            same = f"request id {key[1]!r}" if key[0] == "id" else "arrival time, routing and tokens"
            raise TraceError(f"{r.where}: the same request as {seen[key]} ({same}); a response given twice "
                             "would count twice: give each once")
        seen[key] = r.where


def _blank(rows: np.ndarray, zero_blank: bool) -> np.ndarray:
    """Bool [T, L]: the token-layer holds no routing (-1 padding, or vLLM's zero fill)."""
    blank = (rows < 0).all(axis=-1)
    if zero_blank:  # k > 1: a real routing never names expert 0 twice
        blank |= (rows == 0).all(axis=-1)
    return blank


def _ids_in_range(r: EngineRequest, rows: np.ndarray, num_experts: int | None) -> None:
    """Refuse an id below -1 (only -1, the documented "none", means no expert) or at or beyond
    `num_experts`, naming the request, the token (its position in the sequence) and the layer."""
    bad = rows < -1
    if num_experts is not None:
        bad |= rows >= num_experts
    if bad.any():
        t, layer, j = (int(x[0]) for x in np.nonzero(bad))
        position = t + (0 if rows is r.prompt_rows else len(r.prompt_rows)) + r.cached_prefix
        what = "prompt" if rows is r.prompt_rows else "generated"
        limit = "ids are >= 0, and -1 alone means none" if rows[t, layer, j] < -1 else \
            f"the model has {num_experts} experts per layer"
        raise TraceError(f"{r.where}: token {position} ({what}), layer {layer}: expert id {int(rows[t, layer, j])} "
                         f"({limit})")


def build_trace(
    requests: Sequence[EngineRequest],
    where: str,
    *,
    recorded_by: str,
    num_experts: int | None = None,
    meta: dict[str, Any] | None = None,
) -> Trace:
    """Requests -> Trace over the MoE layers only (see the module docstring).

    `num_experts` is the logical expert count when the dump knows it (SGLang's map) or the user
    says it; otherwise it is the largest id seen plus one, and the metadata says so."""
    if not requests:
        raise TraceError(f"{where}: no requests in the dump; nothing to import")
    refuse_duplicates(requests)
    first: dict[tuple[int, ...], str] = {}  # [layers, top_k] -> the first request that has it
    for r in requests:
        for rows in (r.prompt_rows, r.decode_rows):
            if rows.ndim != 3 or not np.issubdtype(rows.dtype, np.integer):
                raise TraceError(f"{r.where}: routed experts must be integers shaped [tokens, layers, top_k], got "
                                 f"{rows.dtype} {rows.shape}")
            first.setdefault(rows.shape[1:], r.where)
    if len(first) != 1:
        (a, wa), (b, wb) = list(first.items())[:2]
        raise TraceError(f"{where}: the requests mix geometries ([layers, top_k] {list(a)} in {wa}, {list(b)} in "
                         f"{wb}); import each model's dump on its own")
    [(L_all, k)] = first
    if L_all < 1 or k < 1:
        raise TraceError(f"{where}: routed experts have {L_all} layers and top_k {k}")
    zero_blank = k > 1
    used = np.zeros(L_all, dtype=bool)
    top = -1
    for r in requests:
        for rows in (r.prompt_rows, r.decode_rows):
            if len(rows):
                _ids_in_range(r, rows, num_experts)
                used |= ~_blank(rows, zero_blank).all(axis=0)
                top = max(top, int(rows.max()))
    moe = np.nonzero(used)[0]
    if not len(moe):
        raise TraceError(f"{where}: no token was routed to any expert in any layer")
    E = num_experts if num_experts is not None else top + 1
    try:
        g = Geometry(layers=len(moe), experts=E, top_k=k)
    except GeometryError as exc:
        raise TraceError(f"{where}: {exc}") from None
    out = []
    for r in requests:
        rows = np.concatenate([r.prompt_rows, r.decode_rows])[:, moe].astype(np.int64)  # [T, L, k]
        blank = _blank(rows, zero_blank)
        partial = (rows < 0).any(axis=-1) & ~blank
        if partial.any():
            t, layer = (int(x[0]) for x in np.nonzero(partial))
            raise TraceError(f"{r.where}: token {t}, MoE layer {layer}: fewer than top_k={k} experts routed")
        rows[blank] = NOT_COMPUTED
        weights = np.where(blank[:, :, None], 0.0, np.full(rows.shape, 1.0 / k)).astype(np.float32)
        try:
            out.append(Request(topk=rows.astype(np.int16), weights=weights, prefill=len(r.prompt_rows),
                               prompt=r.prompt, output=r.output, output_ids=r.output_ids, arrival=r.arrival))
        except TraceError as exc:  # e.g. output token ids < 0
            raise exc.within(r.where) from None
    arrivals = [r.arrival for r in out]
    if any(a is None for a in arrivals):
        for r in out:
            r.arrival = None
    else:
        t0 = min(arrivals)
        for r in out:
            r.arrival = float(r.arrival - t0)
    if any(r.output_ids is None for r in out):
        for r in out:
            r.output_ids = None
    info = {
        "source_model": "unknown",
        "recorded_by": recorded_by,
        "engine_layers": L_all,
        "moe_layers": [int(x) for x in moe],
        "experts_inferred": num_experts is None,
        "router_weights": "not in the dump; 1/k each",
        "request_names": [r.name for r in requests] if all(r.name for r in requests) else None,
        **(meta or {}),
    }
    return checked_trace(g, out, {n: v for n, v in info.items() if v is not None}, where)
