"""The decision pass: one cache's events for a step, in replay's order, kept for the timing pass.

Cache decisions never depend on when loads arrive (casmoe/cache.py), so wherever the steps are
known before they are priced (one request after another, static batches, and each step of the
serving scheduler) the simulator asks the cache first and prices its answers afterwards
(`timing.StepTimer`). The events are replay's (`casmoe.replay`): `begin_request` for the
requests starting at the step, `before_layer` then `route` for every computed layer,
`end_request` for the requests it finishes. Loads are not reported as arrived: in-flight state
only tells a late hit from a hit, and the timing pass reads that from the links.

`Decider` is the one place that calls the cache; the timing pass calls its `begin`, `visit` and
`end` itself, layer by layer, where decisions do depend on time (the substitute miss mode picks
among arrived experts).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from casmoe.cache import Access, ExpertCache, Load
from casmoe.trace import Request

Visit = tuple[Sequence[Load], Access]
"""One computed layer: the loads `before_layer` asked for, and what `route` found."""


class StepDecisions(NamedTuple):
    """One cache's events for one step."""

    begin: list[Load]  # loads of the requests that start with this step
    visits: list[Visit]  # per computed layer, in layer order


class Decider:
    """Drives one cache (a shard: the whole model, or one device's layers)."""

    def __init__(self, cache: ExpertCache, requests: Sequence[Request]) -> None:
        self.cache = cache
        self.requests = requests
        self._before = cache.before_layer if cache.prefetches_per_layer else None
        self._route = cache.route

    def begin(self, starting: Sequence[int]) -> list[Load]:
        loads: list[Load] = []
        for r in starting:
            loads += self.cache.begin_request(self.requests[r])
        return loads

    def visit(self, step: int, layer: int, experts: list[int]) -> Visit:
        before = self._before
        return (before(step, layer) if before is not None else ()), self._route(step, layer, experts)

    def end(self, requests: int) -> None:
        for _ in range(requests):
            self.cache.end_request()

    def step(self, step: int, experts: list[list[int]], starting: Sequence[int], ending: int) -> StepDecisions:
        """Every event of one step (`experts` per layer; an empty list: layer not computed)."""
        begin = self.begin(starting) if starting else []
        before, route = self._before, self._route
        visits: list[Visit] = []
        for layer, routed in enumerate(experts):
            if routed:
                visits.append(((before(step, layer) if before is not None else ()), route(step, layer, routed)))
        if ending:
            self.end(ending)
        return StepDecisions(begin, visits)
