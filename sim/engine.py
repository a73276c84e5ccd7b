"""The simulator: one SimPy process walks a trace's steps through real `ExpertCache` objects.

Event order is replay's (casmoe/replay.py): per request `begin_request`; per step and computed
layer `before_layer`, `route`; `end_request` after a request's last step. Loads the events
return go onto the owning device's `Link`; `arrived(expert)` is called when a load lands in
simulated time, always before the next cache event that could observe it. Because cache
decisions never depend on timing, the counts equal replay's in `load` mode, except that a hit
on an expert still on the wire is a *late* hit.

Time per layer: the layer may start once the previous one is done (plus an activation hand-over
when it changes device) and every expert it runs has arrived; the wait is a stall, charged to
`late prefetch` up to the last late-hit arrival and to `demand miss` beyond. Compute then takes
dense part + routed experts (`compute.py`). The SimPy clock advances once per step (one
timeout), so a Mixtral token costs one event, not dozens.

Layers are split across devices in contiguous ranges; each device has its own link and holds
the slots of its layers. With per-layer capacity one cache object serves all devices (its
pools are per layer, so each pool lives on its layer's device, and a next-layer prefetch that
crosses a device boundary goes over the next device's link). A global pool cannot span
devices: with `--global-capacity` each device gets its own cache, built on the sub-model of
its layers, with a share of the slots proportional to its layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import simpy

from casmoe.cache import Capacity, CacheConfigError, CacheStats, ExpertCache, MissMode
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, Quant, split_layers
from casmoe.presets import ModelPreset, load_presets
from casmoe.replay import request_bounds
from casmoe.sim.compute import ComputeModel, RooflineCompute
from casmoe.sim.hardware import HardwareProfile
from casmoe.sim.link import HostCap, Link
from casmoe.sim.result import SimResult, percentiles
from casmoe.sim.timeline import Timeline
from casmoe.trace import Future, Request, Step, Trace


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
class _Shard:
    """One cache and what the driver needs to run its layers, unpacked once; lists are
    indexed by the shard's local layer."""

    cache: ExpertCache
    steps: list[Step]
    requests: list[Request]
    first: int  # first global layer
    links: list[Link]  # the link of each layer's device
    device: list[int]
    expert_bytes: list[int]
    expert_time: list[float]  # one routed expert, one token


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
) -> SimResult:
    """Run `trace` through `policy` caches on `hardware`; see the module docstring."""
    check_geometry(trace.geometry, preset)
    g = trace.geometry
    nbytes = expert_bytes_for(trace, preset, quant)
    cache_per_device = devices > 1 and not capacity.per_layer
    if plan is None:
        plan = StepPlan.build(trace, batch, devices, cache_per_device)
    elif plan.trace is not trace or plan.batch != batch or len(plan.ranges) != devices or (
        len(plan.shards) > 1
    ) != cache_per_device:
        raise SimConfigError("the step plan was built for another trace, batch, device count or capacity kind")
    if compute is None:
        compute = RooflineCompute.build(hardware, preset, nbytes, pinned)
    host = HostCap(hardware.host_cap_gbs * 1e9) if hardware.host_cap_gbs > 0 else None
    rate = hardware.h2d_gbs(pinned) * 1e9
    latency = hardware.copy_latency_us * 1e-6
    offsets = [layers.start * g.experts if cache_per_device else 0 for layers in plan.ranges]
    links = [Link(rate, latency, host, timeline, d, offsets[d]) for d in range(devices)]
    device_of = [d for d, layers in enumerate(plan.ranges) for _ in layers]
    shards: list[_Shard] = []
    for i, layers in enumerate(plan.shards):
        sub_trace = plan.shard_traces[i]
        sub_cap = capacity
        if cache_per_device:
            share = capacity.slots * len(layers) // g.layers
            if share < g.top_k:
                raise CacheConfigError(
                    f"--global-capacity {capacity.slots} split over {devices} devices leaves {share} slots on "
                    f"device {i}, below top_k={g.top_k}; raise it or use fewer --devices"
                )
            sub_cap = Capacity(share, per_layer=False)
        shard_bytes = nbytes[layers.start : layers.stop]
        cache = policy.create(
            sub_trace.geometry, sub_cap, miss_mode=miss_mode, expert_bytes=shard_bytes, trace=sub_trace, **dict(options or {})
        )
        if cache.needs_future:
            cache.attach_future(Future(plan.shard_steps[i], sub_trace.geometry))
        shards.append(
            _Shard(
                cache=cache,
                steps=plan.shard_steps[i],
                requests=sub_trace.requests,
                first=layers.start,
                links=[links[device_of[layer]] for layer in layers],
                device=[device_of[layer] for layer in layers],
                expert_bytes=shard_bytes,
                expert_time=[compute.expert(layer, 1) for layer in layers],
            )
        )
    run = _Run(trace, plan.steps, shards, links, compute, miss_mode, batch, timeline)
    env = simpy.Environment()
    env.process(run.drive(env))
    env.run()
    stats = CacheStats.total([shard.cache.stats() for shard in shards])
    name = label or policy.name or policy.__name__
    slots = capacity.slots
    budget = capacity.slots * sum(nbytes) if capacity.per_layer else capacity.slots * sum(nbytes) / g.layers
    return run.result(
        policy=name,
        capacity=capacity.describe(),
        capacity_slots=slots,
        capacity_gb=budget / 1e9,
        hardware=hardware.name,
        model=preset.name,
        trace=trace_name,
        stats=stats,
        devices=devices,
        quant=(quant.value if quant else ("trace" if g.layer_expert_bytes else Quant.BF16.value)),
        miss_mode=miss_mode.value,
    )


