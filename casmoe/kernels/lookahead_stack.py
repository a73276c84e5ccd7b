"""The SCH stack walk (see `casmoe.metrics.sch` for the definition), one lane at a time.

A stack entry packs `count << count_shift | clock << item_bits | item` into one int64, so
comparing entries compares priorities (clocks are unique) and the item rides along. When the
item at depth p is accessed, the running minima ("records") of depths 0..p-1 each move down to
the next record's depth, the last one to depth p, and the accessed item goes to the top: one
pass that carries the current minimum down the stack and swaps it with each smaller entry.
"""

from __future__ import annotations

import numba
import numpy as np


_inlined = numba.njit(cache=True, nogil=True, inline="always")
"""A named step of the walk, inlined into it by numba (as a plain call, the record-sinking step
alone made the per-layer curves 5% slower)."""


@numba.njit(cache=True, nogil=True)
def lanes_hits(batches, first, last, N, m, count_shift, item_bits, stat):
    """Add to `stat[lane, d]` the accesses found at stack depth d (at their token's start), for
    lanes `first..last-1` of `batches[lane, t, j]` (item ids, -1 for none).

    Returns False, with `stat` incomplete, if an item id lies outside [0, N) or repeats
    within a token (the walk would index past its arrays: numba does not bounds-check)."""
    _, T, B = batches.shape
    one_count = 1 << count_shift
    item_mask = (1 << item_bits) - 1
    cnt = np.empty(N, np.int64)  # uses of each item in the window of the next m tokens
    key = np.empty(N + 1, np.int64)  # the stack, top first
    pos = np.empty(N, np.int64)  # depth of each item, -1 before its first use
    seen = np.empty(N, np.int64)  # last token that accessed each item
    for lane in range(first, last):
        seq = batches[lane]
        if not _first_window(seq, N, m, cnt, seen):
            return False
        pos[:] = -1
        size = 0
        clock = 0
        for t in range(T):
            _record_depths(seq, t, pos, size, stat, lane)
            for j in range(B):
                x = seq[t, j]
                if x < 0:
                    continue
                p = pos[x]
                if p < 0:
                    p = size
                    size += 1
                if p > 0:
                    _sink_records(key, pos, p, item_mask)
                clock += 1
                cnt[x] -= 1
                key[0] = (cnt[x] << count_shift) | (clock << item_bits) | x
                pos[x] = 0
            if t + m < T:
                _enter_window(seq, t + m, cnt, pos, key, one_count)
    return True


@_inlined
def _first_window(seq, N, m, cnt, seen):
    """Check the lane's item ids (in [0, N), none twice in a token) and count each item's uses
    in its first m tokens into `cnt`. Returns False on a bad id."""
    T, B = seq.shape
    cnt[:] = 0
    seen[:] = -1
    for t in range(T):
        for j in range(B):
            x = seq[t, j]
            if x >= N or (x >= 0 and seen[x] == t):
                return False
            if x >= 0:
                seen[x] = t
                if t < m:
                    cnt[x] += 1
    return True


@_inlined
def _record_depths(seq, t, pos, size, stat, lane):
    """Count token t's accesses at their depths at the token's start; first uses fill the free
    slots below the stack in order."""
    new = 0
    for j in range(seq.shape[1]):
        x = seq[t, j]
        if x >= 0:
            d = pos[x]
            if d < 0:
                d = size + new
                new += 1
            stat[lane, d] += 1


@_inlined
def _sink_records(key, pos, p, item_mask):
    """Free the top for an item taken from depth p > 0: the running minima ("records") of
    depths 0..p-1 each move down to the next record's depth, the last one to depth p."""
    carry = key[0]
    for i in range(1, p):
        v = key[i]
        if v < carry:  # a record: it takes the previous record's depth
            key[i] = carry
            pos[carry & item_mask] = i
            carry = v
    key[p] = carry
    pos[carry & item_mask] = p


@_inlined
def _enter_window(seq, t, cnt, pos, key, one_count):
    """Token t enters the lookahead window: its items' counts (and priorities on the stack) rise."""
    for j in range(seq.shape[1]):
        x = seq[t, j]
        if x >= 0:
            cnt[x] += 1
            if pos[x] >= 0:
                key[pos[x]] += one_count
