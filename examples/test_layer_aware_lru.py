"""How a user tests their own policy: casmoe's contract suite plus one behaviour of theirs."""

import numpy as np

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.replay import replay
from casmoe.sim.testing import check_policy
from casmoe.trace import Request, Trace
from examples.layer_aware_lru import HotNextLayer


def test_hot_next_layer_keeps_the_cache_contract():
    check_policy(HotNextLayer, max_examples=30)


def test_hot_next_layer_turns_repeated_misses_into_prefetch_hits():
    g = Geometry(2, 4, 1, hidden=8, intermediate=4)
    # layer 1 alternates between experts 0 and 1 with room for one: LRU always misses there
    topk = np.array([[[0], [t % 2]] for t in range(12)], dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0)])
    plain = replay(trace, HotNextLayer(g, Capacity(1), fetch=0)).stats
    hot = replay(trace, HotNextLayer(g, Capacity(1), fetch=1)).stats
    assert hot.prefetch_used > 0
    assert hot.misses < plain.misses
