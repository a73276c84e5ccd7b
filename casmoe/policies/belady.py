"""Belady's MIN: evict the resident whose next use lies farthest in the future.

Optimal for demand loads (no prefetch); the yardstick every practical policy is measured
against. An oracle: it reads the runtime's whole step sequence through `self.future`.
"""

from __future__ import annotations

from casmoe.cache import ExpertCache
from casmoe.geometry import ExpertId


class Belady(ExpertCache):
    name = "belady"
    needs_future = True

    def victim(self, layer: int, candidates) -> ExpertId:
        future, now = self.future, self.visit
        return max(candidates, key=lambda e: (future.next_use(e, now), -e))
