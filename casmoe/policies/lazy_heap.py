"""Per-pool min-heaps of residents by a priority key, for policies whose victim is an extreme.

A resident's key changes only when it is used, so each use pushes one entry and the old one
goes stale; a victim search pops stale entries lazily and puts back the protected ones it
passes. That keeps large global pools at O(log n) per eviction instead of a scan.
"""

from __future__ import annotations

import heapq
from typing import Any

from casmoe.geometry import ExpertId


class LazyHeaps:
    def __init__(self, pools: int) -> None:
        self._heaps: list[list[tuple[Any, ExpertId]]] = [[] for _ in range(pools)]
        self._key: dict[ExpertId, Any] = {}  # each resident's current key

    def push(self, pool: int, expert: ExpertId, key: Any) -> None:
        self._key[expert] = key
        heapq.heappush(self._heaps[pool], (key, expert))

    def forget(self, expert: ExpertId) -> None:
        del self._key[expert]

    def pop_min(self, pool: int, candidates) -> ExpertId:
        """The candidate with the smallest current key (smallest id among equal keys)."""
        heap, passed = self._heaps[pool], []
        try:
            while True:
                key, e = heapq.heappop(heap)
                if self._key.get(e) != key:
                    continue  # stale: used again since, or evicted
                if e in candidates:
                    return e
                passed.append((key, e))
        finally:
            for item in passed:
                heapq.heappush(heap, item)
