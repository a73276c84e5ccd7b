"""The simulator: routing traces through real `ExpertCache` objects on a modelled machine.

One machine model (`Machine`: each device's link and compute, the caches, the timing pass of
`timing.py`) and two drivers:

- offline (`workload=None`): the requests one after another, or in static batches of `batch`
  whose decode tokens share steps. The step sequence is known in advance, so the run is a
  decision pass (`decide.py`: the cache events in replay's order) followed by a timing pass
  over what they returned, chunk by chunk: no SimPy event at all. The clock advances as SimPy's
  does (`now + (t - now)` per step), so this path and the serving driver with one user and no
  think time agree to the last bit.
- serving (`workload`: Poisson or recorded arrivals, or a closed loop of users): SimPy
  processes for the requests, the scheduler (continuous batching up to `max_batch`) and the
  devices (`serving.py`).

Event order is replay's (casmoe/replay.py): per request `begin_request`; per step and computed
layer `before_layer`, `route`; `end_request` after a request's last step. Because cache
decisions never depend on timing, the counts equal replay's in `load` mode, except that a hit
on an expert still on the wire is a *late* hit.

Layers are split across devices in contiguous ranges; each device has its own link and holds
the slots of its layers. With per-layer capacity one cache object serves all devices (its
pools are per layer, so each pool lives on its layer's device, and a next-layer prefetch that
crosses a device boundary goes over the next device's link). A global pool cannot span
devices: with `--global-capacity` each device gets its own cache, built on the sub-model of
its layers, with a share of the slots proportional to its layers.

With `host_cache`, experts come from a RAM tier over the storage drive (`tiers.py`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from casmoe.cache import Capacity, CacheConfigError, CacheStats, ExpertCache, MissMode
from casmoe.compiled import uses_twin
from casmoe.errors import CasmoeError
from casmoe.geometry import Quant, split_layers
from casmoe.presets import ModelPreset, load_presets
from casmoe.replay import starts_and_ends
from casmoe.sim import compiled_timing as compiled_pass
from casmoe.sim.compute import ComputeModel, RooflineCompute
from casmoe.sim.decide import CompiledDecider, Decider, StepDecisions
from casmoe.sim.hardware import HardwareProfile
from casmoe.sim.latency import LatencyLog
from casmoe.sim.link import HostCap, Link
from casmoe.sim.result import SimResult
from casmoe.sim.tiers import HostCache, HostTier, Storage
from casmoe.sim.timeline import Timeline
from casmoe.sim.timeliness import Timeliness
from casmoe.sim.timing import Shard, StepTimer, work_for
from casmoe.step_arrays import StepArrays
from casmoe.trace import Future, Step, Trace

CHUNK_STEPS = 512
"""Steps decided ahead of the timing pass at a time: bounds the memory of the record."""


class SimConfigError(CasmoeError, ValueError):
    """A simulation that cannot be set up as asked (geometry mismatch, too many devices...)."""


def check_geometry(trace: Geometry, preset: ModelPreset) -> None:
    """The trace's layers and experts must be the preset's; the error names presets that fit.

    `top_k` may differ: the trace says which experts run (an engine can force fewer than the
    model's native k, as the shared real Qwen trace does); the preset prices them."""
    g = preset.geometry
    if (trace.layers, trace.experts) == (g.layers, g.experts):
        return
    fits = [
        name
        for name, p in load_presets().items()
        if (p.geometry.layers, p.geometry.experts) == (trace.layers, trace.experts)
    ]
    hint = (
        f"pass --model {' or --model '.join(fits)}"
        if fits
        else "add a preset with that shape to casmoe/presets/models.toml, or record a trace of this model"
    )
    raise SimConfigError(
        f"trace geometry ({trace.describe()}) does not match model preset {preset.name!r} ({g.describe()}); {hint}"
    )


def expert_bytes_for(trace: Trace, preset: ModelPreset, quant: Quant | None) -> list[int]:
    """Bytes per expert per layer: measured ones from the trace unless a quant is forced or the
    trace was recorded from a stand-in of another width (the shipped tiny models route like
    Mixtral but are priced as the preset being simulated)."""
    g = trace.geometry
    if quant is None and g.layer_expert_bytes and g.hidden in (0, preset.geometry.hidden):
        if min(g.layer_expert_bytes) <= 0:
            raise SimConfigError(
                f"the trace records 0 bytes for the experts of layer {g.layer_expert_bytes.index(0)}; pass --quant "
                f"(bf16, int8, ...) to price experts from the {preset.name} preset instead"
            )
        return list(trace.geometry.layer_expert_bytes)
    return preset.geometry.bytes_per_layer(quant or Quant.BF16)


def max_slots(hardware: HardwareProfile, preset: ModelPreset, expert_bytes: Sequence[int], devices: int) -> int:
    """Most slots per layer the GPUs hold next to the dense weights (capped at all experts)."""
    g = preset.geometry
    head = 2 * preset.vocab * g.hidden * 2  # embedding + lm head, bf16
    best = g.experts
    for d, layers in enumerate(split_layers(g.layers, devices)):
        free = hardware.usable_bytes() - 2 * preset.dense_params_per_layer * len(layers)
        free -= head if d in (0, devices - 1) else 0
        per_slot = sum(expert_bytes[layer] for layer in layers)
        best = min(best, max(0, int(free // per_slot)))
    return best


def slots_for_bytes(budget: float, expert_bytes: Sequence[int]) -> int:
    """Slots per layer that `budget` bytes of expert cache (all devices together) hold."""
    return int(budget // sum(expert_bytes))


@dataclass
class StepPlan:
    """A trace cut into steps, and into one sub-model per cache (`shards`): the whole model,
    or each device's layers when every device needs its own cache (a global pool).

    Building it costs about as much as a short run, so every run over the same trace, batch
    and split shares one (`simulate(plan=...)`)."""

    trace: Trace
    batch: int
    ranges: list[range]  # layers of each device
    steps: list[Step]
    shards: list[range]  # layers of each cache
    shard_traces: list[Trace]
    shard_steps: list[list[Step]]

    _arrays: dict[int, StepArrays] = field(default_factory=dict, repr=False)

    def arrays(self, i: int) -> StepArrays:
        """Shard `i`'s steps as arrays, for compiled decision passes (built once, shared)."""
        if i not in self._arrays:
            sub = self.shard_traces[i]
            self._arrays[i] = (
                StepArrays.from_trace(sub)
                if self.batch == 1
                else StepArrays.from_steps(self.shard_steps[i], sub.geometry.layers, len(sub.requests))
            )
        return self._arrays[i]

    @classmethod
    def build(cls, trace: Trace, batch: int = 1, devices: int = 1, cache_per_device: bool = False) -> StepPlan:
        g = trace.geometry
        ranges = split_layers(g.layers, devices)
        steps = trace.steps(batch)
        if not cache_per_device or devices == 1:
            return cls(trace, batch, ranges, steps, [range(g.layers)], [trace], [steps])
        traces = [trace.layer_slice(layers) for layers in ranges]
        dsteps = [[s.layer_slice(layers, g.experts) for s in steps] for layers in ranges]
        return cls(trace, batch, ranges, steps, list(ranges), traces, dsteps)


@dataclass
class Setup:
    """Everything a run of one policy needs, resolved once; `machine()` builds fresh state
    (links, caches) for each run (oracles in serving mode may need several)."""

    trace: Trace
    policy: type[ExpertCache]
    options: Mapping[str, Any]
    capacity: Capacity
    miss_mode: MissMode
    hardware: HardwareProfile
    ranges: list[range]  # layers of each device
    shards: list[range]  # layers of each cache
    shard_traces: list[Trace]
    expert_bytes: list[int]
    compute: ComputeModel
    pinned: bool
    timeline: Timeline | None
    host_cache: HostCache | None
    detail: bool

    def machine(self, futures: Sequence[Sequence[Step]] | None) -> Machine:
        """Links, caches (attached to `futures`, one step sequence per shard, if they read the
        future) and the timing pass, at time 0."""
        g = self.trace.geometry
        hw = self.hardware
        devices = len(self.ranges)
        cache_per_device = len(self.shards) > 1
        tier = None
        if self.host_cache is not None:
            tier = self.host_cache.build(g, self.expert_bytes, hw, self.trace)
        host = HostCap(hw.host_cap_gbs * 1e9) if hw.host_cap_gbs > 0 else None
        rate = hw.h2d_gbs(self.pinned) * 1e9
        latency = hw.copy_latency_us * 1e-6
        offsets = [layers.start * g.experts if cache_per_device else 0 for layers in self.ranges]
        links = [Link(rate, latency, host, self.timeline, d, offsets[d], tier) for d in range(devices)]
        device_of = [d for d, layers in enumerate(self.ranges) for _ in layers]
        shards = []
        for i, layers in enumerate(self.shards):
            sub_trace = self.shard_traces[i]
            shard_bytes = self.expert_bytes[layers.start : layers.stop]
            cache = self.policy.create(
                sub_trace.geometry, self._share(i, layers), miss_mode=self.miss_mode, expert_bytes=shard_bytes,
                trace=sub_trace, **dict(self.options),
            )
            if cache.needs_future:
                cache.attach_future(Future(futures[i] if futures is not None else [], sub_trace.geometry))
            shards.append(
                Shard(
                    decider=Decider(cache, sub_trace.requests),
                    first=layers.start,
                    links=[links[device_of[layer]] for layer in layers],
                    device=[device_of[layer] for layer in layers],
                    expert_bytes=shard_bytes,
                    expert_time=[self.compute.expert(layer, 1) for layer in layers],
                )
            )
        timeliness = None
        if self.detail:
            copy = [latency + b / rate for b in self.expert_bytes]
            timeliness = Timeliness(g.layers, g.experts, devices, copy)
        timer = StepTimer(
            shards, links, self.compute, self.miss_mode, g.layers, g.experts, load_host_s=hw.load_host_us * 1e-6,
            load_layer_s=hw.load_layer_us * 1e-6,
            wake_s=hw.wake_us * 1e-6,
            resume_rate=hw.resume_per_stall, beside_s=hw.copy_beside_us * 1e-6,
            timeline=self.timeline, timeliness=timeliness, tier=tier, requests=self.trace.requests,
        )
        return Machine(links, shards, timer, tier, timeliness)

    def _share(self, i: int, layers: range) -> Capacity:
        """A global pool split over devices: each device's share of the slots."""
        cap = self.capacity
        if len(self.shards) == 1:
            return cap
        g = self.trace.geometry
        share = cap.slots * len(layers) // g.layers
        if share < g.top_k:
            raise CacheConfigError(
                f"--global-capacity {cap.slots} split over {len(self.ranges)} devices leaves {share} slots on "
                f"device {i}, below top_k={g.top_k}; raise it or use fewer --devices"
            )
        return Capacity(share, per_layer=False)


@dataclass
class Machine:
    """One run's state: each device's link, the caches (one per shard), the timing pass."""

    links: list[Link]
    shards: list[Shard]
    timer: StepTimer
    tier: HostTier | None
    timeliness: Timeliness | None

    def result(self, setup: Setup, log: LatencyLog, end: float, **kw: Any) -> SimResult:
        timer = self.timer
        stats = timer.stats([shard.cache.stats() for shard in self.shards])
        tl = self.timeliness
        tier = self.tier
        tier_stats = tier.cache.stats() if tier is not None else None
        return SimResult(
            requests=len(setup.trace.requests),
            sim_time_s=end,
            compute_s=timer.compute_s,
            stall_demand_s=timer.stall_demand,
            stall_late_s=timer.stall_late,
            stall_by_layer_s=tuple(timer.stall_by_layer),
            link_bytes=sum(link.bytes for link in self.links),
            cancelled_loads=sum(link.cancelled for link in self.links),
            link_utilisation=tuple(min(1.0, link.busy / end) if end else 0.0 for link in self.links),
            compute_utilisation=tuple(min(1.0, b / end) if end else 0.0 for b in timer.device_busy),
            stats=stats,
            late_by_layer=tuple(timer.late_by_layer),
            wasted_by_layer=tuple(tl.wasted_by_layer) if tl is not None else (),
            stall_bound_s=tl.bound if tl is not None else 0.0,
            stall_bound_by_layer_s=tuple(tl.bound_by_layer) if tl is not None else (),
            host_cache_gb=setup.host_cache.nbytes(setup.expert_bytes) / 1e9 if setup.host_cache is not None else 0.0,
            host_hits=tier_stats.hits if tier_stats is not None else 0,
            host_misses=tier_stats.misses if tier_stats is not None else 0,
            storage_bytes=tier.storage.bytes if tier is not None else 0,
            stall_storage_s=timer.stall_storage,
            **log.summary(end),
            **kw,
        )


def simulate(
    trace: Trace,
    policy: type[ExpertCache],
    capacity: Capacity,
    hardware: HardwareProfile,
    preset: ModelPreset,
    *,
    options: Mapping[str, Any] | None = None,
    label: str | None = None,
    batch: int = 1,
    miss_mode: MissMode = MissMode.LOAD,
    devices: int = 1,
    quant: Quant | None = None,
    pinned: bool = True,
    compute: ComputeModel | None = None,
    timeline: Timeline | None = None,
    trace_name: str = "",
    plan: StepPlan | None = None,
    workload: Any = None,
    host_cache: HostCache | None = None,
    detail: bool = False,
    compiled: bool | None = None,
    latency: LatencyLog | None = None,
) -> SimResult:
    """Run `trace` through `policy` caches on `hardware`; see the module docstring.
    `workload` (`serving.Workload`) serves the requests as they arrive instead of one after
    another; `detail` adds the per-layer timeliness figures and the perfect-prefetch bound (off
    by default, like the timeline: the hot loop stays bare; the CLI and sweeps turn it on).
    `compiled` chooses the offline decision pass as `casmoe.replay.replay` chooses its path
    (built-in policies' compiled twins; identical results either way). `latency`, a log to fill
    instead of a fresh one, gives a caller every step's time (requests one after another only)."""
    check_geometry(trace.geometry, preset)
    g = trace.geometry
    nbytes = expert_bytes_for(trace, preset, quant)
    cache_per_device = devices > 1 and not capacity.per_layer
    if workload is None:
        if plan is None:
            plan = StepPlan.build(trace, batch, devices, cache_per_device)
        elif plan.trace is not trace or plan.batch != batch or len(plan.ranges) != devices or (
            len(plan.shards) > 1
        ) != cache_per_device:
            raise SimConfigError("the step plan was built for another trace, batch, device count or capacity kind")
        ranges, shard_ranges, shard_traces = plan.ranges, plan.shards, plan.shard_traces
    else:
        ranges = split_layers(g.layers, devices)
        shard_ranges = list(ranges) if cache_per_device else [range(g.layers)]
        shard_traces = [trace.layer_slice(r) for r in ranges] if cache_per_device else [trace]
    setup = Setup(
        trace, policy, options or {}, capacity, miss_mode, hardware, ranges, shard_ranges, shard_traces, nbytes,
        compute or RooflineCompute.build(hardware, preset, nbytes, pinned), pinned, timeline, host_cache, detail,
    )
    budget = capacity.slots * sum(nbytes) if capacity.per_layer else capacity.slots * sum(nbytes) / g.layers
    describe = dict(
        policy=label or policy.name or policy.__name__,
        capacity=capacity.describe(),
        capacity_slots=capacity.slots,
        capacity_gb=budget / 1e9,
        hardware=hardware.name,
        model=preset.name,
        trace=trace_name,
        devices=devices,
        quant=(quant.value if quant else ("trace" if g.layer_expert_bytes else Quant.BF16.value)),
        miss_mode=miss_mode.value,
    )
    if workload is not None:
        from casmoe.sim.serving import serve

        if latency is not None:
            raise SimConfigError("a latency log is filled by requests one after another only, not by a workload")

        with no_gc():
            return serve(setup, workload, describe, compiled)
    machine = setup.machine(plan.shard_steps)
    log = LatencyLog() if latency is None else latency
    with no_gc():
        end = run_offline(plan, machine, setup, log, compiled)
    workload_text = "back-to-back" if batch == 1 else f"static batches of {batch}"
    return machine.result(setup, log, end, batch=batch, workload=workload_text, max_batch=batch, **describe)


@contextmanager
def no_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a run: the decision records are many small
    container objects, and rescanning them doubled the time of a run; a run forms no cycles
    that need collecting before it ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_offline(plan: StepPlan, machine: Machine, setup: Setup, log: LatencyLog, compiled: bool | None = None,
                compiled_timing: bool = True) -> float:
    """The fast path: requests one after another (or in static batches), each chunk of steps
    decided first, then priced. Returns the makespan. Where a compiled twin decides and the
    compiled timing pass mirrors the run (`compiled_timing.fits`), both passes run compiled
    (`compiled_timing=False`: the twin decides, Python prices; identical results)."""
    timer = machine.timer
    interleaved = timer.interleaved
    deciders: list[Decider | CompiledDecider] = [
        CompiledDecider(shard.cache, plan.shard_traces[i].requests, plan.arrays(i), CHUNK_STEPS)
        if not interleaved and uses_twin(shard.cache, plan.shard_traces[i], compiled)
        else shard.decider
        for i, shard in enumerate(machine.shards)
    ]
    if compiled_timing and compiled_pass.fits(machine, setup, deciders):
        return compiled_pass.run(plan, machine, setup, log, deciders[0], CHUNK_STEPS)  # type: ignore[arg-type]
    steps = plan.steps
    batch = plan.batch
    starts, finishing = starts_and_ends(steps)
    compute = setup.compute
    shard_steps = plan.shard_steps
    pos = [0] * len(setup.trace.requests)  # tokens each request has processed
    now = 0.0
    for c0 in range(0, len(steps), CHUNK_STEPS):
        c1 = min(len(steps), c0 + CHUNK_STEPS)
        records: list[list[StepDecisions]] | None = None
        if not interleaved:  # the decision pass for this chunk, shard by shard
            records = [d.chunk(shard_steps[i], c0, c1, starts, finishing) for i, d in enumerate(deciders)]
        for s in range(c0, c1):  # the timing pass
            step = steps[s]
            decisions = None if records is None else [rec[s - c0] for rec in records]
            t = now
            starting = starts.get(s, ())
            for r in starting:
                log.arrive(r, log.arrival.get(r - r % batch, t))  # a static batch arrives together
                log.admit(r, t, r % batch + 1)
            if starting:
                t = timer.begin(t, starting, decisions)
            step_start = now
            work = work_for(step.prefill, step.tokens, step.requests, pos, compute)
            t = timer.step(s, work, [sub[s] for sub in shard_steps], decisions, t)
            now = now + (t - now)  # SimPy's clock arithmetic (env.timeout(t - now))
            if step.prefill:
                log.prefilled(step.requests[0], step.tokens, t)
            else:
                log.decoded(step_start, t, step.requests)
            done = finishing.get(s, ())
            if done:
                for r in done:
                    log.finished(r, t)
                timer.end(t, len(done))
    return now
