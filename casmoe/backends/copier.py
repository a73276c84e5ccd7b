"""Asynchronous expert loads: store (disk) -> RAM tier or staging buffer -> device slot.

One `Loader` per device runs a copy thread that takes `Ticket`s in priority order (queued
demand loads jump ahead of queued prefetches; `promote` moves a prefetch a layer now needs)
and, for each, does the same three things on every device:

1. find the expert's bytes in host memory: its RAM-tier row (`HostTier`), or read it from the
   store into that row (a RAM-tier miss) or into a staging buffer (no RAM tier); a store whose
   experts already sit in host memory (`TensorStore`) is copied from directly;
2. copy them over the link into the ticket's slot: `CudaLink` (a dedicated CUDA stream, after
   the compute that last read the slot, completion as an event) or `CpuLink` (memcpy, with an
   optional bandwidth cap and per-copy latency that emulate a link for CPU runs);
3. signal completion.

Host buffers are reused only once the link has finished reading them (their last copy's event),
so a refill can never overwrite bytes still in flight. On the CPU the very same code runs with
memcpy as the link, which is how the tests exercise the CUDA path's logic.
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
    """One expert copy into the device rows `dst`: store expert (`layer`, `index`), or the
    host rows `src` when given. `ram` is the RAM-tier slot to read (`fill` False) or to fill
    from the store first (`fill` True)."""

    expert: int  # the cache's id (device-local flat id)
    slot: int
    demand: bool
    dst: dict[str, torch.Tensor]
    nbytes: int
    layer: int = 0  # the store's layer and expert index
    index: int = 0
    src: dict[str, torch.Tensor] | None = None
    ram: int = -1
    fill: bool = False
    after: Any = None  # CUDA event: the compute that may still read `dst`
    cancelled: bool = False
    started: bool = False
    submitted: float = 0.0
    finished: float = 0.0
    read_s: float = 0.0  # seconds reading the store (disk)
    _signal: threading.Event = field(default_factory=threading.Event, repr=False)
    _event: Any = field(default=None, repr=False)


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


class CpuLink:
    """memcpy as the link; with a cap, each copy occupies it `latency + bytes / bandwidth`
    seconds, one at a time, from when its bytes were in host memory or the link came free
    (a free-at time, as in the simulator's link)."""

    def __init__(self, link: EmulatedLink) -> None:
        self.bandwidth = link.bandwidth
        self.latency = link.latency
        self.emulated = bool(link.bandwidth or link.latency)
        self.busy = 0.0  # seconds the link spent copying (for utilisation figures)
        self._free_at = 0.0

    def copy(self, t: Ticket, src: dict[str, torch.Tensor], ready: float) -> None:
        start = max(ready, self._free_at) if self.emulated else time.perf_counter()
        for name, dst in t.dst.items():
            dst.copy_(src[name])
        if self.emulated:
            self._free_at = start + self.latency + (t.nbytes / self.bandwidth if self.bandwidth else 0.0)
            pause = self._free_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            else:
                self._free_at = time.perf_counter()
        self.busy += time.perf_counter() - start

    def fence(self) -> None:
        """Nothing to record: a CPU copy is done when `copy` returns."""
        return None

    def close(self) -> None:
        pass


class CudaLink:
    """Copies on a dedicated CUDA stream of `device`; completion is a recorded event."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.busy = 0.0

    def copy(self, t: Ticket, src: dict[str, torch.Tensor], ready: float) -> None:
        with torch.cuda.stream(self.stream):
            if t.after is not None:
                self.stream.wait_event(t.after)  # kernels still reading the victim's slot go first
            for name, dst in t.dst.items():
                dst.copy_(src[name], non_blocking=True)
            t._event = self.fence()

    def fence(self) -> Any:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def close(self) -> None:
        self.stream.synchronize()


class Staging:
    """A ring of host buffers, one expert each (pinned on CUDA), for store reads without a RAM
    tier; a buffer is refilled only after the copy that last read it has finished."""

    def __init__(self, store: Any, count: int, pin: bool) -> None:
        self.buffers = [store.empty_rows(pin=pin) for _ in range(count)]
        self.events: list[Any] = [None] * count
        self._next = 0

    def take(self) -> tuple[int, dict[str, torch.Tensor]]:
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        if self.events[i] is not None:
            self.events[i].synchronize()
            self.events[i] = None
        return i, self.buffers[i]


class Loader:
    """One device's copy thread (see the module docstring)."""

    def __init__(self, device: torch.device, store: Any = None, link: EmulatedLink | None = None,
                 host: Any = None, staging: int = 2) -> None:
        self.device = device
        self.store = store
        self.host = host  # HostTier or None
        cuda = device.type == "cuda"
        self.link = CudaLink(device) if cuda else CpuLink(link or EmulatedLink())
        self.staging = Staging(store, staging, cuda) if store is not None else None
        self.read_s = 0.0  # seconds reading the store
        self.reads = 0
        self._heap: list[tuple[int, int, Ticket]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"casmoe-loader-{device}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> float:
        return self.link.busy

    def submit(self, t: Ticket) -> None:
        t.submitted = time.perf_counter()
        if self.device.type == "cuda":
            t.after = torch.cuda.Event()
            t.after.record(torch.cuda.current_stream(self.device))
        with self._cv:
            heapq.heappush(self._heap, (0 if t.demand else 1, next(self._seq), t))
            self._cv.notify()

    def promote(self, t: Ticket) -> None:
        """A queued prefetch that a layer needs now moves to demand priority (as in the
        simulator's link); one already under way just finishes."""
        with self._cv:
            if not t.started and not t.demand:
                t.demand = True
                heapq.heappush(self._heap, (0, next(self._seq), t))

    def done(self, t: Ticket) -> bool:
        return t._signal.is_set() and (t._event is None or t._event.query())

    def wait(self, t: Ticket) -> None:
        t._signal.wait()
        if self._error is not None:
            raise self._error
        if t._event is not None:
            t._event.synchronize()  # host-side stall, so per-token timings see it
        t.finished = time.perf_counter()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        self.link.close()

    def _run(self) -> None:
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
                try:
                    if not t.cancelled or t.fill:  # a RAM fill happens even if its device copy was cancelled
                        self._load(t)
                except BaseException as exc:  # surfaced to the waiting compute thread
                    self._error = exc
                t.finished = time.perf_counter()
                t._signal.set()

    def _load(self, t: Ticket) -> None:
        """Steps 1 and 2 of the module docstring for one ticket."""
        if t.src is not None:
            self.link.copy(t, t.src, t.submitted)
            return
        host = self.host
        if host is not None and t.ram >= 0:
            rows = (host.fill if t.fill else host.acquire)(t.ram, t.layer, t.index, self)
            if rows is not None:
                try:
                    if not t.cancelled and t.dst:  # a RAM prefetch has no device row
                        self.link.copy(t, rows, t.submitted if not t.fill else time.perf_counter())
                finally:
                    host.release(t.ram, t._event)
                return
            host.bypassed += 1  # its row was refilled before this copy ran: read the store again
        i, rows = self.staging.take()
        self.read(t.layer, t.index, rows)
        self.link.copy(t, rows, time.perf_counter())
        self.staging.events[i] = t._event

    def read(self, layer: int, index: int, rows: dict[str, torch.Tensor]) -> None:
        """Read one expert from the store into host `rows`, timing it."""
        t0 = time.perf_counter()
        self.store.read(layer, index, rows)
        self.read_s += time.perf_counter() - t0
        self.reads += 1
