"""A short probe of the host's memory bandwidth, for the boxes whose memory cannot be read.

STREAM's Copy kernel in numpy: `threads` threads each copy their share of an array several
times the last-level cache, so that the copy streams from DRAM; the rate counts the bytes read
plus the bytes written (STREAM's convention), best of a few repeats. numpy releases the GIL
while it copies, so threads run in parallel. One thread's rate is what a single thread of an
expert kernel can stream (`cpu_thread_gbs`); all threads' rate is a floor of the peak (an
achieved rate on a loaded machine, not the channels' sum).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise

MIN_BYTES = 256 * 2**20
MAX_BYTES = 1024 * 2**20
"""Each array is twice the last-level cache, within these bounds (two arrays in all): large
enough that copies stream from DRAM on a desktop, small enough for a box with little free RAM."""
REPEATS = 3


@dataclass(frozen=True)
class Stream:
    """A measured copy rate and how it was measured."""

    gbs: float
    threads: int
    nbytes: int
    seconds: float

    @property
    def how(self) -> str:
        return (f"numpy copy of {self.nbytes / 2**20:.0f} MiB by {self.threads} thread{'s' * (self.threads > 1)}, "
                f"best of {REPEATS} (read + written bytes, STREAM Copy), {self.gbs:.1f} GB/s")


def array_bytes(l3_bytes: int | None) -> int:
    return min(max(2 * (l3_bytes or 0), MIN_BYTES), MAX_BYTES)


def stream_copy(threads: int, nbytes: int) -> Stream:
    """The best copy rate of `threads` threads over two arrays of `nbytes`."""
    import numpy as np

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    bounds = np.linspace(0, src.size, threads + 1).astype(int)
    parts = [(dst[a:b], src[a:b]) for a, b in pairwise(bounds)]
    timings = []
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(REPEATS + 1):
            t0 = time.perf_counter()
            list(pool.map(lambda p: np.copyto(*p), parts))
            timings.append(time.perf_counter() - t0)
    best = min(timings[1:])  # the first pass maps dst's pages
    return Stream(2 * src.nbytes / best / 1e9, threads, nbytes, time.perf_counter() - start)
