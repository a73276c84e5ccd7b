"""The branches of the compiled cache machine (`cache_machine.py`), as names a policy declares.

A built-in policy names the branch whose decisions equal its Python hooks
(`Twin.kind`, `casmoe.twin`); `casmoe/compiled.py` puts that number in the kernel's settings
and `cache_machine._victim_key` orders victims by it. This module imports no numba, so
choosing between the compiled and the Python path stays cheap.

A new compiled policy adds one member here and one branch in `cache_machine._victim_key`.
"""

from __future__ import annotations

import enum


class Kind(enum.IntEnum):
    """How the kernel orders a pool's candidates for eviction (smallest key first)."""

    LRU = 0  # least recently used (lru, ondemand, semoe, speculative)
    STATIC = 1  # unpinned first, then least recently used
    LFU = 2  # least used, then least recently touched
    BELADY = 3  # farthest next use, then lowest id
    SCH = 4  # fewest uses in the lookahead window, then least recently used
    CASMOE = 5  # lowest predicted score, then least recently touched
    LEAST_STALE = 6  # most layers until its next turn, then least recently used


READS_USES = frozenset({Kind.BELADY, Kind.SCH})
"""Branches that read every expert's future visits (the kernel then gets `StepArrays.uses`)."""
