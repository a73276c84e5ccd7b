"""LFU: evict the least frequently used evictable expert, least recently used among ties.

Frequencies persist across evictions ("perfect" LFU): routing popularity is a property of
the model and workload, not of the cache's current content.
"""

from __future__ import annotations

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId
from casmoe.twin import Twin
from casmoe.policies.lazy_heap import LazyHeaps


def least_used(mc, expert):
    """The compiled victim order (`Twin.order`): the least used first (`mc.count`, routed uses so
    far), then the least recently touched."""
    return float(mc.count[expert]), mc.last[expert]


class LFU(ExpertCache):
    name = "lfu"
    summary = "evicts the least frequently used expert"
    runtime = "mixtral-offloading"  # no runtime of its own: the PyTorch caching one
    twin = Twin(least_used)

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._count: dict[ExpertId, int] = {}
        self._heaps = LazyHeaps(self.pools)
        self._tick = 0

    def on_insert(self, expert: ExpertId) -> None:
        self._tick += 1
        self._heaps.push(self.pool_of[expert], expert, (self._count.get(expert, 0), self._tick))

    def on_access(self, expert: ExpertId) -> None:
        self._count[expert] = self._count.get(expert, 0) + 1
        self.on_insert(expert)

    def on_evict(self, expert: ExpertId) -> None:
        self._heaps.forget(expert)

    def victim(self, layer: int, candidates) -> ExpertId:
        return self._heaps.pop_min(self.pool_of[layer * self.geometry.experts], candidates)
