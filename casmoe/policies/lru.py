"""LRU: evict the least recently used evictable expert."""

from __future__ import annotations

from collections import OrderedDict

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId
from casmoe.twin import Twin


def least_recent(mc, expert):
    """The compiled victim order (`Twin.order`): the least recently used first (`mc.last`, the
    tick of each expert's last access or insert)."""
    return 0.0, mc.last[expert]


class LRU(ExpertCache):
    """Least recently used; a prefetched expert counts as used when it is loaded.

    One recency order per pool, so a victim search never walks other layers' experts.
    """

    name = "lru"
    summary = "evicts the least recently used expert (the cache of Mixtral-Offloading)"
    runtime = "mixtral-offloading"
    twin = Twin(least_recent)

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        orders = [OrderedDict() for _ in range(self.pools)]
        self._order_of: list[OrderedDict[ExpertId, None]] = [orders[p] for p in self.pool_of]

    def on_access(self, expert: ExpertId) -> None:
        self._order_of[expert].move_to_end(expert)

    def on_insert(self, expert: ExpertId) -> None:
        self._order_of[expert][expert] = None

    def on_evict(self, expert: ExpertId) -> None:
        del self._order_of[expert][expert]

    def recency(self, layer: int) -> OrderedDict[ExpertId, None]:
        """Residents of `layer`'s pool, least recently used first."""
        return self._order_of[layer * self.geometry.experts]

    def victim(self, layer: int, candidates) -> ExpertId:
        return next(e for e in self.recency(layer) if e in candidates)
