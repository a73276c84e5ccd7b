"""MoE-Infinity (Xue et al. 2024, arXiv 2401.14361; code EfficientMoE/MoE-Infinity): prefetch and
evict by the request-level expert activation matrix of the most similar past request.

Modelled, after the paper and its public code (moe_infinity/memory/expert_tracer.py,
expert_predictor.py, expert_priority_score.py):

- the **expert activation matrix** (EAM) of a request: [L, E] counts of the tokens routed to
  each expert (a prefill step, whose tokens the runtime merges, adds one per expert it routes);
- the **EAM collection** (EAMC): the EAMs of served requests, added as each request finishes
  (online), optionally seeded from a `fit` trace (its `train` split when it has splits); when
  full, the least matched entry that did not come from `fit` is replaced (the code's policy);
- **matching**: once per step, the running request's partial EAM is compared with every stored
  one by the cosine similarity of each layer's row, averaged over the layers it has routed so
  far; the best match predicts the layers to come;
- **prefetch priority**: as layer l is about to run, the matched EAM's experts of layers
  l .. l+ahead-1 (up to a layer's share of the slots each) are fetched in order of their share of the layer
  times the code's layer decay `1 - (layer - l) / (L + 1)`;
- **activation-aware eviction**: the resident with the lowest predicted share is evicted, then
  the one the running request has used least, then the least recently used.

Not modelled: the paper's serving engine (its I/O threads, pinned-memory pool and multi-GPU
placement: casmoe's simulator prices the copies) and its encoder-decoder special cases; the
EAM is matched once per step rather than at every layer (within a token the partial matrix
changes by one layer's row; matching costs C x L x E per call).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache
from casmoe.geometry import ExpertId
from casmoe.policies.fitting import TraceFit
from casmoe.policies.lazy_heap import LazyHeaps
from casmoe.trace import Trace, expert_counts
from casmoe.trace_io import load_trace


def _unit_rows(eam: np.ndarray) -> np.ndarray:
    """Each layer's row scaled to unit length (zero rows stay zero): cosines become dot products."""
    norm = np.linalg.norm(eam, axis=-1, keepdims=True)
    return np.divide(eam, norm, out=np.zeros_like(eam, dtype=np.float64), where=norm > 0)


def train_eams(trace: Trace) -> list[np.ndarray]:
    """The EAMs of a fit trace's `train` requests (all of them when it has no splits)."""
    splits = trace.meta.get("splits")
    keep = [i for i, s in enumerate(splits) if s == "train"] if isinstance(splits, list) else range(len(trace.requests))
    return [expert_counts(trace.requests[i].topk, trace.geometry.experts).astype(np.float64) for i in keep]


