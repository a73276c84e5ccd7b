"""Whether a what-if fits the box it names, checked before anything runs.

A simulation of memory the box does not have answers a question nobody asked: a cache larger
than the GPUs hold beside the dense weights, more devices than the profile has, or every expert
in a host RAM too small for them. These are refused in one line unless the user says they mean
it (`--allow-overcommit`), and so is a KV cache of the served context and concurrency that
does not fit beside the dense part and the expert slots; experts that do not fit the host RAM
budget (the RAM less the profile's reserve for the OS and runtime) get, by default, a RAM tier of
the whole budget over the profile's storage (and the run says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from casmoe.cache import Capacity
from casmoe.errors import CasmoeError
from casmoe.geometry import split_layers
from casmoe.sim.box.hardware import GIB, HardwareProfile

if TYPE_CHECKING:
    from casmoe.sim.cost.machine import Machine

OVERCOMMIT = "--allow-overcommit"
MORE_GPUS = "more GPUs (--devices up to the profile's count, --gpus N beyond it)"
"""The remedy of a box that holds too little: on a one-GPU box `--devices` has nowhere to go, and
`--gpus N` (a variant of the profile) adds GPUs of its kind."""


class FitError(CasmoeError, ValueError):
    """A capacity, device count or RAM the profile does not have."""


def check_devices(hw: HardwareProfile, devices: int, overcommit: bool) -> None:
    if hw.host_only:  # the host is the one device of a box without a GPU
        if devices != 1:
            raise FitError(f"--devices {devices}, but profile {hw.name!r} has no GPU: its host computes every layer "
                           "(leave --devices out, or give --gpus N for a what-if with N GPUs)")
        return
    if devices > hw.gpus and not overcommit:
        raise FitError(
            f"--devices {devices}, but profile {hw.name!r} has {hw.gpus} GPU{'s' * (hw.gpus > 1)}; use at most "
            f"{hw.gpus}, --gpus {devices} (the profile with {devices} GPUs of its kind), or {OVERCOMMIT} for a what-if of GPUs it lacks"
        )


def check_capacity(capacity: Capacity, fit: int, pool_fit: int, experts: int, layers: int, label: str, where: str,
                   overcommit: bool) -> str | None:
    """Refuse (or, overcommitted, note) a cache the GPUs cannot hold beside the dense weights:
    more slots per layer than `fit`, or a pool of more whole experts than `pool_fit`; a cache of
    every expert or more holds no more than all. The refusal names the largest that fits. A box
    without a GPU holds none: its host computes every expert (`where` names it)."""
    if fit == pool_fit == 0 and where.endswith("(no GPU)"):
        if capacity.slots == 0 and not capacity.per_layer:
            return None
        raise FitError(f"{where} has no GPU to hold an expert cache: its host computes every expert; run a placement "
                       "(n-cpu-moe, ktransformers) with --global-capacity 0")
    if capacity.per_layer:
        have, most = min(capacity.slots, experts), fit
        text = f"capacity {label} is {have:g} experts per layer, but {where} holds {most} beside the dense weights"
        fits = f"--capacity {most}" if most else f"--global-capacity {pool_fit}" if pool_fit else ""
    else:
        have, most = min(capacity.slots, experts * layers), pool_fit
        text = f"capacity {label} is {have:g} experts, but {where} holds {most} whole experts beside the dense weights"
        fits = f"--global-capacity {most}" if most else ""
    if have <= most:
        return None
    if not overcommit:
        works = f"give {fits} or less" if fits else "no expert fits beside the dense weights"
        raise FitError(f"{text}; {works}, a smaller --quant, {MORE_GPUS}, or {OVERCOMMIT} for a what-if")
    return f"note: {text}; simulated anyway ({OVERCOMMIT})"


@dataclass(frozen=True)
class HostDemand:
    """What a run keeps in host RAM: the experts the host holds (every expert, less those a
    placement keeps on the GPUs for good: llama.cpp and KTransformers load a GPU tensor into
    VRAM and leave no host copy in use), what the engine keeps there besides (llama.cpp's token
    embedding table, `casmoe.engine_memory`), and, on a box without a GPU, the rest of the model
    (dense part, embeddings, head) and the KV cache."""

    experts: float
    other: float
    held_on_gpus: int  # experts a placement keeps on the GPUs

    @classmethod
    def of(cls, machine: Machine, expert_bytes: Sequence[int], held_on_gpus: int = 0, kv: float = 0.0) -> HostDemand:
        g = machine.preset.geometry
        held = min(held_on_gpus, g.total_experts)
        experts = sum(expert_bytes) * g.experts * (1 - held / g.total_experts)
        if machine.hardware.host_only:
            other = machine.host_weight_bytes() + kv
        else:  # what the engine keeps on the host besides experts (llama.cpp's token embedding table)
            other = machine.table_bytes() if machine.memory.table_on_host else 0.0
        return cls(experts, other, held)

    def shortfall(self, machine: Machine) -> str | None:
        """Why this does not fit the profile's host RAM budget (its RAM less what it keeps for
        the OS and the runtime, `HardwareProfile.host_ram_bytes`), or None when it fits or the
        profile does not say how much RAM it has."""
        hw, budget = machine.hardware, machine.hardware.host_ram_bytes()
        if not budget or self.experts + self.other <= budget:
            return None
        what = f"the experts of {machine.preset.name}" + (f" the GPUs do not hold ({self.held_on_gpus} do)"
                                                          if self.held_on_gpus else "")
        if self.other:
            what += (f" and the rest of the model with its KV cache ({self.other / 1e9:.4g} GB)" if machine.hardware.host_only
                     else f" and the {self.other / 1e9:.4g} GB the engine keeps beside them")
        return (f"{what} ({(self.experts + self.other) / 1e9:.4g} GB) do not fit the {budget / GIB:g} GiB of host "
                f"RAM of {hw.name!r} left beside the {hw.host_reserved_gib:g} GiB kept for the OS and the runtime")


def default_host_cache(machine: Machine, demand: HostDemand, overcommit: bool) -> tuple[str | None, str | None]:
    """(--host-cache text, note) when the host RAM budget cannot hold `demand`: a RAM tier of the
    budget left beside the rest of the model over the profile's storage, through which every
    expert reaches the GPUs or the host's own compute (what llama.cpp's default mmap does: the
    kernel's page cache keeps what fits and reads the rest from the drive); (None, None) when it
    fits. Refused when the profile has no storage to hold the rest, or no RAM is left for a tier."""
    what = None if overcommit else demand.shortfall(machine)
    if what is None:
        return None, None
    hw = machine.hardware
    if hw.storage_read_gbs <= 0:
        raise FitError(f"{what}, and the profile has no storage tier (storage_read_gbs); add one, use a smaller "
                       f"--quant, or {OVERCOMMIT} to keep them all in RAM anyway")
    left = (hw.host_ram_bytes() - demand.other) / GIB
    if left <= 0:
        raise FitError(f"{what}: nothing is left for experts beside the rest of the model; use a smaller --quant, "
                       f"more --host-ram, or {OVERCOMMIT} for a what-if")
    return f"{left:.4g}GiB", (f"note: {what}: a RAM tier of the {left:.4g} GiB left for experts over its storage, "
                              "read at storage's price by the GPUs and by host-computed experts alike, as the page "
                              f"cache of a memory-mapped model is (--host-cache to size it, {OVERCOMMIT} for every "
                              "expert in RAM)")


def check_kv(machine: Machine, expert_bytes: Sequence[int], capacity: Capacity, label: str, context: int,
             sequences: int, flag: str, where: str, overcommit: bool) -> str | None:
    """Refuse (or, overcommitted, note) a KV cache of `sequences` sequences of `context` tokens
    that a GPU cannot hold beside its dense weights and its share of the expert cache
    `capacity`: a server that admits that many requests at that context would run out of
    memory, however fast it would be. The refusal names configurations that fit at this box:
    the longest context at this cache and concurrency, the largest cache at this context and
    concurrency, and the most concurrent sequences (`flag`: --batch, --max-batch or --users).
    A box without a GPU keeps its KV cache in host RAM (`HostDemand`), not here."""
    if machine.hardware.host_only:
        return None
    g = machine.preset.geometry
    ranges = split_layers(g.layers, machine.devices)
    free = [machine.free_bytes(d, layers) for d, layers in enumerate(ranges)]
    slots = machine.slot_bytes(expert_bytes, capacity)

    def fits(ctx: int, seqs: int, cache: list[float] = slots) -> bool:
        return all(s + kv <= f for s, kv, f in zip(cache, machine.kv_bytes(ctx, seqs), free))

    def most(top: int, ok: Callable[[int], bool]) -> int:
        """The largest n in [0, top] with ok(n) (ok holds for all below it), by bisection."""
        lo, hi = 0, top
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    if fits(context, sequences):
        return None
    kv = machine.kv_bytes(context, sequences)
    worst = max(range(len(ranges)), key=lambda d: slots[d] + kv[d] - free[d])
    text = (f"the KV cache of {sequences} sequence{'s' * (sequences > 1)} of {context} tokens ({sum(kv) / 1e9:.3g} GB) "
            f"does not fit beside capacity {label} on {where} (GPU {worst}: {max(free[worst], 0) / 1e9:.3g} GB beside "
            f"the dense weights, {slots[worst] / 1e9:.3g} GB of expert slots, {kv[worst] / 1e9:.3g} GB of KV)")
    if overcommit:
        return f"note: {text}; simulated anyway ({OVERCOMMIT})"
    shorter = most(context, lambda c: fits(c, sequences))
    fewer = most(sequences, lambda n: fits(context, n))
    top = capacity.clamped(g).slots
    smaller = most(top, lambda n: fits(context, sequences,
                                       machine.slot_bytes(expert_bytes, Capacity(n, capacity.per_layer))))
    works = [f"--context {shorter}" if shorter else "",
             f"{'--capacity' if capacity.per_layer else '--global-capacity'} {smaller}" if smaller else "",
             f"{flag} {fewer}" if fewer else ""]
    fix = " or ".join(w for w in works if w)
    raise FitError(f"{text}; give {fix + ' (or less)' if fix else MORE_GPUS + ' or a bigger GPU'}, or "
                   f"{OVERCOMMIT} for a what-if")
