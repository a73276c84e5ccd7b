"""Belady's MIN: evict the resident whose next use lies farthest in the future.

Optimal for demand loads (no prefetch); the yardstick every practical policy is measured
against. An oracle: it reads the runtime's whole step sequence through `self.future`.
"""

from __future__ import annotations

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId
from casmoe.kernels.kinds import Kind
from casmoe.twin import Twin
from casmoe.policies.lazy_heap import LazyHeaps


class Belady(ExpertCache):
    name = "belady"
    summary = "evicts the expert used farthest in the future: optimal eviction, a bound"
    twin = Twin(Kind.BELADY)
    needs_future = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._heaps = LazyHeaps(self.pools)

    def on_access(self, expert: ExpertId) -> None:
        # a resident's next use only changes when it is used
        self._heaps.push(self.pool_of[expert], expert, -self.future.next_use(expert, self.visit))

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        self._heaps.forget(expert)

    def victim(self, layer: int, candidates) -> ExpertId:
        return self._heaps.pop_min(self.pool_of[layer * self.geometry.experts], candidates)
