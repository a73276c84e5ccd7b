"""`calibrate`: measure this machine running a model, as a hardware profile the simulator reads.

What is measured, on the backend's own code paths:

- achieved matmul rate and memory bandwidth of the device (a square matmul, a large clone);
- the marginal time of one routed expert for one token (transformers' experts function on the
  store, one token vs two tokens routed to disjoint experts);
- a whole decode step with every expert resident (the offloaded runtime, LRU at full capacity);
  the simulator's per-layer overhead is fitted so that its decode step equals that time;
- one expert for one token computed on the host the way the `cpu` miss mode computes it; the
  profile's host memory bandwidth is fitted to it (at one token the host expert is memory-bound),
  so the simulator prices `--miss-mode cpu` at the backend's own cost;
- copies through the backend's loader (its link cap, if any), `LoaderProbe`: batches of n
  copies submitted together and waited for, as a layer that misses does, timed from the first
  submit. Median batch times at two sizes (on a capped link, long enough to stand out of the
  wake-up noise) and two counts give the line
  t = fixed + n (latency + bytes / bandwidth); batches that follow one layer's worth of the
  model's own expert compute give `wake`: `fixed` plus the mean excess over the line (a thread
  that has just computed is woken later by the OS than one that idles; a mean, because a
  token's latency sums many waits); and `beside`, what a prefetch copy running while the
  model computes costs that compute (k copies submitted before a few layers' worth of the
  model's own compute, against the same compute alone: the copy thread's wake-ups take the
  GIL from it);
- the fixed cost of a layer's device pass over its experts (`expert_pass`: a layer whose
  experts all run on the host in the cpu miss mode skips it), timed by the runtime on the
  all-resident baseline's one-token passes less their experts' marginal time; and the host
  path's fixed cost per expert (`cpu_hop`, each way): how much longer an on-demand run's decode
  layer takes in the cpu miss mode than the baseline's (difference of per-request medians),
  plus the pass it skips, per expert, less what the simulator charges for the host expert's
  compute and its activations (with its own price of the skipped pass: `_host_hop`);
- the compute thread's own costs of loads, `runtime_costs`: an on-demand run (every decode layer
  loads its k experts and waits) on the calibrated link against the all-resident baseline. The
  runtime times its issuing (a burst's first load, which wakes the copy thread, and the rest);
  the decode layers' extra time not spent waiting, beyond issuing, is resuming after the wait,
  proportional to the stall (runs on the link and on one twice as fast; profiled: the compute
  after a blocked wait runs slower, the more the longer it idled).

The roofline parts (FLOPs / rate, bytes / bandwidth) use the measured achieved rates, so the
efficiencies are 1 by construction; what the roofline misses (Python and kernel-launch cost)
lands in the fitted overheads.
"""

from __future__ import annotations

import os
import platform
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import numpy as np
import torch

from casmoe.backends.copier import EmulatedLink, Loader, Ticket, responsive_copies
from casmoe.backends.expert_ops import host_expert
from casmoe.backends.experts import SlotView, model_preset
from casmoe.backends.runtime import OffloadedModel, Prompt
from casmoe.cache import Capacity, MissMode
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.sim.box.hardware import HardwareProfile
from casmoe.sim.cost.machine import Machine


