"""One what-if question, decided before anything runs: a trace served by a model preset on a
hardware profile, several policies at several cache sizes, as sweep `Point`s.

The decisions `casmoe simulate` makes for a user who gives no options live here, not in the
CLI: the preset that matches the trace, how many requests of the shipped trace to run, and
which cache sizes to try (top_k up to what the GPUs hold beside the dense weights).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from casmoe.cache import MissMode
from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, parse_miss_mode, parse_quant
from casmoe.policies import PolicySpec
from casmoe.presets import ModelPreset, get_preset
from casmoe.sim.assembly import check_geometry, expert_bytes_for, max_slots
from casmoe.sim.hardware import HardwareProfile, load_profile
from casmoe.sim.serving import Workload
from casmoe.selection import Scored, Selection
from casmoe.sim.fits import check_capacity, check_devices, default_host_cache
from casmoe.sim.sweep import Point, file_digest, input_digest, preset_for
from casmoe.sim.tiers import HostCache
from casmoe.trace import Trace
from casmoe.trace_io import load_trace

SHIPPED_REQUESTS = 12
"""Requests of the shipped trace that `casmoe simulate` runs by default (a few seconds)."""


@dataclass(frozen=True)
class WhatIf:
    trace: Trace  # the requests that run
    scored: Scored  # which requests of the file, and why
    path: Path
    preset: ModelPreset
    hardware: HardwareProfile
    devices: int
    fit: int  # experts per layer the GPUs hold beside the dense weights
    points: list[Point]
    notes: list[str]  # what the user should know before reading the results

    @property
    def total_requests(self) -> int:
        return self.scored.total

    def describe(self) -> str:
        return (
            f"{self.path.name}: {self.scored.describe()}, {self.trace.tokens} tokens, model {self.preset.name} on "
            f"{self.box()}; up to {self.fit} experts per layer fit in GPU memory"
        )

    def box(self) -> str:
        """'rtx4090x4 (4 GPUs)', or 'rtx4090x4, 2 of its 4 GPUs'."""
        hw = self.hardware
        if self.devices == hw.gpus:
            return f"{hw.name} ({hw.gpus} GPU{'s' * (hw.gpus > 1)})"
        return f"{hw.name}, {self.devices} of its {hw.gpus} GPU{'s' * (hw.gpus > 1)}"


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
    selection: Selection | None = None,
    workload: Workload | None = None,
    host_cache: str | None = None,
    host_policy: str = "lru",
    overcommit: bool = False,
    gating: float | None = None,
) -> WhatIf:
    """Check everything and build the points; `requests` None means all, or the first
    `SHIPPED_REQUESTS` of the `shipped` default trace, of the requests `selection` scores
    (`casmoe.selection`: by default the ones no fitted policy saw). `workload` serves requests
    as they arrive; `host_cache` adds a RAM tier over the profile's storage; `gating` runs
    AdapMoE's adaptive gating at that threshold (`casmoe.gating`, lossy). Capacities and
    devices the box lacks are refused unless `overcommit` (`sim/fits.py`)."""
    from casmoe.gating import check_threshold

    gating = None if gating is None else check_threshold(gating)
    whole = load_trace(path)
    if requests is None:
        requests = SHIPPED_REQUESTS if shipped else 0
    selection = replace(selection or Selection(), limit=requests)
    scored = selection.resolve(whole, policies)
    tr = scored.pick(whole)
    preset = get_preset(preset_for(whole, model))
    check_geometry(whole.geometry, preset)
    hw = load_profile(hardware)
    n_dev = devices or hw.gpus
    check_devices(hw, n_dev, overcommit)
    miss_mode = parse_miss_mode(miss_mode).value  # " LOAD" and "load" are one point (one key)
    if miss_mode == MissMode.CPU.value:
        hw.check_host_compute(hardware)
    nbytes = expert_bytes_for(whole, preset, parse_quant(quant))
    if workload is not None and batch != 1:
        raise CasmoeError("--batch makes static batches of back-to-back requests; with --arrival or --users use --max-batch")
    if workload is not None:
        workload.arrival_times(tr.requests)  # --arrival trace on a trace without times fails here
    notes = [] if gating is None else [
        f"adaptive gating: a token whose top router weight is >= {gating:g} of its top-k weights runs that expert alone "
        "(lossy; its quality: casmoe bench --adaptive-gating)"
    ]
    if host_cache is None:
        host_cache, note = default_host_cache(hw, nbytes, whole.geometry.experts, preset, overcommit)
        notes += [note] if note else []
    if host_cache is not None:  # a RAM tier that cannot work fails here, before any run
        HostCache.parse(host_cache, host_policy, nbytes).build(whole.geometry, nbytes, hw, whole)
    fit = max_slots(hw, preset, nbytes, n_dev)
    where = f"{hw.name} x{n_dev}" if n_dev != hw.gpus else hw.name
    g = whole.geometry
    for c in capacities:
        note = check_capacity(c.resolve(nbytes), fit, g.experts, g.layers, c.label, where, overcommit)
        notes += [note] if note else []
    caps = capacities or default_capacities(fit, g.top_k, where)
    digest = file_digest(path)
    inputs = {p: input_digest(hardware, preset.name, p) for p in policies}
    points = [
        Point(str(path), preset.name, hardware, p, c, batch, miss_mode, n_dev, quant or "", pinned,
              () if scored.everything else scored.indices, digest, workload=workload, host_cache=host_cache or "",
              host_policy=host_policy, inputs=inputs[p], fitted=p.label in scored.starred,
              scored=scored.describe(), overcommit=overcommit, gating=gating)
        for c in caps
        for p in policies
    ]
    return WhatIf(tr, scored, Path(path), preset, hw, n_dev, fit, points, notes)
