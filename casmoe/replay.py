"""The count-only runtime: walks a trace through a cache with no timing.

It defines the semantics the simulator and the backend reproduce: per step, per computed layer,
`before_layer` then `route`; every load arrives at once (so replay has no late hits). A cache
that decides per step where a miss runs (`ExpertCache.decides_host`) gets each layer's token
counts with `route`; replay has no hardware, so it attaches no prices (`casmoe.costs`): such a
policy uses its source's published constants unless the caller attached others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from casmoe.cache import CacheConfigError, CacheStats, ExpertCache, Load
from casmoe.compiled import replay_compiled, uses_twin
from casmoe.step_arrays import StepArrays
from casmoe.trace import Future, Step, Trace


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity: str
    stats: CacheStats

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "capacity": self.capacity, **self.stats.to_dict()}


def request_bounds(steps: list[Step]) -> tuple[dict[int, int], dict[int, int]]:
    """First and last step index of every request in a step sequence."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, step in enumerate(steps):
        for r in step.requests:
            first.setdefault(r, s)
            last[r] = s
    return first, last


def starts_and_ends(steps: list[Step]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The requests that start, and those that finish, at each step index."""
    first, last = request_bounds(steps)
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for r, s in first.items():
        starts.setdefault(s, []).append(r)
    for r, s in last.items():
        ends.setdefault(s, []).append(r)
    return starts, ends


def check_replayable(trace: Trace, cache: ExpertCache | None = None) -> None:
    """Refuse what would replay silently wrong from Python: a policy class where a cache
    object belongs, a cache that has run before (its counts and residents would carry over),
    a cache of another geometry, routing that no longer fits the geometry (fields changed
    since construction; `trace_io.validate_trace` checks more thoroughly)."""
    if cache is not None:
        if isinstance(cache, type):
            raise CacheConfigError(
                f"replay takes a cache object, e.g. {cache.__name__}(trace.geometry, 4), not the class {cache.__name__}"
            )
        if not isinstance(cache, ExpertCache):
            raise CacheConfigError(f"replay takes an ExpertCache, not {type(cache).__name__}")
        if cache.has_run:
            raise CacheConfigError(
                "this cache has already replayed (its counts and residents would carry over); build a fresh one per run"
            )
        g, c = trace.geometry, cache.geometry
        if (g.layers, g.experts, g.top_k) != (c.layers, c.experts, c.top_k):
            raise CacheConfigError(f"the cache was built for {c.describe()}, the trace is {g.describe()}")
    trace.check()  # each request checked itself when built; this rechecks it fits the geometry


def replay(
    trace: Trace,
    cache: ExpertCache,
    batch: int = 1,
    steps: list[Step] | None = None,
    *,
    arrays: StepArrays | None = None,
    compiled: bool | None = None,
) -> ReplayResult:
    """Walk `trace` (or its prebuilt `steps` / `arrays`, shared by several policies) through
    `cache`. A fresh built-in policy runs its compiled twin (`casmoe.compiled`, identical
    decisions and counts) when `compiled` is True, or when None and the run is long enough to
    repay loading numba; anything else runs this Python loop, the reference."""
    check_replayable(trace, cache)
    if uses_twin(cache, trace, compiled):
        if arrays is None:
            g = trace.geometry
            arrays = StepArrays.from_trace(trace, batch) if steps is None else StepArrays.from_steps(steps, g.layers, len(trace.requests))
        stats = replay_compiled(trace, cache, arrays)
        return ReplayResult(cache.name or type(cache).__name__, cache.capacity.describe(), stats)
    return _replay_python(trace, cache, batch, steps)


def _replay_python(trace: Trace, cache: ExpertCache, batch: int, steps: list[Step] | None) -> ReplayResult:
    steps = trace.steps(batch) if steps is None else steps
    if cache.needs_future:
        cache.attach_future(Future(steps, trace.geometry))
    starts, ends = starts_and_ends(steps)
    arrived = cache.arrived
    before = cache.before_layer
    route = cache.route
    per_layer = cache.prefetches_per_layer
    counted = cache.decides_host

    def land(loads: Iterable[Load]) -> None:
        for ld in loads:
            arrived(ld.expert)

    for s, step in enumerate(steps):
        for r in starts.get(s, ()):
            land(cache.begin_request(trace.requests[r]))
        layer = -1
        for experts in step.experts:
            layer += 1
            if not experts:
                continue
            if per_layer:
                land(before(s, layer))
            if counted:
                acc = route(s, layer, experts, None, None if step.counts is None else step.counts[layer], step.tokens)
            else:
                acc = route(s, layer, experts)
            for ld in acc.loads:
                arrived(ld.expert)
            if acc.background:
                land(acc.background)
        for _ in ends.get(s, ()):
            cache.end_request()
    return ReplayResult(cache.name or type(cache).__name__, cache.capacity.describe(), cache.stats())