class MoEInfinity(ExpertCache):
    name = "moe-infinity"
    summary = "prefetches by the expert counts of the most similar past request (MoE-Infinity)"
    runtime = "moe-infinity"
    fit = TraceFit("fit")

    def __init__(self, *args, collection: Sequence[np.ndarray] = (), size: int = 512, ahead: int = 3, **kw) -> None:
        super().__init__(*args, **kw)
        g = self.geometry
        if size < 1 or ahead < 1:
            raise CacheConfigError(f"moe-infinity needs size >= 1 stored requests and ahead >= 1 layer, got {size}, {ahead}")
        self.ahead = ahead
        seeded = list(collection)[-size:]
        self._bank = np.zeros((size, g.layers, g.experts))  # unit rows of the stored EAMs
        self._access = np.zeros(size)
        self._stored = len(seeded)
        self._persistent = len(seeded)  # entries from `fit`: never replaced
        for i, eam in enumerate(seeded):
            self._bank[i] = _unit_rows(np.asarray(eam, dtype=np.float64).reshape(g.layers, g.experts))
        self._eam = np.zeros((g.layers, g.experts))  # the running request's
        # eviction keys as Python lists (a victim reads a pool's residents one by one): the
        # matched EAM's share of its layer, the running request's uses, the last-use tick
        self._pred = [0.0] * g.total_experts
        self._uses = [0] * g.total_experts
        self._matched_step = -1
        self._ranked: list[list[tuple[float, ExpertId]]] = [[] for _ in range(g.layers)]
        self._ranked_from = -1  # the bank entry `_ranked` and `_pred` were made from (-1: none)
        self._wanted: dict[int, list[ExpertId]] = {}  # layer -> its prefetch order under that match
        self._last = [0] * g.total_experts
        self._tick = 0
        # residents by (pred, uses, last): a new match or a new request changes every key, so
        # those rebuild the heaps (once per step at most) instead of a scan per eviction
        self._heaps = LazyHeaps(self.pools)
        self._stale = False
        L = g.layers
        self._decay = 1.0 - np.arange(L) / (L + 1)
        # a layer's prefetch list is capped at its share of the slots: a global pool ranked in
        # full would prefetch `ahead` whole layers at every layer and evict its own prefetches
        self._layer_slots = self.capacity.slots if self.capacity.per_layer else max(1, self.capacity.total(g) // L)

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, fit: Trace | str | None = None, **kw: Any) -> ExpertCache:
        """`fit`: a trace (or its path) whose train requests seed the collection; it must be of
        the same model, and must not hold the requests being scored."""
        collection: list[np.ndarray] = []
        if fit is not None:
            if not isinstance(fit, Trace):
                fit = load_trace(os.fspath(fit))
            g = fit.geometry
            if (g.layers, g.experts) != (geometry.layers, geometry.experts):
                raise CacheConfigError(
                    f"moe-infinity fit trace has {g.layers} layers x {g.experts} experts, the run "
                    f"{geometry.layers} x {geometry.experts}; fit on a trace of the same model"
                )
            collection = train_eams(fit)
        return cls(geometry, capacity, collection=collection, **kw)

    # ---- the activation matrices ----------------------------------------------------------

    def route(self, step, layer, experts, scores=None):
        local = np.fromiter(experts, dtype=np.int64, count=len(experts)) - layer * self.geometry.experts
        self._eam[layer, local] += 1.0
        uses = self._uses
        for e in experts:
            uses[e] += 1
        return super().route(step, layer, experts, scores)

    def _match(self) -> None:
        """Predict from the stored EAM most similar to the running request's partial one, and
        rank each layer's predicted experts (up to a pool's slots) for the step's prefetches."""
        n = self._stored
        seen = int(self._eam.any(axis=1).sum())
        if n == 0 or not seen:
            self._ranked = [[] for _ in range(self.geometry.layers)]
            self._ranked_from, self._wanted = -1, {}
            self._pred = [0.0] * self.geometry.total_experts
            self._stale = True
            return
        # rows the request has not routed yet are zero in `part`, so they add nothing
        sims = np.einsum("cle,le->c", self._bank[:n], _unit_rows(self._eam)) / seen
        best = int(np.argmax(sims))
        self._access[best] += 1
        if best == self._ranked_from:
            return  # the same stored EAM as the last step: its prediction and rankings stand
        self._ranked_from, self._wanted = best, {}
        row = self._bank[best]
        total = row.sum(axis=1, keepdims=True)
        share = np.divide(row, total, out=np.zeros_like(row), where=total > 0)  # [L, E]
        self._pred = share.ravel().tolist()
        self._stale = True
        E = self.geometry.experts
        top = np.argsort(-share, axis=1, kind="stable")[:, : self._layer_slots]
        for layer, (ids, weights) in enumerate(zip(top.tolist(), np.take_along_axis(share, top, axis=1).tolist())):
            self._ranked[layer] = [(w, layer * E + e) for e, w in zip(ids, weights) if w > 0]

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        if step != self._matched_step:
            self._matched_step = step
            self._match()
        order = self._wanted.get(layer)
        if order is None:  # first visit of this layer under the current match
            decay = self._decay
            wanted = [(w * decay[d], e) for d, ranked in enumerate(self._ranked[layer : layer + self.ahead]) for w, e in ranked]
            wanted.sort(key=lambda we: -we[0])  # stable: a layer's ties keep their order
            order = self._wanted[layer] = [e for _, e in wanted]
        return list(order)

    def on_request_end(self) -> None:
        size = len(self._bank)
        if not self._eam.any():
            slot = -1
        elif self._stored < size:
            slot = self._stored
            self._stored += 1
        elif self._persistent < size:
            slot = self._persistent + int(np.argmin(self._access[self._persistent :]))
        else:
            slot = -1  # every entry came from `fit`
        if slot >= 0:
            self._bank[slot] = _unit_rows(self._eam)
            self._access[slot] = 1
            if slot == self._ranked_from:
                self._ranked_from = -1  # that entry's rankings are stale
        self._eam[:] = 0.0
        self._uses = [0] * self.geometry.total_experts
        self._stale = True
        self._matched_step = -1

    # ---- eviction --------------------------------------------------------------------------

    def _key(self, e: ExpertId) -> tuple[float, int, int]:
        return (self._pred[e], self._uses[e], self._last[e])

    def on_access(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick
        if not self._stale:
            self._heaps.push(self.pool_of[expert], expert, self._key(expert))

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        if not self._stale:
            self._heaps.forget(expert)

    def victim(self, layer: int, candidates) -> ExpertId:
        if self._stale:  # keys changed wholesale since the heaps were built
            self._heaps = LazyHeaps(self.pools)
            for e in self.resident:
                self._heaps.push(self.pool_of[e], e, self._key(e))
            self._stale = False
        # last-use ticks are unique among residents, so the keys are and the choice is the scan's
        return self._heaps.pop_min(self.pool_of[layer * self.geometry.experts], candidates)
