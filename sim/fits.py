"""Whether a what-if fits the box it names, checked before anything runs.

A simulation of memory the box does not have answers a question nobody asked: a cache larger
than the GPUs hold beside the dense weights, more devices than the profile has, or every expert
in a host RAM too small for them. These are refused in one line unless the user says they mean
it (`--allow-overcommit`); experts that do not fit the host RAM get, by default, a RAM tier of
the whole host RAM over the profile's storage (and the run says so).
"""

from __future__ import annotations

from typing import Sequence

from casmoe.cache import Capacity
from casmoe.errors import CasmoeError
from casmoe.presets import ModelPreset
from casmoe.sim.hardware import GIB, HardwareProfile

OVERCOMMIT = "--allow-overcommit"


class FitError(CasmoeError, ValueError):
    """A capacity, device count or RAM the profile does not have."""


def check_devices(hw: HardwareProfile, devices: int, overcommit: bool) -> None:
    if devices > hw.gpus and not overcommit:
        raise FitError(
            f"--devices {devices}, but profile {hw.name!r} has {hw.gpus} GPU{'s' * (hw.gpus > 1)}; use at most "
            f"{hw.gpus}, a profile with more GPUs, or {OVERCOMMIT} for a what-if of GPUs it lacks"
        )


def check_capacity(capacity: Capacity, fit: int, experts: int, layers: int, label: str, where: str,
                   overcommit: bool) -> str | None:
    """Refuse (or, overcommitted, note) a cache of more slots per layer than `fit`, the most the
    GPUs hold beside the dense weights; a cache of every expert or more holds no more than all."""
    per_layer = min(capacity.slots, experts) if capacity.per_layer else min(capacity.slots, experts * layers) / layers
    if per_layer <= fit:
        return None
    text = (f"capacity {label} is {per_layer:g} experts per layer, but {where} holds {fit} beside the dense "
            "weights")
    if not overcommit:
        raise FitError(f"{text}; give a smaller --capacity, more --devices or a smaller --quant, or {OVERCOMMIT}")
    return f"note: {text}; simulated anyway ({OVERCOMMIT})"


def default_host_cache(hw: HardwareProfile, expert_bytes: Sequence[int], experts: int, preset: ModelPreset,
                       overcommit: bool) -> tuple[str | None, str | None]:
    """(--host-cache text, note) when the experts do not fit the profile's host RAM: a RAM tier
    of all of it over the profile's storage; (None, None) when they fit or the profile does not
    say how much RAM it has. Refused when the profile has no storage to hold the rest."""
    total = sum(expert_bytes) * experts
    ram = hw.host_ram_gib * GIB
    if not ram or total <= ram or overcommit:
        return None, None
    what = (f"the experts of {preset.name} ({total / 1e9:.4g} GB) do not fit the {hw.host_ram_gib:g} GiB of host "
            f"RAM of {hw.name!r}")
    if hw.storage_read_gbs <= 0:
        raise FitError(f"{what}, and the profile has no storage tier (storage_read_gbs); add one, use a smaller "
                       f"--quant, or {OVERCOMMIT} to keep them all in RAM anyway")
    return f"{hw.host_ram_gib:g}GiB", (f"note: {what}: a RAM tier of all {hw.host_ram_gib:g} GiB over its storage "
                                       "(--host-cache to size it, --allow-overcommit for every expert in RAM)")

