"""LRU: evict the least recently used evictable expert."""

from __future__ import annotations

from collections import OrderedDict

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class LRU(ExpertCache):
    """Least recently used; a prefetched expert counts as used when it is loaded.

    One recency order per pool, so a victim search never walks other layers' experts.
    """

    name = "lru"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._orders: list[OrderedDict[ExpertId, None]] = [OrderedDict() for _ in range(self.pools)]

    def on_access(self, expert: ExpertId) -> None:
        order = self._orders[self.pool_of[expert]]
        order[expert] = None
        order.move_to_end(expert)

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        del self._orders[self.pool_of[expert]][expert]

    def recency(self, layer: int) -> OrderedDict[ExpertId, None]:
        """Residents of `layer`'s pool, least recently used first."""
        return self._orders[self.pool_of[layer * self.geometry.experts]]

    def victim(self, layer: int, candidates) -> ExpertId:
        return next(e for e in self.recency(layer) if e in candidates)