def _median_time(fn: Callable[[], Any], reps: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


@dataclass(frozen=True)
class HostCosts:
    """Compute-thread costs of loads (the simulator's `load_host_us`, `load_layer_us`,
    `resume_per_stall`): issuing them overlaps their copies, resuming after a wait does not."""

    per_load: float  # seconds
    per_burst: float  # seconds
    per_stall: float  # seconds of slower compute per second stalled

    def scaled(self, factor: float) -> HostCosts:
        """The same costs on a machine `factor` times slower (they are compute-thread time)."""
        return HostCosts(self.per_load * factor, self.per_burst * factor, self.per_stall)


@dataclass(frozen=True)
class DecisionCost:
    """Compute-thread seconds of a policy's own decisions (the cache's `before_layer` and
    `route`) per layer visit: `per_visit`, plus `per_load` for each load the visit asks for
    (choosing a victim, recording the load); the simulator's `decide_us` / `decide_load_us`
    charge them beyond the all-resident baseline's, whose visits are in its resident step."""

    per_visit: float  # seconds
    per_load: float  # seconds
    measured_s: float = 0.0  # the visits' total as timed (a diagnostic beside the backend's own timers)

    @classmethod
    def fit(cls, seconds: Sequence[float], loads: Sequence[int]) -> DecisionCost:
        """Least squares of t = per_visit + per_load x loads over visits (per_load 0 when every
        visit asked for as many loads: nothing to tell them apart by)."""
        t, n = np.asarray(seconds, dtype=float), np.asarray(loads, dtype=float)
        if not len(t):
            return cls(0.0, 0.0)
        if np.ptp(n) == 0:
            return cls(float(t.mean()), 0.0, float(t.sum()))
        slope, intercept = np.polyfit(n, t, 1)
        return cls(max(float(intercept), 0.0), max(float(slope), 0.0), float(t.sum()))

    def excess(self, baseline: DecisionCost) -> DecisionCost:
        """What this costs beyond `baseline`'s visits (which a resident step already holds)."""
        return DecisionCost(max(self.per_visit - baseline.per_visit, 0.0), self.per_load, self.measured_s)

    def scaled(self, factor: float) -> DecisionCost:
        return DecisionCost(self.per_visit * factor, self.per_load * factor, self.measured_s * factor)


def decision_cost(trace: Any, policy: Any, capacity: Capacity, options: dict[str, Any] | None = None,
                  miss_mode: MissMode = MissMode.LOAD, rounds: int = 3) -> DecisionCost:
    """A policy's decision costs on this machine: its Python form replayed over `trace`
    (casmoe.replay, the code the backend's compute thread runs at each layer), each visit's
    `before_layer` and `route` timed; the fastest of `rounds` replays per visit (a shared
    machine's interruptions are not the policy's)."""
    best: np.ndarray | None = None
    loads: list[int] = []
    for _ in range(rounds):
        cache = policy.create(trace.geometry, capacity, miss_mode=miss_mode, trace=trace, **(options or {}))
        seconds: list[float] = []
        loads = []
        pending = [0.0, 0]

        def timed_before(step: int, layer: int, _f=cache.before_layer) -> Any:
            t0 = time.perf_counter()
            pre = _f(step, layer)
            pending[0], pending[1] = time.perf_counter() - t0, len(pre)
            return pre

        def timed_route(step: int, layer: int, experts: Any, *rest: Any, _f=cache.route) -> Any:
            t0 = time.perf_counter()
            acc = _f(step, layer, experts, *rest)
            seconds.append(pending[0] + time.perf_counter() - t0)
            loads.append(pending[1] + len(acc.loads) + len(acc.background))
            pending[0], pending[1] = 0.0, 0
            return acc

        cache.before_layer, cache.route = timed_before, timed_route
        replay(trace, cache, compiled=False)
        best = np.asarray(seconds) if best is None else np.minimum(best, seconds)
    return DecisionCost.fit(best if best is not None else [], loads)


@dataclass(frozen=True)
class Calibration:
    """Measured figures (seconds, bytes/s, FLOP/s) and the fitted simulator overheads."""

    device: str
    flops: float
    mem_bw: float
    cpu_flops: float
    cpu_mem_bw: float
    expert_s: float  # marginal: one routed expert, one token
    step_s: float  # one decode step, every expert resident
    copy_bw: float
    copy_latency: float
    layer_overhead: float
    expert_overhead: float
    link: EmulatedLink
    host_expert_s: float = 0.0  # one expert on the host for one token (cpu miss mode); 0: not measured
    wake: float = 0.0  # a waiting thread runs again this long after its last copy lands
    loads: HostCosts = HostCosts(0.0, 0.0, 0.0)  # compute-thread time of issuing loads and resuming
    cpu_hop: float = 0.0  # one host expert's fixed cost, each way (activations, the host path's glue)
    expert_pass: float = 0.0  # fixed cost of a layer's pass over its device experts
    beside: float = 0.0  # compute-thread time lost per copy running beside the compute
    decide: DecisionCost = DecisionCost(0.0, 0.0)  # the policy's decisions beyond the baseline's (`validate` sets it)
    decide_factor: float = 1.0  # the compute thread's decisions over the same decisions timed in a replay

    def at_speed(self, step_s: float) -> Calibration:
        """The compute-thread and host figures on a machine whose resident decode step now takes
        `step_s` (a shared machine's speed drifts); `refit` then refits the overheads."""
        f = step_s / self.step_s
        return replace(self, loads=self.loads.scaled(f), cpu_hop=self.cpu_hop * f, expert_pass=self.expert_pass * f,
                       host_expert_s=self.host_expert_s * f, cpu_mem_bw=self.cpu_mem_bw / f, beside=self.beside * f,
                       decide=self.decide.scaled(f))

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("link", "loads", "decide")}
        d.update(decide_visit=self.decide.per_visit, decide_load=self.decide.per_load)
        d.update(load_issue=self.loads.per_load, load_burst=self.loads.per_burst, resume_per_stall=self.loads.per_stall)
        d["link_bandwidth"] = self.link.bandwidth
        d["link_latency"] = self.link.latency
        return d

    def profile(self, name: str = "calibrated") -> Any:
        """A `HardwareProfile` with these numbers, every one sourced."""
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        host = f"casmoe calibrate on {platform.node() or 'this host'}, {when}"
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        cuda = self.device.startswith("cuda")
        memory = torch.cuda.get_device_properties(self.device).total_memory / 2**30 if cuda else ram
        cap = "" if self.link.bandwidth is None else f" through a link capped at {self.link.bandwidth / 1e9:.4g} GB/s"
        values = dict(
            name=name,
            description=f"measured: {self.device} on {platform.node() or 'this host'} ({when})",
            gpu=torch.cuda.get_device_name(self.device) if cuda else f"CPU as the compute device ({platform.processor() or platform.machine()})",
            gpus=1,
            memory_gib=round(memory, 2),
            reserved_gib=round(min(1.0, memory / 4), 2),
            dense_tflops=self.flops / 1e12,
            mem_bw_gbs=self.mem_bw / 1e9,
            matmul_efficiency=1.0,
            mem_efficiency=1.0,
            cpu_matmul_efficiency=1.0,
            cpu_mem_efficiency=1.0,
            cpu_sockets=0,
            host_reserved_gib=0.0,
            h2d_pinned_gbs=self.copy_bw / 1e9,
            h2d_pageable_gbs=self.copy_bw / 1e9,
            copy_latency_us=self.copy_latency * 1e6,
            host_cap_gbs=0.0,
            layer_overhead_us=self.layer_overhead * 1e6,
            expert_overhead_us=self.expert_overhead * 1e6,
            handover_us=0.0,
            p2p_gbs=self.mem_bw / 1e9,
            cpu=platform.processor() or platform.machine(),
            cpu_tflops=self.cpu_flops / 1e12,
            cpu_mem_bw_gbs=self.cpu_mem_bw / 1e9,
            storage_read_gbs=0.0,
            storage_latency_us=0.0,
            host_ram_gib=round(ram, 2),
            load_host_us=self.loads.per_load * 1e6,
            load_layer_us=self.loads.per_burst * 1e6,
            wake_us=self.wake * 1e6,
            resume_per_stall=self.loads.per_stall,
            copy_beside_us=self.beside * 1e6,
            decide_us=self.decide.per_visit * 1e6,
            decide_load_us=self.decide.per_load * 1e6,
            cpu_hop_us=self.cpu_hop * 1e6,
            expert_pass_us=self.expert_pass * 1e6,
            cpu_serial=0.0 if cuda else 1.0,
        )
        sources = dict(
            gpus="one device measured",
            memory_gib=f"{host}: total memory of {self.device}",
            reserved_gib="assumption: a quarter of memory, at most 1 GiB, for activations and the allocator",
            dense_tflops=f"{host}: achieved rate of a square matmul in the model's dtype",
            mem_bw_gbs=f"{host}: achieved bandwidth of a 64 MiB clone (read + write)",
            matmul_efficiency="1: dense_tflops is already the achieved rate",
            mem_efficiency="1: mem_bw_gbs is already the achieved bandwidth",
            cpu_matmul_efficiency="1: cpu_tflops is already the achieved rate of this backend's host kernels",
            cpu_mem_efficiency="1: cpu_mem_bw_gbs is already the achieved bandwidth of this backend's host kernels",
            cpu_sockets="0: as measured, the host's sockets are in the achieved rates",
            cpu_cores="0: as measured, the cores the backend's threads used are in the achieved rates",
            cpu_threads="0: as measured, the backend's threads are in the achieved rates",
            cpu_thread_gbs="0: as measured, cpu_mem_bw_gbs is already the rate this backend's threads reach",
            cpu_matrix_speedup="0: as measured, any matrix units are in the achieved cpu_tflops",
            cpu_int8_speedup=("0: not measured: cpu_tflops is a float matmul's rate in the model's dtype, the rate "
                              "casmoe's own backend computes host experts at (it has no int8 kernels)"),
            cpu_bf16_speedup="0: as measured, cpu_tflops is already the rate of a matmul in the model's dtype",
            host_reserved_gib="0: not measured (the RAM the operating system and runtime keep is not subtracted)",
            h2d_pinned_gbs=f"{host}: expert copies through the backend's copier{cap} (two-size fit, at most mem_bw_gbs)",
            h2d_pageable_gbs=f"{host}: same copier; " + ("pinned figure reused" if cuda else "the CPU has one kind of memory"),
            copy_latency_us=f"{host}: per-copy cost of the backend's copier{cap} (two-size fit, batches of k)",
            host_cap_gbs="none: one link",
            layer_overhead_us=f"{host}: fitted so the simulated decode step equals the measured {self.step_s * 1e3:.3f} ms",
            expert_overhead_us=f"{host}: measured marginal expert time {self.expert_s * 1e6:.1f} us minus its roofline",
            handover_us="not measured: one device",
            p2p_gbs="assumption: the device memory bandwidth (unused with one device)",
            cpu_tflops=f"{host}: achieved rate of a square matmul on the CPU",
            cpu_mem_bw_gbs=(f"{host}: fitted to the backend's host expert (cpu miss mode): one token took "
                            f"{self.host_expert_s * 1e6:.1f} us" if self.host_expert_s else
                            f"{host}: achieved bandwidth of a 64 MiB clone on the CPU"),
            storage_read_gbs="not measured: the backend's store is in RAM",
            storage_latency_us="not measured: the backend's store is in RAM",
            host_ram_gib=f"{host}: physical memory (sysconf)",
            load_host_us=f"{host}: on-demand run, the runtime's time issuing each load after the first of a burst",
            load_layer_us=f"{host}: on-demand run, what a burst's first load cost beyond load_host_us",
            wake_us=(f"{host}: loader batches of copies, the per-wait term of the copy line plus its mean excess "
                     "after a layer's compute"),
            resume_per_stall=(f"{host}: on-demand runs on the link and on one twice as fast against the "
                              "all-resident baseline, compute-thread time beyond issuing per time stalled (through 0)"),
            copy_beside_us=(f"{host}: k prefetch copies through the backend's loader beside the model's own "
                            "compute, the compute's extra time per copy"),
            decide_us=(f"{host}: the policy's before_layer and route per layer visit, timed over a replay of its "
                       f"trace, beyond the all-resident baseline's, x {self.decide_factor:.3g} (on-demand's decisions "
                       "on the compute thread over the same replayed; 0: no policy's)"),
            decide_load_us=f"{host}: the same replay's decision time per load a visit asks for (least squares), scaled alike",
            cpu_hop_us=(f"{host}: on-demand run in the cpu miss mode against the all-resident baseline, "
                        "per one-token host expert beyond the simulator's host compute and activation bytes, halved"),
            expert_pass_us=(f"{host}: all-resident baseline run, the runtime's one-token expert pass less "
                            "its experts' marginal time"),
            cpu_serial=("1: the device is this CPU, host experts run on the same thread" if not cuda else
                        "0: host experts run on the CPU beside the GPU's"),
        )
        return HardwareProfile(**values, sources=sources)


