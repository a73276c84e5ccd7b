"""LFU: evict the least frequently used evictable expert, least recently used among ties.

Frequencies persist across evictions ("perfect" LFU): routing popularity is a property of
the model and workload, not of the cache's current content. Each use pushes the expert's new
(count, last use) on its pool's min-heap and a victim search pops stale entries lazily, so
large global pools stay O(log n) per eviction.
"""

from __future__ import annotations

import heapq

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class LFU(ExpertCache):
    name = "lfu"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._count: dict[ExpertId, int] = {}
        self._key: dict[ExpertId, tuple[int, int]] = {}  # residents' current (count, last use)
        self._heaps: list[list[tuple[int, int, ExpertId]]] = [[] for _ in range(self.pools)]
        self._tick = 0

    def _touch(self, expert: ExpertId) -> None:
        self._tick += 1
        key = (self._count.get(expert, 0), self._tick)
        self._key[expert] = key
        heapq.heappush(self._heaps[self.pool_of[expert]], (*key, expert))

    def on_access(self, expert: ExpertId) -> None:
        self._count[expert] = self._count.get(expert, 0) + 1
        self._touch(expert)

    on_insert = _touch

    def on_evict(self, expert: ExpertId) -> None:
        del self._key[expert]

    def victim(self, layer: int, candidates) -> ExpertId:
        heap = self._heaps[self.pool_of[layer * self.geometry.experts]]
        protected = []
        try:
            while True:
                count, tick, e = heapq.heappop(heap)
                if self._key.get(e) != (count, tick):
                    continue  # stale: used again since, or evicted
                if e in candidates:
                    return e
                protected.append((count, tick, e))
        finally:
            for item in protected:
                heapq.heappush(heap, item)
