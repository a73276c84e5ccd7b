"""SCH oracle: keep the experts the next m tokens will route to most.

The cache behind the SCH metric of "Not All Models Suit Expert Offloading" (arXiv 2505.16056,
public code ljcleo/moe-lrc, src/41_sch_calc.py): an expert's priority is its count in the
routing of the current and next m-1 tokens, less the uses already served in the current token;
ties go to the most recently used. The lowest-priority resident is evicted.

casmoe runs it under its physical cache model: every expert routed in the running layer is
protected until the layer is done, whereas moe-lrc's accounting treats the accesses of a token
as instantaneous lookups. `casmoe.metrics` computes the moe-lrc curve itself; the two agree
except where moe-lrc would evict an expert the running layer uses.
"""

from __future__ import annotations

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache
from casmoe.geometry import ExpertId
from casmoe.kernels.layout import C_L, C_LOOKAHEAD, R_LAYER, R_STEP
from casmoe.twin import Twin, TwinState


def fewest_coming_uses(mc, expert):
    """The compiled victim order (`Twin.order`): the fewest uses in the visits (now, end of step +
    m - 1] first (`TwinState.lookahead` is m), then the least recently used."""
    L = mc.cfg[C_L]
    now = mc.reg[R_STEP] * L + mc.reg[R_LAYER]
    horizon = (now // L + mc.cfg[C_LOOKAHEAD]) * L - 1
    uses = mc.use_visit[mc.use_ptr[expert] : mc.use_ptr[expert + 1]]
    coming = np.searchsorted(uses, horizon, side="right") - np.searchsorted(uses, now, side="right")
    return float(coming), mc.last[expert]


class SCH(ExpertCache):
    name = "sch"
    summary = "keeps the experts the next m tokens route to most (the SCH metric's cache), a bound"
    needs_future = True

    def __init__(self, *args, m: int = 16, **kw) -> None:
        super().__init__(*args, **kw)
        if m < 1:
            raise CacheConfigError(f"sch lookahead m must be >= 1 token, got {m}")
        self.m = m
        self._last: dict[ExpertId, int] = {}
        self._tick = 0

    def _twin_state(self) -> TwinState:
        return TwinState(lookahead=self.m)

    twin = Twin(fewest_coming_uses, reads_future=True, state=_twin_state)

    def on_access(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick

    on_insert = on_access

    def victim(self, layer: int, candidates) -> ExpertId:
        future, now = self.future, self.visit
        # visits (now, end of step + m - 1]: the rest of this token and the next m-1 tokens
        horizon = (now // self.geometry.layers + self.m) * self.geometry.layers - 1
        last = self._last
        return min(candidates, key=lambda e: (future.count_between(e, now, horizon), last[e]))
