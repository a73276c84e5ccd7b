"""The RAM tier (`--host-cache SIZE`): a policy-managed cache of expert rows in host memory,
between the store (the checkpoint on disk) and the device slot pools.

Semantics (the simulator's `--host-cache` mirrors them; keep the two in step):

- **Capacity.** `SIZE` bytes buy `SIZE // expert_bytes` rows (pinned on CUDA), one expert
  each, shared by every layer and every device: one `ExpertCache` with a global pool
  (`Capacity(rows, per_layer=False)`) over the whole model's geometry. At least top-k rows.
- **Policy.** LRU by default; any registered policy that does not read the future (`victim`
  and the bookkeeping hooks decide, exactly as on a device). Oracles are refused: the RAM
  tier's future is the device tiers' load sequence, which no trace holds.
- **Accesses.** The RAM tier sees one access per device-tier load (demand or prefetch), in the
  order the device caches issue them: `route(step, layer, [expert])`. A hit serves the copy
  from its row; a miss admits the expert (the policy picks the victim), reads it from the store
  into the freed row, and copies it on to the device. Requests are bracketed by
  `begin_request` / `end_request`; a policy that prefetches at request start (static, casmoe)
  has those experts read from the store into their rows in the background (prefetch priority):
  what the tier admits, it holds. Per-layer prefetch hooks are never called here.
- **Inclusion.** None enforced: an expert may sit on a device, in RAM, both, or neither; the
  store always holds everything.
- **Fills in flight.** The compute thread records, per row, the fills it has issued and no
  thread has started. A copy that hits a row whose fill for its expert has not run yet (the
  copy thread reorders demand ahead of prefetch) performs that fill itself, or waits for the
  thread running it, instead of reading the store a second time.
- **Accounting.** The RAM cache's own `CacheStats` (hits, misses, evictions, `bytes_loaded` =
  bytes read from the store), the seconds spent reading the store, and `bypassed`: copies
  whose row was refilled for another expert before they ran, served by a second store read.

Decisions are made on the compute thread when a device load is issued, so they never depend on
timing (like every cache here); the copy threads only move bytes, under a lock that keeps a row
from being refilled while a copy still reads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from casmoe.cache import Capacity, CacheConfigError, CacheStats, ExpertCache
from casmoe.geometry import Geometry


@dataclass(frozen=True)
class HostCache:
    """A RAM tier as configured: `rows` expert rows under `policy` (with its options)."""

    rows: int
    policy: type[ExpertCache]
    options: dict[str, Any] = field(default_factory=dict)


class HostTier:
    """`rows` expert rows in host memory, managed by `policy` (see the module docstring)."""

    def __init__(self, store: Any, geometry: Geometry, rows: int, policy: type[ExpertCache],
                 options: dict[str, Any] | None = None, pin: bool = False) -> None:
        if policy.needs_future:
            raise CacheConfigError(f"the RAM tier cannot run {policy.name!r}: it reads the future, and the RAM "
                                   "tier's future (the devices' loads) is in no trace")
        self.cache = policy.create(geometry, Capacity(rows, per_layer=False), **(options or {}))
        if self.cache.host_experts or self.cache.decides_host:
            raise CacheConfigError(f"the RAM tier cannot run {policy.name!r}: it is a placement of GPU and host "
                                   "experts (or computes misses on the host), not a caching policy")
        self.experts = geometry.experts
        self.rows = store.empty_rows(rows, pin=pin)
        self.store = store
        self.bypassed = 0
        self._holder = [-1] * rows  # expert whose bytes the row holds (-1: none or being filled)
        self._pending: list[list[int]] = [[] for _ in range(rows)]  # issued fills nobody has started
        self._filling = [-1] * rows  # expert a thread is reading into the row
        self._readers = [0] * rows
        self._copies: list[list[Any]] = [[] for _ in range(rows)]  # CUDA events of copies out of the row
        self._cv = threading.Condition()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.rows.values())

    def stats(self) -> CacheStats:
        return self.cache.stats()

    # ---- decisions (compute thread) ------------------------------------------------------

    def begin_request(self, request: Any) -> list[tuple[int, int, int]]:
        """The request-start prefetches the policy asks for (static, casmoe): (row, layer,
        expert) to read from the store into RAM, so that its decisions and the bytes agree."""
        loads = self.cache.begin_request(request)
        for ld in loads:
            self._issue(ld.slot, ld.expert)
        return [(ld.slot, *divmod(ld.expert, self.experts)) for ld in loads]

    def end_request(self) -> None:
        self.cache.end_request()

    def plan(self, step: int, layer: int, index: int) -> tuple[int, bool]:
        """The row a device load of (`layer`, `index`) copies from, and whether that row must
        first be filled from the store (a RAM miss)."""
        e = layer * self.experts + index
        acc = self.cache.route(step, layer, (e,))
        if acc.loads:
            self.cache.arrived(e)
            self._issue(acc.loads[0].slot, e)
            return acc.loads[0].slot, True
        return self.cache.slot(e), False

    def _issue(self, row: int, expert: int) -> None:
        with self._cv:
            self._pending[row].append(expert)

    # ---- bytes (copy threads) ------------------------------------------------------------

    def acquire(self, row: int, layer: int, index: int, loader: Any) -> dict[str, torch.Tensor] | None:
        """The row's tensors if it holds the expert, or will once its issued fill (run here if
        no thread has started it) is done; counted as read until `release`. None if the row
        was refilled with another expert since."""
        e = layer * self.experts + index
        with self._cv:
            while self._filling[row] == e:
                self._cv.wait()
            if self._holder[row] == e:
                self._readers[row] += 1
                return {n: t[row] for n, t in self.rows.items()}
            if e not in self._pending[row]:
                return None
        return self.fill(row, layer, index, loader)

    def fill(self, row: int, layer: int, index: int, loader: Any) -> dict[str, torch.Tensor]:
        """Read the expert from the store into `row` once no copy reads it any more (unless the
        row already holds it); returns the row, counted as read until `release`."""
        e = layer * self.experts + index
        with self._cv:
            while self._filling[row] >= 0 or (self._readers[row] and self._holder[row] != e):
                self._cv.wait()
            if e in self._pending[row]:
                self._pending[row].remove(e)
            if self._holder[row] == e:
                self._readers[row] += 1
                return {n: t[row] for n, t in self.rows.items()}
            self._holder[row] = -1
            self._filling[row] = e
            copies, self._copies[row] = self._copies[row], []
        done = False
        try:
            for ev in copies:
                ev.synchronize()
            tensors = {n: t[row] for n, t in self.rows.items()}
            loader.read(layer, index, tensors)
            done = True
        finally:
            with self._cv:
                self._filling[row] = -1
                if done:
                    self._holder[row] = e
                    self._readers[row] += 1
                self._cv.notify_all()
        return tensors

    def row_of(self, layer: int, index: int) -> int | None:
        """The row the RAM tier assigned to the expert, if any (the `cpu` miss mode computes from
        it, through `acquire`/`release`; no cache event: host computation neither admits nor
        refreshes an expert)."""
        return self.cache.slot(layer * self.experts + index)

    def release(self, row: int, event: Any = None) -> None:
        with self._cv:
            self._readers[row] -= 1
            if event is not None:  # keep the copies still running, and this one
                self._copies[row] = [ev for ev in self._copies[row] if not ev.query()] + [event]
            self._cv.notify_all()
