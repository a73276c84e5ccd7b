"""Adaptive gating (AdapMoE's lossy half) as a transform of the routing a runtime feeds its cache.

AdapMoE (Zhong et al., ICCAD 2024, arXiv 2408.10284; code PKU-SEC-Lab/AdapMoE,
benchmarks/modified_mixtral.py) lets a token whose router is confident use fewer experts: on
Mixtral's top-2 it zeroes the second expert's normalised weight when it is below a threshold and
renormalises, so the token runs its top-1 expert alone. Here, for any k: a token-layer whose
largest router weight is at least `threshold` of its top-k weights' sum (the weight itself on
a model that normalises its top-k, as Mixtral does and AdapMoE's rule reads it; OLMoE's raw
softmax weights are normalised the same way first) keeps only that expert, with the token-layer's
whole top-k weight (AdapMoE's renormalisation: weight 1 on a model that normalises its top-k);
its other experts are dropped. The dropped slots become `NOT_COMPUTED` after the kept expert
(a token-layer routed to fewer than k experts), which `Request.steps` and `StepArrays` skip.

One definition for both runtimes: the simulator and replay run a gated copy of the trace
(`gate_trace`: fewer experts to load and compute, priced from the trace's `weights[T, L, k]`),
the backend gates its router's output as it runs (`gate_rows`, through the same function), and
reports the lossy run's perplexity and token agreement beside the exact run's.

Not modelled: AdapMoE's per-layer thresholds scaled by a Hessian-based sensitivity (one
threshold for every layer here), and its adaptive prefetching and per-layer cache sizes (other
policies' business here). The recorded `spec` and `logits` are the exact run's: the hidden
states a gated model computes drift from them, which a gated trace does not re-record.
"""

from __future__ import annotations

import math

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.trace import NOT_COMPUTED, Request, Trace


class GatingError(CasmoeError, ValueError):
    """A threshold that is no threshold (negative, NaN)."""


def check_threshold(threshold: float) -> float:
    """A finite number >= 0 (0: every token keeps one expert; above 1: nothing changes)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or threshold < 0:
        raise GatingError(f"--adaptive-gating must be a router weight >= 0 (e.g. 0.7), got {threshold!r}")
    return float(threshold)


def gate_rows(topk: np.ndarray, weights: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """`topk[..., k]` ids and their `weights[..., k]`, gated: where a row's largest weight is at
    least `threshold` of the row's sum, the row keeps that expert first, with the row's summed
    weight, and `NOT_COMPUTED` (weight 0) after it. Rows not computed, and k = 1, are unchanged
    (a row without weight has no share: only threshold 0 gates it)."""
    ids, w = np.array(topk, copy=True), np.array(weights, copy=True)
    if ids.shape[-1] < 2 or ids.size == 0:
        return ids, w
    best = np.argmax(weights, axis=-1)[..., None]  # [..., 1]: the first of equal weights
    top = np.take_along_axis(weights, best, axis=-1)[..., 0].astype(np.float64)
    total = weights.sum(axis=-1, dtype=np.float64)
    share = np.divide(top, total, out=np.zeros_like(total), where=total > 0)
    drop = (share >= threshold) & (topk[..., 0] != NOT_COMPUTED)
    kept = np.take_along_axis(topk, best, axis=-1)[..., 0][drop]
    total = total[drop].astype(w.dtype)
    ids[drop] = NOT_COMPUTED
    w[drop] = 0
    ids[drop, 0] = kept
    w[drop, 0] = total
    return ids, w


def gate_trace(trace: Trace, threshold: float | None) -> Trace:
    """`trace` with every request's routing gated (`gate_rows`); None: the trace itself."""
    if threshold is None:
        return trace
    threshold = check_threshold(threshold)
    out = []
    for r in trace.requests:
        ids, w = gate_rows(r.topk, r.weights, threshold)
        out.append(Request(ids, w, r.prefill, r.prompt, r.task, r.logits, r.spec, r.arrival, r.output_ids, r.output))
    return Trace(trace.geometry, out, {**trace.meta, "adaptive_gating": threshold})
