"""One what-if question, decided before anything runs: a trace served by a model preset on a
hardware profile, several policies at several cache sizes, as sweep `Point`s.

The decisions `casmoe simulate` makes for a user who gives no options live here, not in the
CLI: the preset that matches the trace, how many requests of the shipped trace to run, and
which cache sizes to try (top_k up to what the GPUs hold beside the dense weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, parse_miss_mode, parse_quant
from casmoe.policies import PolicySpec
from casmoe.presets import ModelPreset, get_preset
from casmoe.sim.assembly import check_geometry, expert_bytes_for, max_slots
from casmoe.sim.hardware import HardwareProfile, load_profile
from casmoe.sim.serving import Workload
from casmoe.sim.sweep import Point, file_digest, preset_for
from casmoe.sim.tiers import HostCache
from casmoe.trace import Trace

SHIPPED_REQUESTS = 12
"""Requests of the shipped trace that `casmoe simulate` runs by default (a few seconds)."""


@dataclass(frozen=True)
class WhatIf:
    trace: Trace  # the requests that run
    total_requests: int  # in the trace file
    path: Path
    preset: ModelPreset
    hardware: HardwareProfile
    devices: int
    fit: int  # experts per layer the GPUs hold beside the dense weights
    points: list[Point]
    notes: list[str]  # what the user should know before reading the results

    def describe(self) -> str:
        part = self.total_requests != len(self.trace.requests)
        note = f" (first {len(self.trace.requests)} of {self.total_requests} requests; --requests 0 for all)" if part else ""
        return (
            f"{self.path.name}{note}: {self.trace.tokens} tokens, model {self.preset.name} on {self.hardware.name} "
            f"x{self.devices}; up to {self.fit} experts per layer fit in GPU memory"
        )


def default_capacities(fit: int, top_k: int, where: str) -> list[CapacitySpec]:
    """top_k, 2, 3 and 4 x top_k and the most that fits (slots per layer)."""
    if fit < top_k:
        raise CasmoeError(
            f"{where} holds {fit} experts per layer beside the dense weights, below top_k={top_k}; use more "
            "--devices, a smaller --quant, bigger hardware, or give --capacity for a what-if"
        )
    sizes = sorted({top_k, *(s for s in (2 * top_k, 3 * top_k, 4 * top_k) if s < fit), fit})
    return [CapacitySpec(str(s)) for s in sizes]


def what_if(
    path: Path,
    policies: list[PolicySpec],
    capacities: list[CapacitySpec],
    *,
    shipped: bool = False,
    model: str | None = None,
    hardware: str = "rtx4090x4",
    batch: int = 1,
    miss_mode: str = "load",
    quant: str | None = None,
    devices: int = 0,
    pinned: bool = True,
    requests: int | None = None,
    workload: Workload | None = None,
    host_cache: str | None = None,
    host_policy: str = "lru",
) -> WhatIf:
    """Check everything and build the points; `requests` None means all, or the first
    `SHIPPED_REQUESTS` of the `shipped` default trace. `workload` serves requests as they
    arrive; `host_cache` adds a RAM tier over the profile's storage."""
    whole = Trace.load(path)
    if requests is None:
        requests = SHIPPED_REQUESTS if shipped else 0
    tr = whole.subset(range(min(requests, len(whole.requests)))) if requests else whole
    preset = get_preset(preset_for(whole, model))
    check_geometry(whole.geometry, preset)
    hw = load_profile(hardware)
    n_dev = devices or hw.gpus
    miss_mode = parse_miss_mode(miss_mode).value  # " LOAD" and "load" are one point (one key)
    nbytes = expert_bytes_for(whole, preset, parse_quant(quant))
    if workload is not None and batch != 1:
        raise CasmoeError("--batch makes static batches of back-to-back requests; with --arrival or --users use --max-batch")
    if workload is not None:
        workload.arrival_times(tr.requests)  # --arrival trace on a trace without times fails here
    if host_cache is not None:  # a RAM tier that cannot work fails here, before any run
        HostCache.parse(host_cache, host_policy, nbytes).build(whole.geometry, nbytes, hw, whole)
    fit = max_slots(hw, preset, nbytes, n_dev)
    notes = []
    for c in capacities:
        slots = c.resolve(nbytes).slots
        if (slots if c.per_layer else slots / whole.geometry.layers) > fit:
            notes.append(f"note: capacity {c.label} exceeds the {fit} experts per layer that fit in GPU memory; "
                         "simulated anyway")
    caps = capacities or default_capacities(fit, whole.geometry.top_k, f"{hw.name} x{n_dev}")
    digest = file_digest(path)
    points = [
        Point(str(path), preset.name, hardware, p, c, batch, miss_mode, n_dev, quant or "", pinned, requests, digest,
              workload=workload, host_cache=host_cache or "", host_policy=host_policy)
        for c in caps
        for p in policies
    ]
    return WhatIf(tr, len(whole.requests), Path(path), preset, hw, n_dev, fit, points, notes)
