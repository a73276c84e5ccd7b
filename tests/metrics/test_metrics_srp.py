"""SRP (casmoe.metrics.srp): hand-worked windows, pooling before the maximum, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import MetricsError
from support.kernel_modes import kernels
from support.reference_metrics import numpy_segment_stats
from support.routing_strategies import relabelled, routed

SRP_ROUTED = routed(max_tokens=20, max_k=None)  # longer sequences than SCH's, k up to E


def seq(layers: list[list[int]]) -> np.ndarray:
    """Per layer, one expert per token -> [T, L, 1]."""
    return np.array(layers, dtype=np.int64).T[:, :, None]


def test_hand_worked_windows():
    # E=2, k=1, experts 0 0 1 0, m=2: windows [0 0] [0 1] [1 0].
    # (window, expert) counts: (2, 0), (1, 1), (1, 1) -> hist c=0: 1, c=1: 4, c=2: 1; acts = 6.
    # tau=0: preds = 2 * 6 = 12, matches 6 -> F1 = 12/18; tau=1: preds = 2 * 5 = 10,
    # matches 6 -> F1 = 12/16 = 0.75; tau=2: preds 2, matches 2 -> F1 = 4/8.
    (st2,) = segment_stats([seq([[0, 0, 1, 0]])], 2, [2])
    np.testing.assert_array_equal(st2.hist[0, 0], [1, 4, 1])
    r = srp_from_hist(st2.hist.sum(axis=(0, 1)), 2)
    assert r.srp == pytest.approx(0.75)
    assert r.tau == 1
    assert r.preds_per_active == pytest.approx(10 / 6)
    assert r.activation_rate == pytest.approx(0.5)


def test_model_level_sums_statistics_before_the_maximum():
    # Layer 0 as above (best 0.75 at tau=1). Layer 1: experts 0 0 0 0 -> every window (2, 0):
    # hist c=0: 3, c=2: 3, acts 6; tau=1 or 2 gives preds 6, matches 6 -> F1 = 1.
    # Pooled: tau=1: matches 12, preds 16, acts 12 -> 24/28 = 6/7; tau=2: matches 8, preds 8
    # -> 16/20 = 0.8; tau=0: 24/36. Model SRP = 6/7, not the mean of the layers' 0.875.
    (s,) = segment_stats([seq([[0, 0, 1, 0], [0, 0, 0, 0]])], 2, [2])
    layers = srp_from_hist(s.hist.sum(axis=0), 2)
    np.testing.assert_allclose(layers.srp, [0.75, 1.0])
    assert srp_from_hist(s.hist.sum(axis=(0, 1)), 2).srp == pytest.approx(6 / 7)


def test_windows_stay_within_a_sequence_and_skip_gaps():
    # Two sequences 0 1 and 1 0 with m=2 give two windows, not the three of 0 1 1 0.
    (s,) = segment_stats([seq([[0, 1]]), seq([[1, 0]])], 2, [2])
    assert s.hist.sum() == 2 * 2  # 2 windows x 2 experts
    # A gap (-1) at token 1 removes both windows containing it: 0 -1 0 0 with m=2 keeps [0 0].
    (g,) = segment_stats([seq([[0, -1, 0, 0]])], 2, [2])
    np.testing.assert_array_equal(g.hist[0, 0], [1, 0, 1])
    # A sequence shorter than m has no window at all.
    (short,) = segment_stats([seq([[0, 1]])], 2, [3])
    assert short.hist.sum() == 0


def test_powers_of_two_and_other_lengths_agree_with_direct_counting():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 5, size=(40, 2, 1))
    for m in (1, 3, 4, 7):
        (st_,) = segment_stats([s], 5, [m])
        for layer in range(2):
            direct = np.zeros(m + 1, dtype=int)
            for w in range(40 - m + 1):
                counts = np.bincount(s[w : w + m, layer, 0], minlength=5)
                direct += np.bincount(counts, minlength=m + 1)
            np.testing.assert_array_equal(st_.hist[0, layer], direct)


def _srp(E, seqs, m):
    (s,) = segment_stats(seqs, E, [m])
    return srp_from_hist(s.hist.sum(axis=(0, 1)), m).srp, srp_from_hist(s.hist.sum(axis=0), m).srp


@settings(max_examples=40, deadline=None)
@given(SRP_ROUTED, st.integers(1, 8), st.randoms(use_true_random=False))
def test_relabelling_experts_changes_nothing(data, m, rnd):
    E, seqs = data
    for a, b in zip(_srp(E, seqs, m), _srp(E, relabelled(seqs, E, rnd), m)):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(SRP_ROUTED, st.integers(1, 8))
def test_duplicating_sequences_leaves_srp_unchanged(data, m):
    E, seqs = data
    for a, b in zip(_srp(E, seqs, m), _srp(E, seqs + seqs, m)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(SRP_ROUTED, st.integers(1, 8))
def test_srp_is_a_valid_f1_at_least_the_all_experts_guess(data, m):
    E, seqs = data
    (s,) = segment_stats(seqs, E, [m])
    h = s.hist.sum(axis=(0, 1))
    r = srp_from_hist(h, m)
    if h.sum() == 0:
        return
    k = seqs[0].shape[2]
    # tau = 0 predicts every expert everywhere: F1 = 2k/E / (1 + k/E).
    assert r.srp >= 2 * (k / E) / (1 + k / E) - 1e-12
    assert r.srp <= 1 + 1e-12
    assert r.activation_rate == pytest.approx(k / E)


def test_rejects_bad_m():
    with pytest.raises(MetricsError):
        segment_stats([seq([[0, 1]])], 2, [0])


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
@settings(max_examples=60, deadline=None)
@given(data=SRP_ROUTED, ms=st.lists(st.integers(1, 12), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_window_kernel_equals_the_previous_numpy_histograms(compiled, data, ms, seed):
    """Including NOT_COMPUTED token-layers (-1 rows) and sequences shorter than m; the kernel
    compiled and interpreted (which bounds-checks every index)."""
    E, seqs = data
    rng = np.random.default_rng(seed)
    seqs = [np.where(rng.random(s.shape[:2])[:, :, None] < 0.2, -1, s) for s in seqs]
    with kernels("casmoe.kernels.window_counts", compiled):
        got_stats = segment_stats(seqs, E, ms)
    for got, want in zip(got_stats, numpy_segment_stats(seqs, E, ms)):
        np.testing.assert_array_equal(got.hist, want.hist)


@pytest.mark.parametrize("bad", [[[0, 0]], [[0, 3]]], ids=["repeat", "outside"])
def test_rejects_ids_the_histogram_cannot_hold(bad):
    with pytest.raises(MetricsError, match="outside"):
        segment_stats([np.array(bad * 3, dtype=np.int64)[:, None, :]], 3, [2])