def _rates(device: torch.device, dtype: torch.dtype, sync: Callable[[], None], reps: int) -> tuple[float, float]:
    n = 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    flops = 2 * n**3 / _median_time(lambda: a @ b, reps, sync)
    big = torch.empty(16 * 2**20, device=device, dtype=torch.float32)  # 64 MiB
    bw = 2 * big.numel() * 4 / _median_time(big.clone, reps, sync)
    return flops, bw


def _expert_time(om: OffloadedModel, device: torch.device, sync: Callable[[], None], reps: int) -> float:
    """Marginal time of one routed expert for one token, on transformers' experts function."""
    g = om.geometry
    k = g.top_k
    tensors = om.store.layer_tensors(0, device)
    view = SlotView(om.experts_template, tensors)
    dtype = next(iter(tensors.values())).dtype
    h1 = torch.randn(1, g.hidden, device=device, dtype=dtype)
    w1 = torch.full((1, k), 1.0 / k, device=device)
    i1 = torch.arange(k, device=device)[None]
    one = _median_time(lambda: om.experts_fn(view, h1, i1, w1), reps, sync)
    if g.experts < 2 * k:
        return one / k
    h2 = torch.randn(2, g.hidden, device=device, dtype=dtype)
    i2 = torch.arange(2 * k, device=device).view(2, k)
    two = _median_time(lambda: om.experts_fn(view, h2, i2, torch.cat([w1, w1])), reps, sync)
    return max(two - one, 1e-9) / k


