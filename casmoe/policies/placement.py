"""Fixed placements: a set of experts lives on the GPUs for good, every other expert on the host.

The deployments users run today on a box too small for the model (llama.cpp's `--n-cpu-moe`,
KTransformers' GPU expert mask) move no expert while serving: the experts on the GPUs stay,
the rest are computed where they live, on the host's CPU. A placement is that split. Its host
experts are the cache's `host_experts` (`casmoe.cache`): a routed host expert is computed on
the host as the cpu miss mode computes a miss (priced by the profile's host compute, beside the
GPU's experts or after them, `cpu_serial`), whatever the run's miss mode; nothing is evicted.

The GPU set fills one pool that holds the whole budget (the capacity's slots, all layers
together: a placement keeps more experts in some layers than in others), and is copied in when
the first request starts: a server loads it once at start-up, here that fill is charged to the
first request, as every cache's first fills are. Subclasses only say which experts go on the GPUs.
"""

from __future__ import annotations

from typing import Iterable

from casmoe.cache import Capacity, CacheConfigError, ExpertCache, RequestStart
from casmoe.geometry import ExpertId, Geometry


class Placement(ExpertCache):
    """`gpu`: the experts kept on the GPUs (at most the capacity's slots); the rest run on the host."""

    loads_on_demand = False  # every miss is computed on the host: no slot needed, none at all for an all-host placement

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, gpu: Iterable[ExpertId], **kw) -> None:
        cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
        budget = budget_slots(geometry, cap)
        super().__init__(geometry, Capacity(budget, per_layer=False), **kw)
        self.gpu: tuple[ExpertId, ...] = tuple(sorted({int(e) for e in gpu}))
        if len(self.gpu) > budget:
            raise CacheConfigError(f"{self.name}: {len(self.gpu)} experts on the GPUs, more than the {budget} slots of the capacity")
        on_gpu = set(self.gpu)
        self.host_experts = frozenset(e for e in range(geometry.total_experts) if e not in on_gpu)

    def prefetch_request(self, request: RequestStart) -> list[ExpertId]:
        """The GPU set, layer by layer, where not yet resident (the first request's start-up fill)."""
        return [e for e in self.gpu if not self.is_resident(e)]


def budget_slots(geometry: Geometry, capacity: Capacity) -> int:
    """Expert slots of the whole box: every layer's slots, or the global pool's."""
    return capacity.clamped(geometry).total(geometry)
