"""One host-to-device link: a FIFO of copies where demand loads jump ahead of queued prefetches.

The link is a *free-at* time, not a SimPy Resource: a copy committed to the wire gets its start
(`busy_until` or now) and end (start + copy latency + bytes / bandwidth) at once, so the
simulator spends no events on it. Prefetches wait in a queue and are committed lazily, in FIFO
order, as simulated time passes their start (`_advance`); a demand load commits at once, ahead
of every prefetch that has not started, which thereby starts later. A copy already on the wire
is never pre-empted.

Loads are tagged with a token: when the cache evicts an expert whose load is still queued the
load is cancelled (its bytes never move); when it is already on the wire it completes but its
arrival is ignored, and a new load of the same expert queues behind it.

`HostCap` models one root complex or socket feeding several links: a serial pipe every copy
also passes through. It is an approximation (copies share it in commit order rather than
fluidly), exact for one link and never exceeding the cap in aggregate.

With a host RAM tier (`tiers.HostTier`, `--host-cache`), a load of an expert that is not in RAM
first reads it from storage in chunks; the copy of each chunk starts once the chunk is read and
the previous chunk's copy is done (a two-stage pipeline through pinned staging buffers), so the
load holds the wire from its first chunk's arrival in RAM to its last chunk's copy.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Callable

from casmoe.geometry import ExpertId
from casmoe.sim.passes.tiers import Chunks, HostTier
from casmoe.sim.passes.timeline import Timeline


class HostCap:
    """A host-side bandwidth cap (bytes/s) shared by the links that reference it."""

    __slots__ = ("rate", "free_at")

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0


class Link:
    """Host-to-device copies of one device; times in seconds, sizes in bytes."""

    __slots__ = (
        "rate",
        "latency",
        "host",
        "timeline",
        "device",
        "id_offset",
        "busy_until",
        "busy",
        "bytes",
        "cancelled",
        "queue",
        "_pending",
        "_arrival",
        "tokens",
        "heap",
        "_seq",
        "tier",
        "storage_loads",
        "last_from_storage",
    )

    def __init__(
        self,
        rate: float,
        latency: float,
        host: HostCap | None = None,
        timeline: Timeline | None = None,
        device: int = 0,
        id_offset: int = 0,
        tier: HostTier | None = None,
    ) -> None:
        self.rate = rate
        self.latency = latency
        self.host = host
        self.timeline = timeline
        self.device = device
        self.id_offset = id_offset  # added to expert ids for the timeline (a cache of a sub-model)
        self.busy_until = 0.0
        self.busy = 0.0  # seconds the wire was occupied
        self.bytes = 0  # bytes actually moved (cancelled loads move none)
        self.cancelled = 0
        # Public for the engine's fast path: nothing to land unless a prefetch is queued or the
        # earliest arrival is due.
        self.queue: deque[list] = deque()  # prefetches not started: [expert, nbytes, token, enqueued, alive]
        self._pending: dict[ExpertId, list] = {}
        self._arrival: dict[ExpertId, float] = {}  # committed, not yet delivered
        self.tokens: dict[ExpertId, int] = {}
        """Every tracked load in flight (queued or committed, not landed): the experts a layer
        that routes them must wait for (late hits)."""
        self.heap: list[tuple[float, int, ExpertId]] = []  # (arrival, token, expert)
        self._seq = 0
        self.tier = tier
        self.storage_loads = 0
        self.last_from_storage = False  # the last demand load read its expert from storage

    def prefetch(self, now: float, expert: ExpertId, nbytes: int) -> None:
        """Queue a prefetch behind every earlier copy (its storage read, if any, starts now)."""
        if expert in self.tokens:  # a copy still tracked: `supersede`
            self.supersede(now, expert)
        self._seq += 1
        chunks = None if self.tier is None else self._source(now, expert, nbytes)
        entry = [expert, nbytes, self._seq, now if chunks is None else max(now, chunks[0][0]), True, chunks]
        self.queue.append(entry)
        self._pending[expert] = entry
        self.tokens[expert] = self._seq

    def demand(self, now: float, expert: ExpertId, nbytes: int) -> float:
        """Commit a demand load ahead of queued prefetches; returns its arrival time.

        The caller waits for it before its next cache event, so it reports the arrival itself:
        the link does not track it (no token, no heap entry: the hot path stays short)."""
        if self.queue:
            self._advance(now)
        start = self.busy_until if self.busy_until > now else now
        if self.tier is None:
            return self._wire(expert, nbytes, start, True)
        chunks = self._source(now, expert, nbytes)
        self.last_from_storage = chunks is not None
        return self._wire(expert, nbytes, start, True, chunks)

    def need(self, now: float, expert: ExpertId) -> float:
        """Arrival time of an in-flight `expert` that a layer needs now; a still-queued
        prefetch of it is promoted to demand priority."""
        if self.queue:
            self._advance(now)
        entry = self._pending.pop(expert, None)
        if entry is None:
            return self._arrival[expert]
        entry[4] = False
        start = max(self.busy_until, now, entry[3])
        return self._commit(expert, entry[1], entry[2], start, True, entry[5])

    def supersede(self, now: float, expert: ExpertId) -> None:
        """A new copy of `expert` is about to be issued: drop the tracked one. The cache let go of
        it without a cancel (a staging slot's trim evicts what the policy chooses, in flight or
        not, and those evictions carry no `Load`), so the link holds one live copy per expert."""
        self.cancel(now, expert)

    def cancel(self, now: float, expert: ExpertId) -> None:
        """`expert` lost its slot: drop its queued load, or ignore its arrival if on the wire."""
        if self.tokens.pop(expert, None) is None:
            return
        if self.queue:
            self._advance(now)
        entry = self._pending.pop(expert, None)
        if entry is not None:
            entry[4] = False
            self.cancelled += 1
        self._arrival.pop(expert, None)

    def land(self, now: float, arrived: Callable[[ExpertId], None]) -> None:
        """Report every load that has arrived by `now`, in arrival order."""
        if self.queue:
            self._advance(now)
        heap = self.heap
        token = self.tokens
        while heap and heap[0][0] <= now:
            _, tok, expert = heappop(heap)
            if token.get(expert) == tok:
                del token[expert]
                del self._arrival[expert]
                arrived(expert)

    def _advance(self, now: float) -> None:
        """Commit, in FIFO order, the queued prefetches that started before `now`."""
        queue = self.queue
        while queue:
            entry = queue[0]
            if not entry[4]:
                queue.popleft()
                continue
            start = self.busy_until if self.busy_until > entry[3] else entry[3]
            if start >= now:
                return
            queue.popleft()
            del self._pending[entry[0]]
            self._commit(entry[0], entry[1], entry[2], start, False, entry[5])

    def _commit(
        self, expert: ExpertId, nbytes: int, token: int, start: float, demand: bool, chunks: Chunks | None = None
    ) -> float:
        """Put a tracked load on the wire: its arrival is reported by `land`."""
        end = self._wire(expert, nbytes, start, demand, chunks)
        self._arrival[expert] = end
        heappush(self.heap, (end, token, expert))
        return end

    def _wire(self, expert: ExpertId, nbytes: int, start: float, demand: bool, chunks: Chunks | None = None) -> float:
        """Occupy the wire (and the host cap) from `start`; returns the end. `chunks` (ready
        time, bytes) of a load read from storage are copied one by one as they arrive in RAM."""
        if chunks is None:
            end = start + self.latency + nbytes / self.rate
        else:
            end = start
            for ready, size in chunks:
                end = (ready if ready > end else end) + self.latency + size / self.rate
        host = self.host
        if host is not None:
            through = (host.free_at if host.free_at > start else start) + nbytes / host.rate
            host.free_at = through
            if through > end:
                end = through
        self.busy_until = end
        self.busy += end - start
        self.bytes += nbytes
        if self.timeline is not None:
            self.timeline.copy(self.device, start, end, expert + self.id_offset, demand)
        return end

    def _source(self, now: float, expert: ExpertId, nbytes: int) -> Chunks | None:
        """Where a load's bytes come from: None from RAM, else the chunks of its storage read."""
        chunks = self.tier.fetch(now, expert + self.id_offset, nbytes)  # type: ignore[union-attr]
        if chunks is not None:
            self.storage_loads += 1
        return chunks
