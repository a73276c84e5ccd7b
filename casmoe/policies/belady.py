"""Belady's MIN: evict the resident whose next use lies farthest in the future.

Optimal for demand loads (no prefetch); the yardstick every practical policy is measured
against. An oracle: it reads the runtime's whole step sequence through `self.future`.

A resident's next use only changes when it is used, so each use pushes one entry on a max-heap
and a victim search pops stale entries lazily: large global pools stay O(log n) per eviction.
"""

from __future__ import annotations

import heapq

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class Belady(ExpertCache):
    name = "belady"
    needs_future = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._next: dict[ExpertId, float] = {}
        self._heaps: list[list[tuple[float, ExpertId]]] = [[] for _ in range(self.pools)]

    def on_access(self, expert: ExpertId) -> None:
        nxt = self.future.next_use(expert, self.visit)
        self._next[expert] = nxt
        heapq.heappush(self._heaps[self.pool_of[expert]], (-nxt, expert))

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        del self._next[expert]

    def victim(self, layer: int, candidates) -> ExpertId:
        heap = self._heaps[self.pool_of[layer * self.geometry.experts]]
        protected = []
        try:
            while True:
                neg, e = heapq.heappop(heap)
                if self._next.get(e) != -neg:
                    continue  # stale: used again (a newer entry exists) or evicted
                if e in candidates:
                    return e
                protected.append((neg, e))
        finally:
            for item in protected:
                heapq.heappush(heap, item)