class _Run:
    """The mutable state of one simulation and its SimPy driver process."""

    def __init__(
        self,
        trace: Trace,
        steps: list[Step],
        shards: list[_Shard],
        links: list[Link],
        compute: ComputeModel,
        miss_mode: MissMode,
        batch: int,
        timeline: Timeline | None,
    ) -> None:
        self.trace = trace
        self.steps = steps
        self.shards = shards
        self.links = links
        self.compute = compute
        self.miss_mode = miss_mode
        self.batch = batch
        self.timeline = timeline
        self.layers = trace.geometry.layers
        self.compute_s = 0.0
        self.stall_demand = 0.0
        self.stall_late = 0.0
        self.stall_by_layer = [0.0] * self.layers
        self.ttft: dict[int, float] = {}
        self.token_latency: list[float] = []
        self.decode_time = 0.0
        self.decode_tokens = 0
        self.prefill_tokens = 0
        self.end = 0.0

    def drive(self, env: simpy.Environment):
        steps = self.steps
        first, last = request_bounds(steps)
        starts: dict[int, list[int]] = {}
        ends: dict[int, int] = {}
        for r, s in first.items():
            starts.setdefault(s, []).append(r)
        for r, s in last.items():
            ends[s] = ends.get(s, 0) + 1
        batch = self.batch
        arrival: dict[int, float] = {}  # request -> when its batch group arrived
        pos = [0] * len(self.trace.requests)  # tokens each request has processed
        compute = self.compute
        timeline = self.timeline
        stall_by_layer = self.stall_by_layer
        load_mode = self.miss_mode is MissMode.LOAD
        cpu_mode = self.miss_mode is MissMode.CPU
        multi = len(self.links) > 1
        E = self.trace.geometry.experts
        busy_total = stall_late = stall_demand = 0.0  # locals: the layer loop is the hot path
        for s, step in enumerate(steps):
            t = env.now
            for r in starts.get(s, ()):
                arrival.setdefault(r, arrival.get(r - r % batch, t))
                for shard in self.shards:
                    self._land_all(shard, t)
                    self._issue(shard, t, shard.cache.begin_request(shard.requests[r]))
            T = step.tokens
            if step.prefill:
                (r,) = step.requests
                pairs = T * (T + 1) // 2
                kv = T
                pos[r] += T
                self.prefill_tokens += T
            else:
                pairs = 0
                for r in step.requests:
                    pos[r] += 1
                    pairs += pos[r]
                kv = pairs
            dense = compute.dense(T, pairs, kv)
            step_start = t
            on_device = 0
            for shard in self.shards:
                cache = shard.cache
                arrived = cache.arrived
                before = cache.before_layer if cache.prefetches_per_layer else None
                route = cache.route
                sub = shard.steps[s]
                counts = sub.counts
                exp_time = shard.expert_time
                links = shard.links
                for ll, experts in enumerate(sub.experts):
                    if not experts:
                        continue
                    if multi and shard.device[ll] != on_device:
                        on_device = shard.device[ll]
                        t += compute.handover(T)
                    link = links[ll]
                    if link.queue or (link.heap and link.heap[0][0] <= t):
                        link.land(t, arrived)  # only this layer's experts are observed next
                    if before is not None:
                        pre = before(s, ll)
                        if pre:
                            self._issue(shard, t, pre)
                    acc = route(s, ll, experts)
                    start = t
                    late_until = t
                    if acc.late:
                        for e in acc.late:
                            a = link.need(t, e)
                            if a > late_until:
                                late_until = a
                        start = late_until
                    if acc.loads:
                        nb = shard.expert_bytes[ll]
                        for ld in acc.loads:
                            if ld.victim >= 0:
                                links[ld.victim // E].cancel(t, ld.victim)
                            a = link.demand(t, ld.expert, nb)
                            if a > start:
                                start = a
                        for ld in acc.loads:  # landed by `start`, before the next cache event
                            arrived(ld.expert)
                    if acc.background:
                        self._issue(shard, t, acc.background)
                    if start > t:
                        stall_late += late_until - t
                        stall_demand += start - late_until
                        stall_by_layer[shard.first + ll] += start - t
                        if timeline is not None:
                            timeline.stall(on_device, t, start, shard.first + ll)
                    if counts is None and load_mode:
                        busy = dense + len(experts) * exp_time[ll]
                    else:
                        busy = dense + self._experts_time(
                            shard, ll, experts, None if counts is None else counts[ll], acc.cpu if cpu_mode else ()
                        )
                    t = start + busy
                    busy_total += busy
                    if timeline is not None:
                        timeline.compute(on_device, start, t, shard.first + ll)
            head = compute.head(1 if step.prefill else T)
            t += head
            busy_total += head
            yield env.timeout(t - env.now)
            if step.prefill:
                self.ttft[step.requests[0]] = t - arrival[step.requests[0]]
            else:
                self.token_latency.append(t - step_start)
                self.decode_time += t - step_start
                self.decode_tokens += T
                for r in step.requests:
                    self.ttft.setdefault(r, t - arrival[r])
            for _ in range(ends.get(s, 0)):
                for shard in self.shards:
                    self._land_all(shard, t)
                    shard.cache.end_request()
        self.end = env.now
        self.compute_s, self.stall_late, self.stall_demand = busy_total, stall_late, stall_demand

    @staticmethod
    def _land_all(shard: _Shard, t: float) -> None:
        for link in dict.fromkeys(shard.links):
            link.land(t, shard.cache.arrived)

    def _issue(self, shard: _Shard, t: float, loads) -> None:
        """Queue prefetch loads on their layers' links, cancelling the loads of the experts
        they evict."""
        links = shard.links
        nbytes = shard.expert_bytes
        E = self.trace.geometry.experts
        for ld in loads:
            if ld.victim >= 0:
                links[ld.victim // E].cancel(t, ld.victim)
            layer = ld.expert // E
            links[layer].prefetch(t, ld.expert, nbytes[layer])

    def _experts_time(self, shard: _Shard, ll: int, experts, counts, cpu) -> float:
        """Routed-expert time when tokens per expert vary or some experts run on the host
        (which works alongside the GPU: the layer takes the longer of the two)."""
        layer = shard.first + ll
        expert = self.compute.expert
        if counts is None:
            counts = [1] * len(experts)
        if not cpu:
            if len(counts) == 1 or counts.count(1) == len(counts):
                return len(counts) * shard.expert_time[ll]
            return sum(expert(layer, c) for c in counts)
        on_host = set(cpu)
        gpu = host = 0.0
        cpu_expert = self.compute.cpu_expert
        for e, c in zip(experts, counts):
            if e in on_host:
                host += cpu_expert(layer, c)
            else:
                gpu += expert(layer, c)
        return max(gpu, host)

    def result(self, **kw: Any) -> SimResult:
        ttft = list(self.ttft.values())
        p50, p90, p99 = percentiles(self.token_latency, (50, 90, 99))
        t50, t99 = percentiles(ttft, (50, 99))
        end = self.end
        return SimResult(
            batch=self.batch,
            requests=len(self.trace.requests),
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            sim_time_s=end,
            compute_s=self.compute_s,
            ttft_mean_s=sum(ttft) / len(ttft) if ttft else 0.0,
            ttft_p50_s=t50,
            ttft_p99_s=t99,
            token_latency_mean_s=self.decode_time / len(self.token_latency) if self.token_latency else 0.0,
            token_latency_p50_s=p50,
            token_latency_p90_s=p90,
            token_latency_p99_s=p99,
            decode_tokens_per_s=self.decode_tokens / self.decode_time if self.decode_time else 0.0,
            stall_demand_s=self.stall_demand,
            stall_late_s=self.stall_late,
            stall_by_layer_s=tuple(self.stall_by_layer),
            link_bytes=sum(link.bytes for link in self.links),
            cancelled_loads=sum(link.cancelled for link in self.links),
            link_utilisation=tuple(min(1.0, link.busy / end) if end else 0.0 for link in self.links),
            **kw,
        )
