"""LFU: evict the least frequently used evictable expert, least recently used among ties.

Frequencies persist across evictions ("perfect" LFU): routing popularity is a property of
the model and workload, not of the cache's current content.
"""

from __future__ import annotations

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class LFU(ExpertCache):
    name = "lfu"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._count: dict[ExpertId, int] = {}
        self._last: dict[ExpertId, int] = {}
        self._tick = 0

    def on_access(self, expert: ExpertId) -> None:
        self._count[expert] = self._count.get(expert, 0) + 1
        self._tick += 1
        self._last[expert] = self._tick

    def on_insert(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick

    def victim(self, layer: int, candidates) -> ExpertId:
        count, last = self._count, self._last
        return min(candidates, key=lambda e: (count.get(e, 0), last[e]))
