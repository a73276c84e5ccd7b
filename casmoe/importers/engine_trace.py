"""What a serving engine's per-request routing becomes: a casmoe `Trace`.

vLLM and SGLang record every decoder layer of the model, MoE or not, and only expert ids (no
router weights). The two readers reduce their dumps to `EngineRequest`s (prompt rows and decode
rows over all layers, in the engine's own ids); this module checks that all requests share one
geometry, drops the layers no token was routed in (dense layers: all -1 in SGLang, all 0 in
vLLM's zero-filled buffer), turns the remaining blank token-layers into `NOT_COMPUTED` rows and
gives every routed expert the weight 1/k (the dumps carry none).
"""

from __future__ import annotations

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


def _blank(rows: np.ndarray, zero_blank: bool) -> np.ndarray:
    """Bool [T, L]: the token-layer holds no routing (-1 padding, or vLLM's zero fill)."""
    blank = (rows < 0).all(axis=-1)
    if zero_blank:  # k > 1: a real routing never names expert 0 twice
        blank |= (rows == 0).all(axis=-1)
    return blank


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
                if (rows < -1).any():
                    raise TraceError(f"{r.where}: expert id {int(rows.min())} (ids are >= 0, -1 for none)")
                used |= ~_blank(rows, zero_blank).all(axis=0)
                top = max(top, int(rows.max()))
    moe = np.nonzero(used)[0]
    if not len(moe):
        raise TraceError(f"{where}: no token was routed to any expert in any layer")
    if num_experts is not None and top >= num_experts:
        raise TraceError(f"{where}: expert id {top} but the model has {num_experts} experts per layer")
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
