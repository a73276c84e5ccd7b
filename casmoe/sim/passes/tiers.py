"""The tiers under the GPU slot pool: a host RAM tier over the storage drive (`--host-cache`).

Without a RAM tier every expert sits in (pinned) host memory, as before. With one, the
checkpoint stays on the drive and a cache of `--host-cache` bytes in RAM holds the experts the
GPUs loaded most recently, managed by a policy object (LRU by default: the same `ExpertCache`
classes as the GPU pool, one global pool over all layers). Every GPU load asks the tier for its
expert first:

- in RAM: the copy to the GPU starts as soon as the link is free;
- not in RAM: the tier admits it (evicting by its policy) and the drive reads it in chunks of
  `chunk_bytes` (pinned staging buffers) back to back; the link copies each chunk once it is
  read and the previous chunk's copy is done. An unloaded two-tier miss of one chunk therefore
  costs exactly storage latency + read + copy latency + copy; of n chunks, the read plus one
  chunk's copy when the drive is the slower stage (the copies hide behind the reads).

Experts computed on the host (placements such as n-cpu-moe and ktransformers, the cpu miss
mode) read the same RAM: one the tier does not hold is read from storage before the host can
compute it (`HostTier.host_ready`), at storage's price, and takes a place in the tier.

The drive is one FIFO (`Storage`, a free-at time shared by every GPU's link): reads are served
in the order the loads were issued, demand and prefetch alike. The tier's decisions depend only
on the order of GPU loads, never on time, like every cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from casmoe.cache import Capacity, ExpertCache
from casmoe.errors import CasmoeError
from casmoe.geometry import ExpertId, Geometry
from casmoe.options import CapacitySpec

if TYPE_CHECKING:
    from casmoe.sim.box.hardware import HardwareProfile

Chunks = Sequence[tuple[float, int]]
"""(time the chunk is in RAM, bytes) of one expert read from storage, in order."""


class Storage:
    """The drive: reads of `rate` bytes/s after `latency` seconds, one at a time."""

    def __init__(self, rate: float, latency: float, chunk_bytes: int) -> None:
        self.rate = rate
        self.latency = latency
        self.chunk_bytes = chunk_bytes
        self.free_at = 0.0
        self.busy = 0.0
        self.bytes = 0

    def read(self, now: float, nbytes: int) -> list[tuple[float, int]]:
        """Read `nbytes` issued at `now`: when each chunk is in RAM."""
        t = (self.free_at if self.free_at > now else now) + self.latency
        start = t
        chunks = []
        left = nbytes
        while left > 0:
            size = min(self.chunk_bytes, left)
            t += size / self.rate
            chunks.append((t, size))
            left -= size
        self.busy += t - start + self.latency
        self.free_at = t
        self.bytes += nbytes
        return chunks


class HostTier:
    """Pinned host RAM holding a policy-chosen subset of the experts, over a `Storage`."""

    def __init__(self, cache: ExpertCache, storage: Storage, expert_bytes: Sequence[int]) -> None:
        self.cache = cache
        self.storage = storage
        self.expert_bytes = list(expert_bytes)  # per layer
        self._E = cache.geometry.experts
        self.host_reads = 0  # host-computed experts read from storage (the rest of the misses: GPU loads)

    def begin_request(self, now: float, request: Any) -> None:
        """A request starts: the tier's policy may prefetch at request start (static, casmoe);
        those experts are read from storage into RAM now, as the backend's tier does."""
        cache = self.cache
        for ld in cache.begin_request(request):
            self.storage.read(now, self.expert_bytes[ld.expert // self._E])
            cache.arrived(ld.expert)

    def end_request(self) -> None:
        self.cache.end_request()

    def fetch(self, now: float, expert: ExpertId, nbytes: int) -> Chunks | None:
        """A GPU load of `expert` (a flat id of the whole model) issued at `now`: None when it
        is in RAM, else the chunks of its read from storage (the tier keeps it from now on)."""
        cache = self.cache
        acc = cache.route(0, expert // self._E, (expert,))
        for ld in acc.loads:
            cache.arrived(ld.expert)
        if not acc.misses:
            return None
        return self.storage.read(now, nbytes)


    def host_ready(self, now: float, experts: Sequence[ExpertId], nbytes: int) -> float:
        """When every one of `experts` (flat ids of the whole model, each of `nbytes`), chosen
        at `now` to be computed on the host, is in RAM: `now` for those the tier holds, else the
        end of their storage reads (issued at `now`, one after another on the drive). A
        host-computed expert reads host RAM like a GPU copy does, so it takes a place in the
        tier by the same policy."""
        ready = now
        for e in experts:
            chunks = self.fetch(now, e, nbytes)
            if chunks is not None:
                self.host_reads += 1
                if chunks[-1][0] > ready:
                    ready = chunks[-1][0]
        return ready


class TierError(CasmoeError, ValueError):
    """A RAM tier that cannot be modelled (no storage numbers, larger than RAM, below top-k)."""


def host_cache_text(text: str) -> None:
    """`--host-cache` as written, checked before any work: memory (40GB), experts (60) or none."""
    if text.strip().lower() == "none":
        return
    try:
        CapacitySpec(text, per_layer=False)
    except CasmoeError:
        raise TierError(f"bad --host-cache {text!r}; give memory (40GB, 512MiB), a number of experts (60) or none "
                        "(every expert in RAM)") from None


@dataclass(frozen=True)
class HostCache:
    """`--host-cache`: `rows` experts of host RAM (one pool for all layers), managed by `policy`
    (with `options`), and the size of the staging chunks a storage read is copied in. The
    semantics are the backend's RAM tier's (casmoe/backends/hostcache.py): one access per GPU load (and
    per expert computed on the host, which the backend's tier does not model yet), in issue
    order; requests bracketed by `begin_request` / `end_request`, whose request-start prefetches
    (static, casmoe) are read into RAM; per-layer prefetch hooks never called; oracles
    refused (the tier's future is the GPUs' load sequence, which no trace holds)."""

    rows: int
    policy: type[ExpertCache]
    options: tuple[tuple[str, Any], ...] = ()
    chunk_bytes: int = 16 * 2**20

    @classmethod
    def parse(cls, size: str, policy: str, expert_bytes: Sequence[int]) -> HostCache:
        """From the command line: `size` in memory (40GB) or experts, `policy` a spec (lru)."""
        from casmoe.policies import PolicySpec

        spec = PolicySpec.parse(policy)
        rows = CapacitySpec(size, per_layer=False).resolve(expert_bytes).slots
        return cls(rows, spec.check(), tuple(spec.options))  # options it takes, none the runtime sets

    def nbytes(self, expert_bytes: Sequence[int]) -> float:
        return self.rows * sum(expert_bytes) / len(expert_bytes)

    def build(self, geometry: Geometry, expert_bytes: Sequence[int], hardware: HardwareProfile,
              trace: Any = None) -> HostTier:
        """The tier for a run (`trace` for policies that rank experts from it, like static)."""
        hw = hardware
        if hw.storage_read_gbs <= 0:
            raise TierError(f"profile {hw.name!r} has no storage tier (storage_read_gbs); add it to use --host-cache")
        size = self.nbytes(expert_bytes)
        budget = hw.host_ram_bytes()
        if budget and size > budget:
            raise TierError(
                f"--host-cache of {size / 1e9:.4g} GB exceeds the {budget / 2**30:g} GiB of host RAM of {hw.name!r} "
                f"left beside the {hw.host_reserved_gib:g} GiB it keeps for the OS and the runtime; give "
                f"--host-cache {budget / 2**30:g}GiB or less"
            )
        if self.policy.needs_future:
            raise TierError(f"--host-policy {self.policy.name!r} reads the future; the RAM tier takes a causal policy (lru, lfu, ...)")
        if self.rows < geometry.top_k:
            raise TierError(
                f"--host-cache holds {self.rows} experts, fewer than the {geometry.top_k} a token routes to per layer; "
                "give more memory or leave the RAM tier out"
            )
        cache = self.policy.create(geometry, Capacity(self.rows, per_layer=False), expert_bytes=expert_bytes,
                                   trace=trace, **dict(self.options))
        if cache.needs_future:
            raise TierError(f"--host-policy {self.policy.name!r} reads the future; the RAM tier takes a causal policy")
        if cache.host_experts or cache.decides_host:
            raise TierError(f"--host-policy {self.policy.name!r} is a placement of GPU and host experts (or computes "
                            "misses on the host), not a RAM-tier policy; the RAM tier takes a caching policy "
                            "(lru, lfu, ...)")
        storage = Storage(hw.storage_read_gbs * 1e9, hw.storage_latency_us * 1e-6, self.chunk_bytes)
        return HostTier(cache, storage, expert_bytes)
