"""On-demand: load on miss and keep nothing beyond what the running layer needs.

The minimal-memory baseline of the offloading papers: every layer's experts are dropped once
the layer is done, so each routed expert of a new step is a miss (except within one step).
When a layer routes more experts than its pool holds (a long prefill), the least recently
used of them makes room.
"""

from __future__ import annotations

from casmoe.twin import Twin
from casmoe.policies.lru import LRU, least_recent


class OnDemand(LRU):
    name = "ondemand"
    summary = "loads each routed expert when its layer runs and keeps none: the floor, not a deployment"
    twin = Twin(least_recent)
    keeps_experts = False
