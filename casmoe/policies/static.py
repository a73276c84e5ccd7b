"""Static placement: pin the experts that a popularity profile routes to most, LRU for the rest.

This is the placement of llama.cpp and kTransformers: popular experts live on the GPU for
good, the remaining slots (at least `top_k` per pool, so misses can load) rotate in LRU order.
Pinned experts load on their first use (a server would preload them once at start-up; that
one-time fill is what `CacheStats.cold_misses` counts), so static stays a demand-only policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache
from casmoe.geometry import ExpertId
from casmoe.policies.fitting import TraceFit, profile_counts
from casmoe.policies.lru import LRU
from casmoe.trace import Trace
from casmoe.twin import Twin, TwinState


def unpinned_first(mc, expert):
    """The compiled victim order (`Twin.order`): unpinned experts first (`mc.pinned`, from
    `TwinState.pinned`), then the least recently used."""
    return 1.0 if mc.pinned[expert] else 0.0, mc.last[expert]


class Static(LRU):
    name = "static"
    summary = "pins the experts a train-split profile routes to most, LRU for the rest"
    fit = TraceFit("profile")

    def _twin_state(self) -> TwinState:
        return TwinState(pinned=tuple(sorted(self.pinned)))

    twin = Twin(unpinned_first, state=_twin_state)

    def __init__(self, *args, popularity: np.ndarray, remainder: int | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        g, cap = self.geometry, self.capacity
        least = min(g.top_k, cap.slots)  # fewer slots than top_k: none pinned, all rotate (transient slots)
        rest = least if remainder is None else remainder
        if rest < least or rest > cap.slots:
            raise CacheConfigError(f"static remainder must lie in [{least}, {cap.slots}] slots, got {rest}")
        pin = cap.slots - rest
        popularity = np.asarray(popularity)
        if cap.per_layer:
            per_layer = popularity.reshape(g.layers, g.experts)
            top = np.argsort(-per_layer, axis=1, kind="stable")[:, :pin]
            pinned = (top + (np.arange(g.layers) * g.experts)[:, None]).ravel()
        else:
            pinned = np.argsort(-popularity, kind="stable")[:pin]
        self.pinned: frozenset[ExpertId] = frozenset(int(e) for e in pinned if popularity[e] > 0)

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, profile: Trace | str | None = None, **kw: Any) -> ExpertCache:
        """Popularity from `profile` (a profile file of `casmoe popularity import`, a trace file or
        a Trace), else from the trace being run (an offline profile of the very requests it is
        scored on: an upper bound on what a static placement achieves; the command line and
        sweeps `bind` a profile of the train split instead)."""
        if profile is not None:
            counts = profile_counts(profile)
        elif trace is not None:
            counts = trace.popularity()
        else:
            raise CacheConfigError("static needs a profile (static[profile=FILE.npz]: a profile or a trace) to rank experts")
        shape = counts.shape
        if shape != (geometry.layers, geometry.experts):
            raise CacheConfigError(
                f"static profile has {shape[0]} layers x {shape[1]} experts, the run {geometry.layers} x "
                f"{geometry.experts}; profile a trace of the same model"
            )
        return cls(geometry, capacity, popularity=counts.ravel(), **kw)

    def victim(self, layer: int, candidates) -> ExpertId:
        pinned = self.pinned
        unpinned = next((e for e in self.recency(layer) if e in candidates and e not in pinned), None)
        return unpinned if unpinned is not None else super().victim(layer, candidates)
