"""A simulator run assembled from its inputs: the trace cut into steps and shards
(`TraceSteps`), the resolved settings of one policy's run (`Setup`) and the fresh state a run
drives (`RunState`: each device's link, the caches, the timing pass).

Both drivers build on these, the offline fast path (`engine.py`) and the SimPy serving one
(`serving.py`), so neither imports the other's module for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from casmoe.cache import Capacity, CacheConfigError, ExpertCache, MissMode
from casmoe.geometry import split_layers
from casmoe.sim.cost.compute import ComputeModel
from casmoe.sim.passes.decide import Decider, link_costs
from casmoe.sim.passes.latency import LatencyLog
from casmoe.sim.passes.link import HostCap, Link
from casmoe.sim.passes.result import SimResult
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.tiers import HostCache, HostTier
from casmoe.sim.passes.traffic import Traffic
from casmoe.sim.passes.timeline import Timeline
from casmoe.sim.passes.timeliness import Timeliness
from casmoe.sim.passes.timing import Shard, StepTimer, histories
from casmoe.step_arrays import StepArrays
from casmoe.trace import Future, Step, Trace


@dataclass
class TraceSteps:
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
    prefill_batch: int = 1  # prompts of a static batch prefilled together (`Trace.steps`)

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
    def build(cls, trace: Trace, batch: int = 1, devices: int = 1, cache_per_device: bool = False,
              prefill_batch: int = 1) -> TraceSteps:
        g = trace.geometry
        ranges = split_layers(g.layers, devices)
        steps = trace.steps(batch, prefill_batch)
        if not cache_per_device or devices == 1:
            return cls(trace, batch, ranges, steps, [range(g.layers)], [trace], [steps], prefill_batch)
        traces = [trace.layer_slice(layers) for layers in ranges]
        dsteps = [[s.layer_slice(layers, g.experts) for s in steps] for layers in ranges]
        return cls(trace, batch, ranges, steps, list(ranges), traces, dsteps, prefill_batch)


@dataclass(frozen=True)
class Run:
    """One run, resolved: what the engine takes (`engine.run_trace`). A policy class with its
    options and a cache on a machine (the model at its precisions on a box under a stack),
    replaying a trace, served some way: requests one after another or in static batches of
    `batch` (`prefill_batch` of their prompts prefilled together), or under `traffic`; a host
    RAM tier over the storage (`host_cache`); each request served at `context` tokens of context
    (0: its own length). `label` and `trace_name` name it in its record.

    `casmoe.sim.run.spec.RunSpec` is the same run before its files are read (a trace by path and
    digest, a policy by name): `runner.resolve` turns one into the other, the only place either
    is taken apart."""

    trace: Trace
    policy: type[ExpertCache]
    capacity: Capacity
    machine: Machine
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    trace_name: str = ""
    batch: int = 1
    miss_mode: MissMode = MissMode.LOAD
    traffic: Traffic | None = None
    host_cache: HostCache | None = None
    context: int = 0
    prefill_batch: int = 1

    def describe(self, expert_bytes: Sequence[int]) -> dict[str, Any]:
        """The fields its result carries to say what ran (`SimResult`)."""
        g, cap = self.trace.geometry, self.capacity
        budget = cap.slots * sum(expert_bytes) if cap.per_layer else cap.slots * sum(expert_bytes) / g.layers
        return dict(
            policy=self.label or self.policy.name or self.policy.__name__,
            capacity=cap.describe(),
            capacity_slots=cap.slots,
            capacity_gb=budget / 1e9,
            hardware=self.machine.hardware.name,
            model=self.machine.preset.name,
            trace=self.trace_name,
            devices=self.machine.devices,
            quant=self.machine.precision_label(g),
            miss_mode=self.miss_mode.value,
        )


@dataclass
class Setup:
    """Everything a run needs, resolved once: the run, how its layers and caches sit on the
    devices, its experts' sizes and its compute model; `start()` builds fresh state (links,
    caches) for each pass over it (oracles in serving mode may need several)."""

    run: Run
    ranges: list[range]  # layers of each device
    shards: list[range]  # layers of each cache
    shard_traces: list[Trace]
    expert_bytes: list[int]
    compute: ComputeModel
    timeline: Timeline | None
    detail: bool

    @property
    def trace(self) -> Trace:
        return self.run.trace

    @property
    def machine(self) -> Machine:
        return self.run.machine

    def positions(self) -> list[int]:
        """Each request's context before its first token (`timing.histories`): where the
        pricing of its attention starts."""
        return histories(self.trace.requests, self.run.context)

    def start(self, futures: Sequence[Sequence[Step]] | None) -> RunState:
        """Links, caches (attached to `futures`, one step sequence per shard, if they read the
        future) and the timing pass, at time 0."""
        g = self.trace.geometry
        run, machine = self.run, self.machine
        hw, stack = machine.hardware, machine.stack
        devices = len(self.ranges)
        cache_per_device = len(self.shards) > 1
        tier = None
        if run.host_cache is not None:
            tier = run.host_cache.build(g, self.expert_bytes, hw, self.trace)
        host = HostCap(hw.host_cap_gbs * 1e9) if hw.host_cap_gbs > 0 else None
        rate, latency = machine.copy_rate(), machine.copy_latency()
        offsets = [layers.start * g.experts if cache_per_device else 0 for layers in self.ranges]
        links = [Link(rate, latency, host, self.timeline, d, offsets[d], tier) for d in range(devices)]
        device_of = [d for d, layers in enumerate(self.ranges) for _ in layers]
        costs = link_costs(self.compute, machine, self.expert_bytes)  # what a per-step choice weighs
        shards = []
        for i, layers in enumerate(self.shards):
            sub_trace = self.shard_traces[i]
            shard_bytes = self.expert_bytes[layers.start : layers.stop]
            cache = run.policy.create(
                sub_trace.geometry, self._share(i, layers), miss_mode=run.miss_mode, expert_bytes=shard_bytes,
                trace=sub_trace, **dict(run.options),
            )
            if cache.host_experts or cache.decides_host:  # a placement's host experts, a per-step choice
                hw.check_host_compute()
                cache.attach_costs(costs.shifted(layers.start))
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
            timeliness = Timeliness(g.layers, g.experts, devices, [machine.copy_seconds(b) for b in self.expert_bytes])
        timer = StepTimer(
            shards, links, self.compute, run.miss_mode, g.layers, g.experts,
            load_host_s=(hw.load_host_us + stack.copy_us) * 1e-6, prefetch_early=stack.prefetch_early,
            load_layer_s=hw.load_layer_us * 1e-6,
            wake_s=hw.wake_us * 1e-6,
            resume_rate=hw.resume_per_stall, beside_s=hw.copy_beside_us * 1e-6,
            decide_s=hw.decide_us * 1e-6, decide_load_s=hw.decide_load_us * 1e-6,
            timeline=self.timeline, timeliness=timeliness, tier=tier, requests=self.trace.requests,
        )
        return RunState(links, shards, timer, tier, timeliness)

    def _share(self, i: int, layers: range) -> Capacity:
        """A global pool split over devices: each device's share of the slots."""
        cap = self.run.capacity
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
class RunState:
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
            wasted_by_layer=(tuple(w for shard in self.shards for w in shard.cache.wasted_by_layer())
                             if tl is not None else ()),
            stall_bound_s=tl.bound if tl is not None else 0.0,
            stall_bound_by_layer_s=tuple(tl.bound_by_layer) if tl is not None else (),
            stall_bound_by_device_s=tuple(tl.bound_by_device) if tl is not None else (),
            host_cache_gb=setup.run.host_cache.nbytes(setup.expert_bytes) / 1e9 if setup.run.host_cache is not None else 0.0,
            host_hits=tier_stats.hits if tier_stats is not None else 0,
            host_misses=tier_stats.misses if tier_stats is not None else 0,
            storage_bytes=tier.storage.bytes if tier is not None else 0,
            host_storage_reads=tier.host_reads if tier is not None else 0,
            stall_storage_s=timer.stall_storage,
            setup_s=timer.setup_s,
            setup_bytes=timer.setup_bytes,
            **log.summary(end),
            **kw,
        )
