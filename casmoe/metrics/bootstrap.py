"""Basic bootstrap over sequences, as moe-lrc computes its confidence intervals.

Sequences (requests) are the resampling unit: a replicate draws n of the n sequences with
replacement, which for statistics that are sums over sequences is one integer weight matrix
`[replicates, n]` applied to per-sequence sums. Randomness comes from a passed, seeded
`numpy.random.Generator`.
"""

from __future__ import annotations

import numpy as np


def bootstrap_weights(n: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """`[replicates, n]` multiplicities of each sequence in resamples with replacement."""
    idx = rng.integers(0, n, size=(replicates, n)) + n * np.arange(replicates)[:, None]
    return np.bincount(idx.ravel(), minlength=replicates * n).reshape(replicates, n)


def basic_interval(estimate: np.ndarray, replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Basic bootstrap interval `2 * estimate - q`, with moe-lrc's order-statistic indices.

    moe-lrc (src/31_srp_refine.py, src/41_sch_calc.py) sorts the B replicate statistics and
    takes `lp = round(B * (1 - confidence) / 2)`, `up = B - lp` as the lower and upper
    quantile positions (0-based); `up` is clipped to B - 1 so that tiny B stays in range.
    """
    B = replicates.shape[0]
    srt = np.sort(replicates, axis=0)
    lp = int(round(B * (1 - confidence) / 2))
    up = min(B - lp, B - 1)
    return 2 * estimate - srt[up], 2 * estimate - srt[lp]
