"""SRP, segment routing best performance: how well one expert set per m-token segment fits.

The definition is moe-lrc's (arXiv 2505.16056, public code ljcleo/moe-lrc,
`src/30_srp_calc.py` `seg_stat` and `src/31_srp_refine.py` `refine`), reimplemented here:

- Segments are all windows of m consecutive tokens of a sequence, stride 1 (T - m + 1 of
  them; none if T < m). For each window and expert let `c` be how many of its m tokens route
  to the expert (0..m).
- A threshold `tau` in 0..m pre-routes the expert to every token of the window when
  `c >= tau`: that predicts m activations, of which `c` are real.
  `matches(tau) = sum c`, `preds(tau) = m * #(c >= tau)` over pre-routed (window, expert)
  pairs, `acts = sum c` over all pairs.
- F1(tau) = 2 matches / (preds + acts) (denominator clamped to >= 1), and **SRP = max over
  tau**, taken after summing the statistics over windows, experts and sequences (per layer),
  and also over layers (model level). The pre-routed-per-active ratio is `preds / acts` at
  the best tau; `activation_rate = acts / preds(tau=0)` is k / E for complete routing.
- moe-lrc builds windows by repeated doubling, so it measures only powers of two up to 256;
  here any m >= 1 works and powers of two give the same windows.
- A window that contains a `NOT_COMPUTED` token-layer is skipped at that layer (its counts
  would be missing activations, not routing).

All the statistics follow from per-sequence histograms `hist[c]` of window counts, which is
also what makes the bootstrap over sequences (`casmoe.metrics.bootstrap`) a matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from casmoe.metrics.tokens import MetricsError


@dataclass(frozen=True)
class SegmentStats:
    """Histograms `hist[seq, layer, c]`: (window, expert) pairs with count c, for one m."""

    m: int
    hist: np.ndarray


def segment_stats(seqs: list[np.ndarray], experts: int, ms: Sequence[int]) -> list[SegmentStats]:
    """Window-count histograms for each sequence `[T, L, k]` (-1 rows = gaps), layer and m.

    Each token-layer routes distinct experts. Compiled (`casmoe.kernels.window_counts`)."""
    from casmoe.kernels.window_counts import window_hist

    for m in ms:
        if m < 1:
            raise MetricsError(f"segment length m must be >= 1 token (got {m})")
    L = seqs[0].shape[1]
    hists = [np.zeros((len(seqs), L, m + 1), dtype=np.int64) for m in ms]
    for s, seq in enumerate(seqs):
        seq = np.ascontiguousarray(seq, dtype=np.int64)
        for m, hist in zip(ms, hists):
            if not window_hist(seq, experts, m, hist[s]):
                raise MetricsError(f"sequence {s}: an expert id lies outside [0, {experts}) or repeats within a token-layer")
    return [SegmentStats(m, h) for m, h in zip(ms, hists)]


@dataclass(frozen=True)
class SRPResult:
    """Best F1, its threshold, the pre-routed-per-active ratio and the activation rate
    (NaN where there is no window, or no activation for the ratio)."""

    srp: np.ndarray
    tau: np.ndarray
    preds_per_active: np.ndarray
    activation_rate: np.ndarray


def srp_from_hist(hist: np.ndarray, m: int) -> SRPResult:
    """SRP of summed histograms `hist[..., c]` (any leading shape; sum what should pool first)."""
    c = np.arange(m + 1)
    rev = lambda a: np.flip(np.cumsum(np.flip(a, -1), axis=-1), -1)  # noqa: E731  sum over c >= tau
    matches = rev(hist * c)
    preds = rev(hist) * m
    acts = matches[..., :1]
    f1 = 2 * matches / np.maximum(preds + acts, 1)
    tau = np.argmax(f1, axis=-1)
    best = np.take_along_axis(f1, tau[..., None], -1)[..., 0]
    p_best = np.take_along_axis(preds, tau[..., None], -1)[..., 0]
    a = acts[..., 0]
    windows = preds[..., 0] > 0  # no window at all (every sequence shorter than m): undefined
    best = np.where(windows, best, np.nan)
    ratio = np.where(a > 0, p_best / np.maximum(a, 1), np.nan)
    rate = np.where(windows, a / np.maximum(preds[..., 0], 1), np.nan)
    return SRPResult(best, tau, ratio, rate)
