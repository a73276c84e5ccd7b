"""SCH (casmoe.metrics.sch): hand-worked stacks, invariants, and agreement with the sch policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casmoe.geometry import Geometry
from casmoe.metrics.baselines import replay_hit_rate, token_trace
from casmoe.metrics.sch import lookahead_hits
from casmoe.metrics.tokens import MetricsError, sequences
from casmoe.trace import Request, Trace
from support.kernel_modes import kernels
from support.reference_metrics import numpy_lookahead_hits
from support.routing_strategies import relabelled, routed


def curve(tokens: list[list[int]], items: int, m: int) -> np.ndarray:
    """SCH hit rate for C = 1..items of one sequence (one lane)."""
    res = lookahead_hits(np.array(tokens, dtype=np.int64)[None], items, m)
    return res.hits[0] / res.requests[0]


def single_layer_trace(seqs: list[list[list[int]]], E: int) -> Trace:
    k = len(seqs[0][0])
    reqs = []
    for s in seqs:
        topk = np.array(s, dtype=np.int16).reshape(len(s), 1, k)
        reqs.append(Request(topk=topk, weights=np.full(topk.shape, 1.0 / k, np.float32), prefill=0))
    return Trace(Geometry(1, E, k), reqs)


def test_hand_worked_lookahead_stack():
    # Items a=0, b=1, c=2; one expert per token: a b a c b; m = 2, so a priority counts the
    # current token and the next one, minus uses already served in this token.
    # t0 a: first use, 0 distinct seen before -> hit for C >= 1. Stack [a].
    # t1 b: first use, 1 distinct before -> hit for C >= 2. Stack [b, a].
    # t2 a: depth 1 -> hit for C >= 2. Stack [a, b].
    # t3 c: first use, 2 distinct before -> hit only for C = 3. A 2-slot cache {a, b} must
    #       evict: a's count in [t3, t5) is 0, b's is 1 (t4) -> evict a. Stack [c, b, a].
    # t4 b: depth 1 -> hit for C >= 2.
    # Hits by C: C=1: t0 -> 1/5; C=2: t0 t1 t2 t4 -> 4/5; C=3: all -> 5/5.
    tokens = [[0], [1], [0], [2], [1]]
    np.testing.assert_allclose(curve(tokens, 3, 2), [1 / 5, 4 / 5, 1.0])
    # LRU would have evicted b at t3 (a is more recent) and missed t4: 3/5 at C = 2.
    tr = single_layer_trace([tokens], 3)
    assert replay_hit_rate(token_trace(tr, sequences(tr)), "lru", 2, True) == pytest.approx(3 / 5)


def test_more_lookahead_can_lower_sch():
    # a b d b d b d a a a a a with C = 2 (a=0, b=1, d=2).
    # m = 12 (sees everything): at t2 the cache {a, b} evicts b (a counts 5 future uses, b 2);
    #   from then on the single free slot thrashes between b and d (t2..t6 all miss), and a
    #   hits t7..t11. Hits: t0, t1 (free slots) + 5 = 7/12.
    # m = 2: at t2 a has no use in [t2, t4) -> evict a; b and d then hit t3..t6; a misses once
    #   at t7 (evicting b, the older of two zero counts) and hits t8..t11. Hits: 2 + 4 + 4 = 10/12.
    tokens = [[0], [1], [2], [1], [2], [1], [2], [0], [0], [0], [0], [0]]
    assert curve(tokens, 3, 12)[1] == pytest.approx(7 / 12)
    assert curve(tokens, 3, 2)[1] == pytest.approx(10 / 12)


def test_token_batch_is_judged_at_token_start():
    # E=3, k=2, m=2, C=2: tokens [1,0] [1,2] [0,2]. moe-lrc judges each token against the
    # stack at its start, then updates access by access. At t1, expert 1 hits; then 2 (new,
    # no free slot) evicts the lowest priority of {1, 0}: 1 has no use left in [t1, t3) after
    # this one (count 0), 0 has one at t2 -> 1 goes, although this very token used it.
    # t2: 0 and 2 both hit. C=2: t0 2 free-slot hits, t1 1, t2 2 -> 5/6.
    tokens = [[1, 0], [1, 2], [0, 2]]
    assert curve(tokens, 3, 2)[1] == pytest.approx(5 / 6)
    # casmoe's runtime protects expert 1 while its layer runs, evicts 0 instead and misses it
    # at t2: 4/6. This is the documented difference between the metric and the sch policy.
    tr = single_layer_trace([tokens], 3)
    assert replay_hit_rate(token_trace(tr, sequences(tr)), "sch", 2, True, m=2) == pytest.approx(4 / 6)


def test_model_level_concatenates_layers_into_one_batch():
    # Two layers x 2 experts, k=1: items are layer*2 + expert. Token 0 routes (0, 1) -> items
    # 0, 3; token 1 routes (0, 1) again. t0: both first uses, free slots at C >= 1 and C >= 2.
    # t1: stack [3, 0] -> item 0 at depth 1, item 3 at depth 0. So C=1: t0's first access
    # and t1's item 3 -> 2/4; C >= 2: all 4.
    batches = np.array([[[0, 3], [0, 3]]])
    res = lookahead_hits(batches, 4, 1)
    np.testing.assert_allclose(res.hits[0] / res.requests[0], [0.5, 1, 1, 1])


def _per_lane(E: int, seqs: list[np.ndarray], m: int) -> np.ndarray:
    L, k = seqs[0].shape[1:]
    Tm = max(len(s) for s in seqs)
    lanes = np.full((len(seqs) * L, Tm, k), -1)
    for i, s in enumerate(seqs):
        lanes[i * L : (i + 1) * L, : len(s)] = s.transpose(1, 0, 2)
    res = lookahead_hits(lanes, E, m)
    return res.hits.sum(0) / res.requests.sum()


@settings(max_examples=40, deadline=None)
@given(routed(), st.integers(1, 5))
def test_lockstep_lanes_equal_one_lane_at_a_time(data, m):
    E, seqs = data
    together = lookahead_hits(np.stack([np.pad(s[:, 0], ((0, max(len(x) for x in seqs) - len(s)), (0, 0)), constant_values=-1) for s in seqs]), E, m)
    for i, s in enumerate(seqs):
        alone = lookahead_hits(s[None, :, 0], E, m)
        np.testing.assert_array_equal(together.hits[i], alone.hits[0])


@settings(max_examples=40, deadline=None)
@given(routed(), st.integers(1, 5), st.randoms(use_true_random=False))
def test_relabelling_experts_changes_nothing(data, m, rnd):
    E, seqs = data
    np.testing.assert_array_equal(_per_lane(E, seqs, m), _per_lane(E, relabelled(seqs, E, rnd), m))


@settings(max_examples=40, deadline=None)
@given(routed(), st.integers(1, 5))
def test_duplicating_sequences_leaves_sch_unchanged(data, m):
    E, seqs = data
    np.testing.assert_allclose(_per_lane(E, seqs, m), _per_lane(E, seqs + seqs, m), rtol=0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(routed(), st.integers(1, 6))
def test_all_items_hit_and_cold_start_offset(data, m):
    E, seqs = data
    for s in seqs:
        hits = lookahead_hits(s[None, :, 0], E, m).hits[0]
        # C = all items: every access hits (first uses fill free slots for free).
        assert hits[-1] == s[:, 0].size
        # The warm start adds exactly min(C, distinct items) to a cold cache's hits, so the
        # curve never falls below min(C, D) / requests and is non-decreasing in C.
        D = len(np.unique(s[:, 0]))
        C = np.arange(1, E + 1)
        assert np.all(hits >= np.minimum(C, D))
        assert np.all(np.diff(hits) >= 0)


@settings(max_examples=25, deadline=None)
@given(routed(max_layers=2, max_tokens=10, max_seqs=2), st.integers(1, 4))
def test_sch_policy_replay_equals_curve_with_one_expert_per_layer(data, m):
    """With k = 1 nothing within a token interacts, so casmoe's sch policy (per-layer caches,
    a fresh cache per request, warm hit rate) must reproduce the SCH curve at every C."""
    E, seqs = data
    seqs = [s[:, :, :1] for s in seqs]
    L = seqs[0].shape[1]
    g = Geometry(L, E, 1)
    tr = Trace(g, [Request(topk=s.astype(np.int16), weights=np.ones(s.shape, np.float32), prefill=0) for s in seqs])
    want = _per_lane(E, seqs, m)
    for C in range(1, E + 1):
        assert replay_hit_rate(tr, "sch", C, True, m=m) == pytest.approx(want[C - 1], abs=1e-12)
    if L == 1:  # one global pool over one layer is the model level
        for C in range(1, E + 1):
            assert replay_hit_rate(tr, "sch", C, False, m=m) == pytest.approx(want[C - 1], abs=1e-12)


def test_rejects_bad_lookahead():
    with pytest.raises(MetricsError):
        lookahead_hits(np.zeros((1, 2, 1), dtype=np.int64), 2, 0)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
@settings(max_examples=60, deadline=None)
@given(data=routed(max_layers=3, max_tokens=16, max_seqs=3), m=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_stack_kernel_equals_the_previous_numpy_walk(compiled, data, m, seed):
    """Model level (all sequences in lockstep, and one alone) and per layer, with gaps; the
    kernel compiled and interpreted (which bounds-checks every index)."""
    E, seqs = data
    rng = np.random.default_rng(seed)
    seqs = [np.where(rng.random(s.shape[:2])[:, :, None] < 0.2, -1, s) for s in seqs]
    L, k = seqs[0].shape[1:]
    Tm = max(len(s) for s in seqs)
    model = np.full((len(seqs), Tm, L * k), -1)
    layer = np.full((len(seqs) * L, Tm, k), -1)
    for i, s in enumerate(seqs):
        model[i, : len(s)] = np.where(s >= 0, s + (np.arange(L) * E)[None, :, None], -1).reshape(len(s), L * k)
        layer[i * L : (i + 1) * L, : len(s)] = s.transpose(1, 0, 2)
    for batches, items in ((model, L * E), (model[:1], L * E), (layer, E)):
        with kernels("casmoe.kernels.lookahead_stack", compiled):
            got = lookahead_hits(batches, items, m)
        want = numpy_lookahead_hits(batches, items, m)
        np.testing.assert_array_equal(got.hits, want.hits)
        np.testing.assert_array_equal(got.requests, want.requests)


@pytest.mark.parametrize("bad", [[0, 0], [0, 3]], ids=["repeat", "outside"])
def test_rejects_items_the_stack_cannot_hold(bad):
    with pytest.raises(MetricsError, match="outside"):
        lookahead_hits(np.array([[[1, -1], bad]], dtype=np.int64), 3, 1)
