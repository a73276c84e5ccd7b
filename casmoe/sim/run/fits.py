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

from typing import TYPE_CHECKING, Callable, Sequence

from casmoe.cache import Capacity
from casmoe.errors import CasmoeError
from casmoe.geometry import split_layers
from casmoe.presets import ModelPreset
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
    if devices > hw.gpus and not overcommit:
        raise FitError(
            f"--devices {devices}, but profile {hw.name!r} has {hw.gpus} GPU{'s' * (hw.gpus > 1)}; use at most "
            f"{hw.gpus}, --gpus {devices} (the profile with {devices} GPUs of its kind), or {OVERCOMMIT} for a what-if of GPUs it lacks"
        )


def check_capacity(capacity: Capacity, fit: int, pool_fit: int, experts: int, layers: int, label: str, where: str,
                   overcommit: bool) -> str | None:
    """Refuse (or, overcommitted, note) a cache the GPUs cannot hold beside the dense weights:
    more slots per layer than `fit`, or a pool of more whole experts than `pool_fit`; a cache of
    every expert or more holds no more than all. The refusal names the largest that fits."""
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


def host_ram_shortfall(hw: HardwareProfile, expert_bytes: Sequence[int], experts: int,
                       preset: ModelPreset) -> str | None:
    """Why the experts do not fit the profile's host RAM budget (its RAM less what it keeps for
    the OS and the runtime, `HardwareProfile.host_ram_bytes`), or None when they fit or the
    profile does not say how much RAM it has."""
    total = sum(expert_bytes) * experts
    budget = hw.host_ram_bytes()
    if not budget or total <= budget:
        return None
    return (f"the experts of {preset.name} ({total / 1e9:.4g} GB) do not fit the {budget / GIB:g} GiB of host RAM of "
            f"{hw.name!r} left beside the {hw.host_reserved_gib:g} GiB kept for the OS and the runtime")


def default_host_cache(hw: HardwareProfile, expert_bytes: Sequence[int], experts: int, preset: ModelPreset,
                       overcommit: bool) -> tuple[str | None, str | None]:
    """(--host-cache text, note) when the experts do not fit the host RAM budget
    (`host_ram_shortfall`): a RAM tier of the whole budget over the profile's storage, through
    which every expert reaches the GPUs or the host's own compute; (None, None) when they fit.
    Refused when the profile has no storage to hold the rest."""
    what = None if overcommit else host_ram_shortfall(hw, expert_bytes, experts, preset)
    if what is None:
        return None, None
    if hw.storage_read_gbs <= 0:
        raise FitError(f"{what}, and the profile has no storage tier (storage_read_gbs); add one, use a smaller "
                       f"--quant, or {OVERCOMMIT} to keep them all in RAM anyway")
    left = hw.host_ram_bytes() / GIB
    return f"{left:g}GiB", (f"note: {what}: a RAM tier of those {left:g} GiB over its storage, read at storage's "
                            "price by the GPUs and by host-computed experts alike (--host-cache to size it, "
                            f"{OVERCOMMIT} for every expert in RAM)")


def check_kv(machine: Machine, expert_bytes: Sequence[int], capacity: Capacity, label: str, context: int,
             sequences: int, flag: str, where: str, overcommit: bool) -> str | None:
    """Refuse (or, overcommitted, note) a KV cache of `sequences` sequences of `context` tokens
    that a GPU cannot hold beside its dense weights and its share of the expert cache
    `capacity`: a server that admits that many requests at that context would run out of
    memory, however fast it would be. The refusal names configurations that fit at this box:
    the longest context at this cache and concurrency, the largest cache at this context and
    concurrency, and the most concurrent sequences (`flag`: --batch, --max-batch or --users)."""
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
