"""A worked example of a user's own policy: LRU that prefetches the next layer's favourites.

Run it like a built-in one:

    casmoe replay --policy examples.layer_aware_lru:HotNextLayer --capacity 4

It keeps one running count per expert and, while a layer runs, fetches the `fetch` most used
experts of the next layer; everything else (slots, protection, counters, loads) is the base
class's job. Its test (test_layer_aware_lru.py) runs casmoe's contract suite on it.
"""

from __future__ import annotations

from casmoe.geometry import ExpertId
from casmoe.policies.lru import LRU


class HotNextLayer(LRU):
    name = "hot-next-layer"

    def __init__(self, *args, fetch: int = 1, **kw) -> None:
        super().__init__(*args, **kw)
        self.fetch = fetch
        self._uses = [0] * self.geometry.total_experts

    def on_access(self, expert: ExpertId) -> None:
        super().on_access(expert)
        self._uses[expert] += 1

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        g = self.geometry
        if layer + 1 >= g.layers:
            return []
        first = (layer + 1) * g.experts
        hot = sorted(range(first, first + g.experts), key=lambda e: -self._uses[e])
        return [e for e in hot[: self.fetch] if self._uses[e] > 0]
