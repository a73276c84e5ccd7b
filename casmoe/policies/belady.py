"""Belady's MIN: evict the resident whose next use lies farthest in the future.

Optimal for demand loads (no prefetch); the yardstick every practical policy is measured
against. An oracle: it reads the runtime's whole step sequence through `self.future`.
"""

from __future__ import annotations

import numpy as np

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId
from casmoe.kernels.layout import C_L, R_LAYER, R_STEP
from casmoe.twin import Twin
from casmoe.policies.lazy_heap import LazyHeaps


def farthest_next_use(mc, expert):
    """The compiled victim order (`Twin.order`): the farthest next use first (`mc.key`, kept by
    `note_next_use`), then the lowest id."""
    return mc.key[expert], expert


def note_next_use(mc, expert):
    """The twin's `touched` hook, as `on_access`: key = -(the next use after now), -inf for none."""
    now = mc.reg[R_STEP] * mc.cfg[C_L] + mc.reg[R_LAYER]
    lo, hi = mc.use_ptr[expert], mc.use_ptr[expert + 1]
    i = np.searchsorted(mc.use_visit[lo:hi], now, side="right")
    mc.key[expert] = -float(mc.use_visit[lo + i]) if lo + i < hi else -np.inf


class Belady(ExpertCache):
    name = "belady"
    summary = "evicts the expert used farthest in the future: optimal eviction, a bound"
    twin = Twin(farthest_next_use, touched=note_next_use, reads_future=True)
    needs_future = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._heaps = LazyHeaps(self.pools)

    def on_access(self, expert: ExpertId) -> None:
        # a resident's next use only changes when it is used
        self._heaps.push(self.pool_of[expert], expert, -self.future.next_use(expert, self.visit))

    on_insert = on_access

    def on_evict(self, expert: ExpertId) -> None:
        self._heaps.forget(expert)

    def victim(self, layer: int, candidates) -> ExpertId:
        return self._heaps.pop_min(self.pool_of[layer * self.geometry.experts], candidates)
