"""Expert patterns (EP): the per-request label every planner component learns to predict.

`EP[l, e] = sum over the request's tokens of router weight x [e among the token's top-k]`.
The seed paper found router-weighted patterns beat raw counts (0.72 vs 0.62 accuracy on CoLA):
an expert picked with weight 0.9 matters more than one picked with 0.1. Decode tokens are the
default phase because they are what a prompt-level prefetch serves; prefill is an option.
`NOT_COMPUTED` token-layers carry zero weight and no expert, so they are skipped.
"""

from __future__ import annotations

import numpy as np

from casmoe.geometry import Geometry
from casmoe.planner.config import Phase
from casmoe.trace import NOT_COMPUTED, Request, Trace


def _tokens(request: Request, phase: Phase) -> slice:
    if phase is Phase.DECODE:
        return slice(request.prefill, None)
    if phase is Phase.PREFILL:
        return slice(0, request.prefill)
    return slice(None)


def request_pattern(
    request: Request, geometry: Geometry, phase: Phase = Phase.DECODE, weighted: bool = True
) -> np.ndarray:
    """EP of one request as float32 [L, E]; `weighted=False` counts selections instead."""
    L, E = geometry.layers, geometry.experts
    sl = _tokens(request, phase)
    topk = request.topk[sl].astype(np.int64)  # [T, L, k]
    keep = topk != NOT_COMPUTED
    w = request.weights[sl].astype(np.float64) if weighted else np.ones(topk.shape)
    flat = (topk + (np.arange(L, dtype=np.int64) * E)[None, :, None])[keep]
    out = np.bincount(flat, weights=w[keep], minlength=L * E)
    return out.reshape(L, E).astype(np.float32)


def expert_patterns(trace: Trace, phase: Phase = Phase.DECODE, weighted: bool = True) -> np.ndarray:
    """EPs of every request of `trace`, float32 [N, L, E]."""
    g = trace.geometry
    if not trace.requests:
        return np.zeros((0, g.layers, g.experts), dtype=np.float32)
    return np.stack([request_pattern(r, g, phase, weighted) for r in trace.requests])


def normalise(patterns: np.ndarray) -> np.ndarray:
    """Each layer's row scaled to sum 1 (all-zero rows stay zero): prompts of different lengths
    become comparable, so averaging neighbours and regressing on them weigh prompts equally."""
    total = patterns.sum(axis=-1, keepdims=True)
    return np.divide(patterns, total, out=np.zeros_like(patterns, dtype=np.float32), where=total > 0)
