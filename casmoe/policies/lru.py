"""LRU: evict the least recently used evictable expert."""

from __future__ import annotations

from collections import OrderedDict

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class LRU(ExpertCache):
    """Least recently used; a prefetched expert counts as used when it is loaded."""

    name = "lru"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._order: OrderedDict[ExpertId, None] = OrderedDict()

    def on_access(self, expert: ExpertId) -> None:
        self._order[expert] = None
        self._order.move_to_end(expert)

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        del self._order[expert]

    def victim(self, layer: int, candidates) -> ExpertId:
        return next(e for e in self._order if e in candidates)