def _host_expert_time(om: OffloadedModel, reps: int) -> float:
    """One expert for one token on the host, as the `cpu` miss mode computes it (weights in
    host memory, read once from the store)."""
    rows = om.store.empty_rows()
    om.store.read(0, 0, rows)
    h1 = torch.randn(1, om.geometry.hidden, dtype=next(iter(rows.values())).dtype)
    return _median_time(lambda: host_expert(om.attrs, h1, rows), reps, lambda: None)


@dataclass(frozen=True)
class CopyCosts:
    """The backend loader's copies, as the simulator prices them (seconds, bytes/s)."""

    bandwidth: float
    latency: float  # per copy, on the link
    wake: float  # once per wait, after the last copy lands
    beside: float = 0.0  # compute-thread time lost per copy that runs while it computes


LINE_SPAN_S = 4e-3
"""Least link time of the loader probe's big batches (see `LoaderProbe.big`)."""


class LoaderProbe:
    """Times the backend `Loader` the way a layer that misses uses it: n demand copies
    submitted together, then waited for, from the first submit (when the copy clock starts).
    `line()` fits t = fixed + n (latency + bytes / bandwidth) to median batch times at two sizes
    and two counts (the link itself is steady); `fixed` is paid once per wait: the copy thread's
    sleep overshoot and the waiting thread's wake-up. `wake(n)` samples, after one layer's worth
    of the model's compute each, how much longer than the line a batch takes (the OS wakes a
    thread that has just computed later than an idle one, heavy-tailed on a loaded machine: its
    mean is what a run pays, so a run interleaves samples with its requests). Close it when
    done."""

    def __init__(self, om: OffloadedModel, device: torch.device, link: EmulatedLink, layer_s: float) -> None:
        self.k = max(2, om.geometry.top_k)
        self.nbytes = om.store.expert_bytes(0)
        # float32 values per copy of the line's big batches: an expert, or on a capped link enough
        # that k of them take LINE_SPAN_S (a small expert's copy time drowns in wake-up noise)
        self.big = max(self.nbytes // 4, int(LINE_SPAN_S * (link.bandwidth or 0) / 4 / self.k))
        self.device = device
        self.copier = Loader(device, link=link)
        self.work = _layer_work(om, device, layer_s)
        self.long_work = _layer_work(om, device, 2 * self.k * max(layer_s, self.nbytes / (link.bandwidth or 1e12)))
        self.excess: list[float] = []
        self.fixed = 0.0  # once per wait, by the line
        self.line_s = 0.0  # one batch of k big copies, by the line
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def line(self, reps: int) -> tuple[float, float]:
        """(bandwidth, per-copy latency) from median batch times of k and 2k copies of two sizes."""
        k, idle = self.k, (lambda: None)
        small, big = self.big // 4, self.big
        t1, t4, t4x2 = (float(np.median(self._batches(k * m, n, idle, reps))) for m, n in ((1, small), (1, big), (2, big)))
        bandwidth = k * 4 * (big - small) / max(t4 - t1, 1e-9)
        per_copy = max((t4x2 - t4) / k, 4 * big / bandwidth)
        self.fixed = max(t4 - k * per_copy, 0.0)
        self.line_s = t4
        return bandwidth, per_copy - 4 * big / bandwidth

    def wake(self, reps: int) -> None:
        """Add `reps` wake samples (after `line()`)."""
        self.excess += [t - self.line_s for t in self._batches(self.k, self.big, self.work, reps)]

    def costs(self, reps: int) -> CopyCosts:
        """Everything at once: the line, `reps` wake samples, the cost of copies beside compute."""
        bandwidth, latency = self.line(reps)
        self.wake(reps)
        return replace(self.result(bandwidth, latency), beside=self.beside(reps))

    def result(self, bandwidth: float, latency: float) -> CopyCosts:
        return CopyCosts(bandwidth, latency, max(self.fixed + float(np.mean(self.excess)), 0.0))

    def beside(self, reps: int) -> float:
        """Compute-thread seconds lost per copy that runs while it computes: k expert-sized
        prefetch copies submitted, then several layers' worth of the model's compute (longer
        than the copies), against the same compute alone; the submitting is not counted."""
        k = self.k
        alone, lost = [], []
        for rep in range(reps + 1):
            t = time.perf_counter()
            self.long_work()
            plain = time.perf_counter() - t
            tickets = self._submit(k, self.nbytes // 4, demand=False)
            t = time.perf_counter()
            self.long_work()
            spent = time.perf_counter() - t
            for tk in tickets:
                self.copier.wait(tk)
            if rep:
                alone.append(plain)
                lost.append(spent)
        return max(float(np.median(lost) - np.median(alone)) / k, 0.0)

    def close(self) -> None:
        self.copier.close()

    def _submit(self, count: int, n: int, demand: bool = True) -> list[Ticket]:
        """`count` copies of `n` float32 values each, submitted together."""
        if (count, n) not in self._buffers:
            cuda = self.device.type == "cuda"
            src = torch.randn(count, n).pin_memory() if cuda else torch.randn(count, n)
            self._buffers[count, n] = (src, torch.empty(count, n, device=self.device))
        src, dst = self._buffers[count, n]
        tickets = [Ticket(i, i, demand, {"w": dst[i]}, n * 4, src={"w": src[i]}) for i in range(count)]
        for tk in tickets:
            self.copier.submit(tk)
        return tickets

    def _batches(self, count: int, n: int, before: Callable[[], None], reps: int) -> list[float]:
        spent = []
        for rep in range(reps + 1):
            before()
            tickets = self._submit(count, n)
            for tk in tickets:
                self.copier.wait(tk)
            if rep:  # the first batch warms up
                spent.append(time.perf_counter() - tickets[0].submitted)
        return spent


def _layer_work(om: OffloadedModel, device: torch.device, seconds: float) -> Callable[[], None]:
    """About `seconds` of the model's own compute: its experts function, called repeatedly."""
    g = om.geometry
    tensors = om.store.layer_tensors(0, device)
    view = SlotView(om.experts_template, tensors)
    dtype = next(iter(tensors.values())).dtype
    h = torch.randn(1, g.hidden, device=device, dtype=dtype)
    w = torch.full((1, g.top_k), 1.0 / g.top_k, device=device)
    i = torch.arange(g.top_k, device=device)[None]
    one = _median_time(lambda: om.experts_fn(view, h, i, w), 5, lambda: None)
    calls = max(1, round(seconds / max(one, 1e-9)))

    def work() -> None:
        for _ in range(calls):
            om.experts_fn(view, h, i, w)

    return work


def calibrate(
    om: OffloadedModel,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int = 16,
    reps: int = 20,
) -> Calibration:
    """Measure `om`'s device and link (its `EmulatedLink` cap included); see the module docstring."""

    device = om.devices[0]
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    dtype = next(iter(om.store.layout.values()))[1]
    flops, mem_bw = _rates(device, dtype, sync, reps)
    cpu_flops, cpu_bw = (flops, mem_bw) if not cuda else _rates(torch.device("cpu"), dtype, lambda: None, reps)
    expert_s = _expert_time(om, device, sync, reps)
    host_s = _host_expert_time(om, reps)
    cpu_bw = om.store.expert_bytes(0) / host_s  # the simulator's host expert is memory-bound at one token
    step = resident_step(om, prompts, max_new_tokens)
    probe = LoaderProbe(om, device, om.link, step / om.geometry.layers)
    try:
        with responsive_copies():
            c = probe.costs(reps)
            rt = runtime_costs(om, prompts, max_new_tokens, step)
    finally:
        probe.close()
    # a copy cannot outrun the memory it reads: a two-size fit whose times differ by less than the
    # timing noise (a busy host, copies within RAM) gives any bandwidth, up to 1e9 times the bytes
    copy_bw = min(c.bandwidth, mem_bw)
    cal = Calibration(str(device), flops, mem_bw, cpu_flops, cpu_bw, expert_s, step, copy_bw, c.latency,
                      0.0, 0.0, om.link, host_s, c.wake, rt.loads, 0.0, max(rt.expert_pass - rt.pass_experts * expert_s, 0.0),
                      c.beside)
    cal = replace(cal, cpu_hop=_host_hop(cal, om, rt.host_expert), decide_factor=rt.decide_factor)
    return refit(cal, om, step, prompts, max_new_tokens)


def _host_hop(cal: Calibration, om: OffloadedModel, host_expert: float) -> float:
    """The host path's fixed cost each way (`cpu_hop`) with which the simulator's layer whose
    experts all run on the host is as much shorter than its resident layer as the runtime's:
    priced with the simulator's own charges for a device expert (the roofline's, when longer
    than the measured marginal time) and for the host expert and its activations' transfers."""
    roof = Machine(model_preset(om.model, om.geometry), cal.profile()).compute(om.geometry.layer_expert_bytes)
    charged = max(roof.expert(0, 1), cal.expert_s)
    return max((host_expert + charged - cal.expert_s - roof.cpu_expert(0, 1)) / 2, 0.0)


@dataclass(frozen=True)
class RuntimeCosts:
    """What the runtime's own timers saw in `runtime_costs` (seconds)."""

    loads: HostCosts
    expert_pass: float  # one one-token device pass of the baseline
    pass_experts: float  # experts per such pass
    host_expert: float  # one one-token expert on the host, as a decode layer pays for it
    decide_factor: float  # on-demand's decisions on the compute thread over the same ones replayed


def runtime_costs(om: OffloadedModel, prompts: Sequence[Prompt], max_new_tokens: int, step_s: float) -> RuntimeCosts:
    """On-demand (every decode layer loads its k experts in one burst and waits for them) in the
    cpu miss mode (every routed expert computed on the host), on `om`'s own link, and on one
    twice as fast (once, on a CUDA or uncapped link); per prompt, each run's request between
    two all-resident baseline requests of the same prompt, as in `validate`
    (`between_baselines`: a request runs measurably faster or slower after another session's
    than after its own, so calibration measures in the order the validated runs see). Issuing
    is timed by the runtime itself (`IssueCost`; a burst's first load costs more than the
    rest: it wakes the copy thread). What the decode layers' time not spent waiting exceeds
    the baseline's by, beyond issuing, is resuming after the wait: per request, the difference
    of medians against the mean of the baseline either side (a drift of the machine's speed
    cancels), then the median request on each link, and a line through 0 in the layer's stall
    (profiled: the compute after a blocked wait runs slower, the more the longer it idled).
    The baseline's device passes are timed by the runtime too (`PassCost`); a host expert is
    what a cpu-run decode layer takes beyond the baseline's, plus the device pass it skips, per
    expert (the same difference of medians). Every figure is scaled to a machine whose
    resident decode step takes `step_s` (the calibration's), by the baseline's speed during
    these runs."""
    g = om.geometry
    ondemand = get_policy("ondemand")
    link = om.link
    fast = link if om.devices[0].type == "cuda" or not link.bandwidth else EmulatedLink(2 * link.bandwidth, link.latency)

    def on_demand(lk: EmulatedLink, mode: MissMode = MissMode.LOAD) -> Any:
        return om.session(ondemand, Capacity(g.top_k), prompts, max_new_tokens=max_new_tokens, link=lk, miss_mode=mode)

    with ExitStack() as stack:
        runs = [stack.enter_context(on_demand(lk)) for lk in ((link,) if fast is link else (link, fast))]
        cpu = stack.enter_context(on_demand(link, MissMode.CPU))
        base = stack.enter_context(baseline(om, [p for p in prompts for _ in range(len(runs) + 2)], max_new_tokens))
        # per run, per request: (extra busy, stall) per decode layer against the baseline either side
        points: list[list[tuple[float, float]]] = [[] for _ in (cpu, *runs)]
        for p in prompts:
            for (r, step), pts in zip(between_baselines(base, (cpu, *runs), p, max_new_tokens), points):
                pts.append(((median_busy([r]) - step) / g.layers, float(np.median(r.token_stall)) / g.layers))
        speed = step_s / median_step(base.timings)
        issues, passes = runs[0].devs[0].issues, base.devs[0].passes
        routing = runs[0].result().trace
        decided = sum(runs[0].devs[0].decisions.seconds)  # on-demand's decisions, by the runtime's timers
    # on-demand's own decisions (every decode layer chooses k victims) beyond the baseline's, in
    # each miss mode: what the simulator charges it (`decide_us`), not part of issuing or resuming.
    # A replay times them in a tight loop; the compute thread, between the model's kernels, runs
    # the same Python several times slower (colder caches): the ratio is measured here, on
    # on-demand's own run, and applies to every policy's replayed decisions (`validate`).
    resident = decision_cost(routing, get_policy("lru"), Capacity(g.experts))
    replayed = {mode: decision_cost(routing, ondemand, Capacity(g.top_k), miss_mode=mode)
                for mode in (MissMode.LOAD, MissMode.CPU)}
    factor = decided / replayed[MissMode.LOAD].measured_s if replayed[MissMode.LOAD].measured_s > 0 else 1.0
    deciding = {mode: d.excess(resident).scaled(factor) for mode, d in replayed.items()}
    on_host, *points = points  # how much longer a decode layer takes with its experts on the host
    # a layer with its k experts on the host skips the device's pass and runs them one after another
    cpu_deciding = deciding[MissMode.CPU].per_visit  # no loads in the cpu miss mode
    host = (float(np.median([extra for extra, _ in on_host])) - cpu_deciding + passes.mean) / g.top_k
    issuing = issues.per_burst + g.top_k * issues.per_load + deciding[MissMode.LOAD].per_visit + \
        g.top_k * deciding[MissMode.LOAD].per_load
    # resuming per layer against the layer's stall, the median request on each link: a line through 0
    # (an uncapped link barely stalls: nothing to measure it by)
    x, y = np.asarray([[stall, extra - issuing] for extra, stall in (np.nanmedian(pts, axis=0) for pts in points)]).T
    capped = om.devices[0].type == "cuda" or bool(link.bandwidth)
    slope = float(x @ y / (x @ x)) if capped and x @ x > 0 else 0.0
    loads = HostCosts(issues.per_load, issues.per_burst, slope if slope > 0 and np.isfinite(slope) else 0.0)
    return RuntimeCosts(loads.scaled(speed), passes.mean * speed, passes.experts / max(passes.passes, 1),
                        max(host, 0.0) * speed, factor)


def between_baselines(base: Any, runs: Sequence[Any], p: Prompt, max_new_tokens: int) -> list[tuple[Any, float]]:
    """`p` through each of `runs` in turn, with a request of the all-resident `base` session
    before the first and after each: every run's request timing and the mean of the baseline's
    median steps either side of it (a shared machine's speed drifts by tens of percent within
    seconds, and a request's latency follows its neighbours'; the order of sessions matters too,
    so `calibrate` and `validate` measure in this one)."""
    before = median_step([base.request(p, max_new_tokens)])
    out = []
    for run in runs:
        r = run.request(p, max_new_tokens)
        after = median_step([base.request(p, max_new_tokens)])
        out.append((r, (before + after) / 2))
        before = after
    return out


def median_step(timings: Sequence[Any]) -> float:
    """The requests' median decode-step time."""
    return float(np.median([x for r in timings for x in r.token_latency]))


def median_busy(timings: Sequence[Any]) -> float:
    """The requests' median decode-step time not spent waiting for copies."""
    return float(np.median([x - y for r in timings for x, y in zip(r.token_latency, r.token_stall)]))


def resident_step(om: OffloadedModel, prompts: Sequence[Prompt], max_new_tokens: int) -> float:
    """Median decode-step time of the offloaded runtime with room for every expert and an
    uncapped link (first-touch copies cost a memcpy): its compute alone."""
    with baseline(om, prompts, max_new_tokens) as s:
        for p in prompts:
            s.request(p, max_new_tokens)
        return median_step(s.timings)


def baseline(om: OffloadedModel, prompts: Sequence[Prompt], max_new_tokens: int) -> Any:
    """A session with every expert's slot and no link cap: the stall-free reference."""
    return om.session(get_policy("lru"), Capacity(om.geometry.experts), prompts, max_new_tokens=max_new_tokens,
                      link=EmulatedLink())


def refit(cal: Calibration, om: OffloadedModel, step_s: float, prompts: Sequence[Prompt], max_new_tokens: int) -> Calibration:
    """`cal` with the simulator's overheads fitted to a decode step of `step_s` seconds:
    L * (dense(1) + pass + k * expert(1)) + head(1) = step_s, with the roofline parts from `cal` and
    expert(1) as the simulator charges it (the roofline's memory term can exceed the measured
    marginal expert time: an expert small enough to stay in cache streams faster than DRAM)."""
    g = om.geometry
    base = replace(cal, step_s=step_s, layer_overhead=0.0, expert_overhead=0.0)
    roof = Machine(model_preset(om.model, g), base.profile()).compute(g.layer_expert_bytes)
    expert_overhead = max(cal.expert_s - roof.expert(0, 1), 0.0)
    expert = roof.expert(0, 1) + expert_overhead  # what the simulator charges per expert, token
    context = int(np.mean([len(p.ids) for p in prompts])) + max_new_tokens // 2
    rest = step_s - g.layers * (roof.dense(1, context, context) + cal.expert_pass + g.top_k * expert) - roof.head(1)
    return replace(base, layer_overhead=max(rest / (g.layers + 1), 0.0), expert_overhead=expert_overhead)
