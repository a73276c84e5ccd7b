"""Prefetch timeliness per layer, and the stall a perfect prefetcher would still suffer.

Does a policy lose by prediction or by bandwidth? Per MoE layer the simulator counts late hits
(the timing pass), wasted prefetches (evicted before any use: the cache's own count,
`ExpertCache.wasted_by_layer`) and a lower bound on stall for the run's own hit pattern:

    the loads the run needed (its demand loads, and each prefetch at its first use), issued as
    early as the link allows: back to back from time 0, in the order they are needed, each
    device's link on its own; the compute is the run's.

Visit v (a computed layer) can start no earlier than the link has copied everything needed up
to v, so the bound is the largest excess, over visits, of that copy time over the compute done
before v: B = max(0, max_v (copies_d(v) - compute(v))). Any real schedule of the same needed
loads stalls at least B (its link starts no earlier and moves at least those bytes), so
`stall - B` is what timing and prediction lost, and B alone is the bandwidth's share. The
bound counts copy time on the host-to-device links only (not storage reads).

Per layer, the same argument is made visit by visit against the run's own clock: visit v's
experts cannot start before its device's link has copied every load needed up to v, at the
earliest at copies_d(v) from time 0, and the run would start them at `ready` (its wall time,
earlier stalls included) had nothing been missing, so the run stalls at v at least
max(0, copies_d(v) - ready). Summed over a layer's visits this is a true lower bound on that
layer's own stall (never above it, on any number of devices); `stall_by_layer - bound_by_layer`
is what earlier issuing of the same loads could have saved at that layer. The layers need not
add up to B: a run that stalled early reaches later layers late enough to need no more.
"""

from __future__ import annotations

from typing import Sequence

from casmoe.cache import Access, Load
from casmoe.geometry import ExpertId


class Timeliness:
    """Fed by the timing pass: prefetch-type loads as they are issued, computed layers as they
    are reached; `copy_s[layer]` is one expert copy of that layer (latency + bytes / rate)."""

    def __init__(self, layers: int, experts: int, devices: int, copy_s: Sequence[float]) -> None:
        self.E = experts
        self.copy_s = list(copy_s)
        self.bound_by_layer = [0.0] * layers
        self.bound = 0.0
        self.bound_by_device = [0.0] * devices
        """Each device's link alone: B_d = max(0, max over its visits of copies_d(v) - compute(v)).
        Each is a lower bound on the run's stall, and B = max_d B_d."""
        self._copied = [0.0] * devices  # each link's copy time of the needed loads so far
        self.unused: set[ExpertId] = set()
        """Prefetched and not used yet (flat ids of the model): a visit with no demand load
        while this is empty has nothing to count. A prefetch the cache gave back unused without a
        load taking its slot (a pool returning staging slots) stays here until its expert is
        routed again, and is then a demand load, counted once."""

    def issued(self, first: int, loads: Sequence[Load]) -> None:
        """Prefetch-type loads of a shard whose first layer is `first`."""
        off = first * self.E
        unused = self.unused
        for ld in loads:
            if ld.victim >= 0:
                unused.discard(ld.victim + off)
            unused.add(ld.expert + off)

    def visit(self, first: int, layer: int, device: int, clock: float, ready: float, experts: Sequence[int],
              acc: Access) -> None:
        """Shard-local `layer` is reached at compute-only time `clock` (now minus the run's
        stall so far) and could start its experts at wall time `ready` had none been missing,
        routing `experts`, with `acc` from the cache."""
        off = first * self.E
        needed = len(acc.loads)
        unused = self.unused
        if unused:  # routed residents count as used before any miss evicts (as `route` does)
            for e in experts:
                if e + off in unused:
                    unused.discard(e + off)
                    needed += all(ld.expert != e for ld in acc.loads)  # a demand load now: the prefetch left unused
            for ld in acc.loads:
                if ld.victim >= 0:
                    unused.discard(ld.victim + off)
        if needed:
            g = first + layer
            copied = self._copied[device] + needed * self.copy_s[g]
            self._copied[device] = copied
            if copied > ready:
                self.bound_by_layer[g] += copied - ready
            excess = copied - clock
            if excess > self.bound_by_device[device]:
                self.bound_by_device[device] = excess
                if excess > self.bound:
                    self.bound = excess
