"""Asynchronous expert loads: host store row -> device pool slot.

Two implementations of one small interface (`submit`, `done`, `wait`, `close`):

- `ThreadCopier` (CPU, tests, the fidelity run): one copy thread that works like a link. A
  bandwidth cap and a per-copy latency make each copy occupy the link for
  `latency + bytes / bandwidth` seconds, one at a time, from when it was asked for or the link
  came free (a free-at time, as in the simulator's link); queued demand loads jump ahead of
  queued prefetches.
- `CudaCopier`: copies from pinned memory on a dedicated CUDA stream; completion is a CUDA
  event. Copies wait for the compute already queued (a slot is only overwritten once the
  kernels that might still read it have run).

A `Ticket` cancelled before it starts (its slot was reassigned) is skipped.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class EmulatedLink:
    """An emulated host-to-device link for CPU runs: `bandwidth` bytes/s (None: memcpy speed)
    and a fixed `latency` seconds per copy. CUDA copies run at the real link's speed."""

    bandwidth: float | None = None
    latency: float = 0.0


@dataclass(eq=False)
class Ticket:
    """One expert copy: host rows `src` into pool rows `dst`."""

    expert: int
    slot: int
    demand: bool
    src: dict[str, torch.Tensor]
    dst: dict[str, torch.Tensor]
    nbytes: int
    cancelled: bool = False
    started: bool = False
    submitted: float = 0.0
    finished: float = 0.0
    _signal: Any = field(default=None, repr=False)


def _copy(t: Ticket, non_blocking: bool = False) -> None:
    for name, dst in t.dst.items():
        dst.copy_(t.src[name], non_blocking=non_blocking)


@contextmanager
def responsive_copies(interval: float = 2e-4) -> Iterator[None]:
    """Lower Python's GIL switch interval (5 ms by default) while an emulated link runs: the
    copy thread wakes on time instead of waiting for the compute thread to yield the GIL, which
    a real DMA engine never has to. Restored on exit."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class ThreadCopier:
    """A copy thread emulating a link of `bandwidth` bytes/s (None: as fast as memcpy) with a
    fixed `latency` per copy."""

    def __init__(self, bandwidth: float | None = None, latency: float = 0.0) -> None:
        self.bandwidth = bandwidth
        self.latency = latency
        self.busy = 0.0  # seconds the link spent copying (for utilisation figures)
        self._heap: list[tuple[int, int, Ticket]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="casmoe-copier", daemon=True)
        self._thread.start()

    def submit(self, t: Ticket) -> None:
        t._signal = threading.Event()
        t.submitted = time.perf_counter()
        with self._cv:
            heapq.heappush(self._heap, (0 if t.demand else 1, next(self._seq), t))
            self._cv.notify()

    def promote(self, t: Ticket) -> None:
        """A queued prefetch that a layer needs now moves to demand priority (as in the
        simulator's link); one already on the wire just finishes."""
        with self._cv:
            if not t.started and not t.demand:
                t.demand = True
                heapq.heappush(self._heap, (0, next(self._seq), t))

    def done(self, t: Ticket) -> bool:
        return t._signal.is_set()

    def wait(self, t: Ticket) -> None:
        t._signal.wait()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        free_at = 0.0
        with torch.no_grad():
            while True:
                with self._cv:
                    while not self._heap and not self._closed:
                        self._cv.wait()
                    if not self._heap:
                        return
                    _, _, t = heapq.heappop(self._heap)
                    if t.started:
                        continue  # the stale entry of a promoted prefetch
                    t.started = True
                if not t.cancelled:
                    # the emulated wire starts when the copy was asked for or the wire came free,
                    # whichever is later: this thread's own wake-up delays are not the link's
                    start = max(t.submitted, free_at) if self.bandwidth or self.latency else time.perf_counter()
                    _copy(t)
                    if self.bandwidth or self.latency:
                        free_at = start + self.latency + (t.nbytes / self.bandwidth if self.bandwidth else 0.0)
                        pause = free_at - time.perf_counter()
                        if pause > 0:
                            time.sleep(pause)
                        else:
                            free_at = time.perf_counter()
                    self.busy += time.perf_counter() - start
                t.finished = time.perf_counter()
                t._signal.set()


class CudaCopier:
    """Copies on a dedicated CUDA stream of `device`; completion is a recorded event."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.busy = 0.0

    def submit(self, t: Ticket) -> None:
        t.submitted = time.perf_counter()
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(compute)  # kernels still reading the victim's slot go first
            _copy(t, non_blocking=True)
            t._signal = torch.cuda.Event()
            t._signal.record(self.stream)

    def promote(self, t: Ticket) -> None:
        """Copies on one stream run in order; nothing to reorder."""

    def done(self, t: Ticket) -> bool:
        return t._signal.query()

    def wait(self, t: Ticket) -> None:
        torch.cuda.current_stream(self.device).wait_event(t._signal)
        t._signal.synchronize()  # host-side stall, so per-token timings see it
        t.finished = time.perf_counter()

    def close(self) -> None:
        self.stream.synchronize()
