"""The previous, pure-numpy SCH stack walk and SRP window histograms (before the compiled
kernels of `casmoe.kernels`): the oracle the kernels must equal to the last bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from casmoe.metrics.sch import StackHits
from casmoe.metrics.srp import SegmentStats
from casmoe.metrics.tokens import MetricsError


def numpy_lookahead_hits(batches: np.ndarray, items: int, m: int, progress: Callable[[int], object] | None = None) -> StackHits:
    """SCH hit counts for every cache size, for each lane of `batches` `[lanes, T, B]`.

    `batches[lane, t]` lists the items token t accesses, in order, -1 for none (padding,
    gaps); a lane never accesses an item twice in one token. `progress(n)` is called with the
    number of tokens done. One lane runs a lean 1-D loop (the wide model-level stack of one
    sequence); several run in lockstep on 2-D arrays, which pays off for narrow stacks.
    """
    if m < 1:
        raise MetricsError(f"lookahead m must be >= 1 token (got {m})")
    lanes, T, B = batches.shape
    N = items
    item_bits = max(N.bit_length(), 1)
    clock_bits = (T * B + 1).bit_length()
    count_shift = item_bits + clock_bits
    if count_shift + (m + 1).bit_length() > 62:
        raise MetricsError(f"sequences too long for the packed SCH priority ({T} tokens x {B} accesses)")
    pack = _Packing(count_shift, item_bits)
    run = _one_lane if lanes == 1 else _lockstep
    stat = run(batches, N, m, pack, progress)
    return StackHits(np.cumsum(stat, axis=1), (batches >= 0).sum(axis=(1, 2)))


@dataclass(frozen=True)
class _Packing:
    """A stack entry is `count << count_shift | clock << item_bits | item`: comparing entries
    compares priorities (clocks are unique), and the item rides along."""

    count_shift: int
    item_bits: int

    @property
    def item_mask(self) -> int:
        return (1 << self.item_bits) - 1


def _initial_counts(batches: np.ndarray, N: int, m: int) -> np.ndarray:
    lanes = batches.shape[0]
    head = batches[:, :m]
    flat = np.where(head >= 0, head + (np.arange(lanes) * N)[:, None, None], lanes * N)
    return np.bincount(flat.ravel(), minlength=lanes * N + 1)[:-1].reshape(lanes, N)


def _one_lane(batches: np.ndarray, N: int, m: int, pack: _Packing, progress) -> np.ndarray:
    seq = batches[0]
    T = len(seq)
    cnt = _initial_counts(batches, N, m)[0].tolist()
    key = np.zeros(N + 1, dtype=np.int64)  # the stack, top first
    pos = np.full(N, -1, dtype=np.int64)  # depth of each item, -1 before its first use
    stat = np.zeros(N + 1, dtype=np.int64)  # hits by depth at the token's start
    run_min = np.empty(N + 1, dtype=np.int64)  # scratch, so the hot loop allocates less
    is_rec = np.empty(N + 1, dtype=bool)
    size = 0
    clock = 0
    shift, ibits, imask = pack.count_shift, pack.item_bits, pack.item_mask
    one_count = 1 << shift
    minimum, equal, flatnonzero = np.minimum.accumulate, np.equal, np.flatnonzero
    for t in range(T):
        row = seq[t]
        row = row[row >= 0]
        if len(row):
            depth = pos[row]
            new = depth < 0
            if new.any():
                depth[new] = size + np.arange(int(new.sum()))
            stat[depth] += 1  # items are distinct within a token
            for x in row.tolist():
                p = int(pos[x])
                if p < 0:
                    p = size
                    size += 1
                if p:
                    seg = key[:p]
                    rec = flatnonzero(equal(seg, minimum(seg, out=run_min[:p]), out=is_rec[:p]))
                    vals = key[rec]
                    rec[:-1] = rec[1:]  # each record moves to the next record's depth,
                    rec[-1] = p  # the last one to the accessed item's
                    key[rec] = vals
                    pos[vals & imask] = rec
                clock += 1
                c = cnt[x] - 1
                cnt[x] = c
                key[0] = (c << shift) | (clock << ibits) | x
                pos[x] = 0
        if t + m < T:
            nxt = seq[t + m]
            for x in nxt[nxt >= 0].tolist():
                cnt[x] += 1
                d = pos[x]
                if d >= 0:
                    key[d] += one_count
        if progress is not None:
            progress(1)
    return stat[None, :N]


def _lockstep(batches: np.ndarray, N: int, m: int, pack: _Packing, progress) -> np.ndarray:
    lanes, T, B = batches.shape
    shift, ibits, imask = pack.count_shift, pack.item_bits, pack.item_mask
    lane = np.arange(lanes)
    valid = batches >= 0
    cnt = _initial_counts(batches, N, m)
    key = np.zeros((lanes, N + 1), dtype=np.int64)
    pos = np.full((lanes, N), -1, dtype=np.int64)
    size = np.zeros(lanes, dtype=np.int64)
    stat = np.zeros(lanes * N + 1, dtype=np.int64)
    cols = np.arange(N + 1)
    for t in range(T):
        b = batches[:, t]  # [lanes, B]
        vb = valid[:, t]
        if vb.any():
            depth = np.where(vb, pos[lane[:, None], np.maximum(b, 0)], -2)
            new = depth == -1
            depth = np.where(new, size[:, None] + np.cumsum(new, axis=1) - 1, depth)
            stat += np.bincount(np.where(vb, depth + (lane * N)[:, None], lanes * N).ravel(), minlength=lanes * N + 1)
            for j in range(B):
                act = vb[:, j]
                if not act.any():
                    continue
                xs = np.maximum(b[:, j], 0)
                p = pos[lane, xs]
                grow = act & (p < 0)
                p = np.where(grow, size, np.where(act, p, 0))
                size += grow
                P = int(p.max())
                if P:
                    seg = key[:, :P]
                    r, c = np.nonzero((seg == np.minimum.accumulate(seg, axis=1)) & (cols[:P] < p[:, None]))
                    vals = key[r, c]
                    dst = np.empty_like(c)
                    dst[:-1] = np.where(r[1:] == r[:-1], c[1:], p[r[:-1]])
                    dst[-1] = p[r[-1]]
                    key[r, dst] = vals
                    pos[r, vals & imask] = dst
                la, xa = lane[act], xs[act]
                cnt[la, xa] -= 1
                key[la, 0] = (cnt[la, xa] << shift) | ((t * B + j + 1) << ibits) | xa
                pos[la, xa] = 0
        if t + m < T:
            va = valid[:, t + m]
            la, xa = np.nonzero(va)[0], batches[:, t + m][va]
            cnt[la, xa] += 1
            d = pos[la, xa]
            ok = d >= 0
            key[la[ok], d[ok]] += 1 << shift
        if progress is not None:
            progress(1)
    return stat[:-1].reshape(lanes, N)


def numpy_segment_stats(seqs: list[np.ndarray], experts: int, ms: Sequence[int]) -> list[SegmentStats]:
    """Window-count histograms for each sequence `[T, L, k]` (-1 rows = gaps), layer and m >= 1."""
    hists = [np.zeros((len(seqs), seqs[0].shape[1], m + 1), dtype=np.int64) for m in ms]
    L = seqs[0].shape[1]
    for s, seq in enumerate(seqs):
        T = len(seq)
        if T == 0:
            continue
        onehot = np.zeros((T + 1, L, experts + 1), dtype=np.int32)  # column E swallows the -1 of gaps
        onehot[np.arange(1, T + 1)[:, None, None], np.arange(L)[None, :, None], seq] = 1
        cs = np.cumsum(onehot[:, :, :experts], axis=0)  # [T + 1, L, E], cs[0] = 0
        gaps = np.zeros((T + 1, L), dtype=np.int32)
        gaps[1:] = np.cumsum(seq[:, :, 0] < 0, axis=0)
        for m, hist in zip(ms, hists):
            if T < m:
                continue
            window = cs[m:] - cs[:-m]  # [W, L, E]
            clean = gaps[m:] == gaps[:-m]  # [W, L]: no gap inside the window
            offset = np.arange(L)[None, :, None] * (m + 1)
            codes = np.where(clean[:, :, None], window + offset, L * (m + 1))
            hist[s] = np.bincount(codes.ravel(), minlength=L * (m + 1) + 1)[:-1].reshape(L, m + 1)
    return [SegmentStats(m, h) for m, h in zip(ms, hists)]
