"""The SRP window histograms (see `casmoe.metrics.srp` for the definition) of one sequence.

Sliding the m-token window one token on changes only the counts of the experts of the token
that leaves and of the token that enters, so instead of recounting all L x E experts per
window, each (layer, expert) count remembers the window since which it holds its value and,
when it changes, adds the number of clean windows it held it for to `hist[layer, value]`.
Work is O(T x L x k) per m instead of O(T x L x E).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def window_hist(seq, experts, m, hist):
    """Add to `hist[layer, c]` the (window, expert) pairs of `seq` `[T, L, k]` (-1 rows: gaps)
    whose m-token window is clean (no gap at that layer) and routes c of its tokens there.

    Returns False, with `hist` incomplete, if an expert id lies outside [0, experts) or repeats
    within a token-layer (counts would then index past `hist`: numba does not bounds-check)."""
    T, L, k = seq.shape
    W = T - m + 1
    if W <= 0:
        return True
    clean = np.zeros(W + 1, np.int64)  # clean[w]: clean windows among 0..w-1, per layer
    count = np.zeros(experts, np.int64)
    since = np.zeros(experts, np.int64)
    for layer in range(L):
        gaps = 0  # gaps among the current window's tokens
        for t in range(m):
            gaps += int(seq[t, layer, 0] < 0)
        for w in range(W):
            clean[w + 1] = clean[w] + (gaps == 0)
            if w + 1 < W:
                gaps += int(seq[w + m, layer, 0] < 0) - int(seq[w, layer, 0] < 0)
        count[:] = 0
        since[:] = 0
        for t in range(T):  # check the ids, and count the first window
            for j in range(k):
                e = seq[t, layer, j]
                if e >= experts:
                    return False
                if e >= 0:
                    for i in range(j):
                        if seq[t, layer, i] == e:
                            return False
                    if t < m:
                        count[e] += 1
        for w in range(1, W):  # the window moves from w - 1 to w: one token leaves, one enters
            for j in range(k):
                e = seq[w - 1, layer, j]
                if e >= 0:
                    hist[layer, count[e]] += clean[w] - clean[since[e]]
                    since[e] = w
                    count[e] -= 1
            for j in range(k):
                e = seq[w + m - 1, layer, j]
                if e >= 0:
                    hist[layer, count[e]] += clean[w] - clean[since[e]]
                    since[e] = w
                    count[e] += 1
        for e in range(experts):
            hist[layer, count[e]] += clean[W] - clean[since[e]]
    return True
