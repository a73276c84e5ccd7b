"""SE-MoE-style next-layer prefetch: while layer l runs, fetch layer l+1's experts.

It cannot know which experts layer l+1 will route to, so it fetches as many of that layer's
experts as its budget allows (the whole layer when it fits), most often used first; residents
are replaced in LRU order. After the last layer it prefetches layer 0 of the next step.
"""

from __future__ import annotations

from casmoe.geometry import ExpertId
from casmoe.policies.lru import LRU, least_recent
from casmoe.twin import Twin, TwinState


class SEMoE(LRU):
    name = "semoe"
    summary = "while a layer runs, loads the next layer's most used experts (SE-MoE)"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        g = self.geometry
        per_layer = self.capacity.slots if self.capacity.per_layer else self.capacity.slots // g.layers
        self._budget = max(1, min(g.experts, per_layer))
        self._uses = [0] * g.total_experts

    def _twin_state(self) -> TwinState:
        return TwinState(next_layer_budget=self._budget)

    twin = Twin(least_recent, state=_twin_state)

    def on_access(self, expert: ExpertId) -> None:
        super().on_access(expert)
        self._uses[expert] += 1

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        g = self.geometry
        nxt = (layer + 1) % g.layers
        base = nxt * g.experts
        order = sorted(range(base, base + g.experts), key=lambda e: (-self._uses[e], e))
        return order[: self._budget]
