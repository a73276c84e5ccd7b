"""On-demand: load on miss and keep nothing beyond what the running layer needs.

The minimal-memory baseline of the offloading papers: every layer's experts are dropped once
the layer is done, so each routed expert of a new step is a miss (except within one step).
"""

from __future__ import annotations

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class OnDemand(ExpertCache):
    name = "ondemand"
    keeps_experts = False

    def victim(self, layer: int, candidates) -> ExpertId:
        return next(iter(candidates))
