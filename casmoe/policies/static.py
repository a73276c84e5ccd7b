"""Static placement: pin the experts that a popularity profile routes to most, LRU for the rest.

This is the placement of llama.cpp and kTransformers: popular experts live on the GPU for
good, the remaining slots (at least `top_k` per pool, so misses can load) rotate in LRU order.
Pinned experts load on their first use (a server would preload them once at start-up; that
one-time fill is what `CacheStats.cold_misses` counts), so static stays a demand-only policy.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache, TwinState
from casmoe.geometry import ExpertId
from casmoe.kernels.kinds import Kind
from casmoe.policies.lru import LRU
from casmoe.trace import Trace
from casmoe.trace_io import load_trace


class Static(LRU):
    name = "static"
    compiled_kind = Kind.STATIC

    def __init__(self, *args, popularity: np.ndarray, remainder: int | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        g, cap = self.geometry, self.capacity
        rest = g.top_k if remainder is None else remainder
        if rest < g.top_k or rest > cap.slots:
            raise CacheConfigError(f"static remainder must lie in [{g.top_k}, {cap.slots}] slots, got {rest}")
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
    def fitted_requests(cls, options: dict[str, Any], trace: Trace) -> set[int]:
        """Without a profile: the trace's train split (`bind` profiles on it). With a trace as
        profile: the requests of `trace` it holds (the same routing). With a counts-only profile:
        every request if it counts exactly this trace's routing (nothing finer can be told)."""
        from casmoe.selection import split_indices

        profile = options.get("profile")
        if profile is None:
            return set(split_indices(trace, "train"))
        source = _profile_trace(profile)
        if source is not None:
            held = {_routing_digest(r) for r in source.requests}
            return {i for i, r in enumerate(trace.requests) if _routing_digest(r) in held}
        counts = profile_counts(profile)
        if counts.shape == (trace.geometry.layers, trace.geometry.experts) and np.array_equal(counts, trace.popularity()):
            return set(range(len(trace.requests)))
        return set()

    @classmethod
    def bind(cls, options: dict[str, Any], trace: Trace) -> dict[str, Any]:
        """No profile given: the popularity of the trace's train split, never of the scored requests."""
        if options.get("profile") is not None:
            return options
        from casmoe.selection import split_indices

        return {**options, "profile": trace.subset(split_indices(trace, "train"))}

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, profile: Trace | str | None = None, **kw: Any) -> ExpertCache:
        """Popularity from `profile` (a profile file of `casmoe profile import`, a trace file or
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

    def twin_state(self) -> TwinState:
        return TwinState(pinned=tuple(sorted(self.pinned)))

    def victim(self, layer: int, candidates) -> ExpertId:
        pinned = self.pinned
        unpinned = next((e for e in self.recency(layer) if e in candidates and e not in pinned), None)
        return unpinned if unpinned is not None else super().victim(layer, candidates)


def profile_counts(profile: Trace | str | os.PathLike[str]) -> np.ndarray:
    """[L, E] routed counts of a profile: a Trace, a trace file or a `casmoe profile import` file."""
    if isinstance(profile, Trace):
        return profile.popularity()
    if not isinstance(profile, (str, os.PathLike)):  # static[profile=0]: a number, not a file
        raise CacheConfigError(f"a profile must be a file (a profile or a trace), not {profile!r}")
    from casmoe.profile import load_profile

    return load_profile(os.fspath(profile))


def _profile_trace(profile: Trace | str | os.PathLike[str]) -> Trace | None:
    """The profile as a trace, or None for a counts-only profile file."""
    if isinstance(profile, Trace):
        return profile
    from casmoe.trace import TraceError

    try:
        return load_trace(os.fspath(profile))
    except TraceError:
        return None


def _routing_digest(request) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(request.topk).tobytes() + str(request.prefill).encode(),
                           digest_size=16).digest()
