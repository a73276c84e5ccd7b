"""Least-Stale (SpecMD, Hoang et al. 2026, arXiv 2602.03921): evict by the layer order, not by recency.

SpecMD observes that MoE expert access breaks LRU's and LFU's assumptions: a token visits the
layers in a fixed order, so an expert of a layer the forward pass has just left is not needed
again until the next token reaches that layer, while one of an upcoming layer is needed within
a few layers. LRU evicts the oldest expert, which in a pool shared by all layers is exactly a
previous token's expert of the layer about to run (a cyclic scan: LRU's worst case), and
evicts prefetched experts before their use ("collision misses", up to 85x fewer with
Least-Stale, and over 88% hits with a 5% cache on OLMoE, per the paper's abstract).

Modelled, as we read the policy (the abstract and public ports of it; the paper's algorithm
text was not reachable from this machine, so this is our reading, not a transcription): an
expert goes stale when the forward pass leaves its layer; the victim is the least stale one,
the expert whose layer the pass left most recently, i.e. whose next turn in the layer order
lies farthest ahead: the most layers until its next turn (an unrouted resident of the running
layer waits L layers, one of the layer just left L - 1, one of the next layer 1); least
recently used among equals. With per-layer pools (`--capacity`) every candidate shares one layer, so the policy is
LRU there; it differs in a pool shared by layers (`--global-capacity`), the paper's setting.

The compiled twin (`farthest_turn`) orders candidates by (-turn, last use): a victim is
only ever chosen while `route` runs (the policy prefetches nothing), so `visit` is the running
layer's in both paths.

Not modelled: SpecMD's prefetchers and its hardware model (casmoe's simulator prices time).
"""

from __future__ import annotations

from casmoe.geometry import ExpertId
from casmoe.kernels.layout import C_E, C_L, R_LAYER
from casmoe.twin import Twin
from casmoe.policies.lru import LRU


def farthest_turn(mc, expert):
    """The compiled victim order (`Twin.order`): the most layers until its layer's next turn
    first, then the least recently used."""
    L = mc.cfg[C_L]
    return -float((expert // mc.cfg[C_E] - mc.reg[R_LAYER] - 1) % L + 1), mc.last[expert]


class LeastStale(LRU):
    name = "least-stale"
    summary = "evicts the expert of the layer the forward pass left longest ago (SpecMD)"
    twin = Twin(farthest_turn)

    def victim(self, layer: int, candidates) -> ExpertId:
        g = self.geometry
        L, E = g.layers, g.experts
        running = self.visit % L
        best, best_turn = -1, -1
        for e in self.recency(layer):  # least recently used first: the first of equals wins
            if e in candidates:
                turn = (e // E - running - 1) % L + 1  # layers until its next turn, in 1..L
                if turn > best_turn:
                    best, best_turn = e, turn
                    if turn == L:
                        break
        return best
