"""Fidelity: the simulator's per-token latency against the real backend's, same policy and trace.

The backend runs on this machine with a link cap chosen so that loading one expert costs about
as much as computing one layer (the regime where the policy matters); it records its trace.
`calibrate` measures the same machine and link into a hardware profile; the simulator replays
the recorded trace with that profile, the same policy and capacity. The error is the relative
difference of the median decode-token latencies (Vidur, a published LLM-inference simulator,
reports under 9%).

Where the error comes from is reported beside it: the whole run's stall and compute (time not
stalled) in the backend and in the simulator, so a residual can be read as "the link/stall
model" or "the compute model".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from casmoe.backends.calibrate import Calibration, LoaderProbe, baseline, calibrate, median_busy, refit, resident_step
from casmoe.backends.copier import EmulatedLink, responsive_copies
from casmoe.backends.experts import model_preset
from casmoe.backends.runtime import OffloadedModel, Prompt
from casmoe.cache import Capacity, MissMode
from casmoe.policies.spec import PolicySpec


WAKE_SAMPLES = 8
"""Loader wake samples taken before each request of a validated run (see `LoaderProbe`)."""


@dataclass(frozen=True)
class Fidelity:
    """One policy's comparison; latencies in seconds."""

    policy: str
    capacity: str
    miss_mode: str
    backend_median: float
    sim_median: float
    backend_ttft: float
    sim_ttft: float
    backend_stall: float
    sim_stall: float
    hit_rate: float
    sim_hit_rate: float
    sim_median_upfront: float  # with the one calibration made before all runs
    sim_median_inrun: float  # compute fitted to this run's own stall-free step time (diagnostic)
    resident_step: float  # median decode step of the all-resident baseline interleaved with this run
    backend_compute: float  # the whole run, not stalled
    sim_compute: float
    wake: float  # measured beside this run: a waiting thread resumes this long after its copy lands

    @property
    def median_error(self) -> float:
        return abs(self.sim_median - self.backend_median) / self.backend_median

    @property
    def ttft_error(self) -> float:
        return abs(self.sim_ttft - self.backend_ttft) / self.backend_ttft

    @property
    def median_error_upfront(self) -> float:
        return abs(self.sim_median_upfront - self.backend_median) / self.backend_median

    @property
    def median_error_inrun(self) -> float:
        return abs(self.sim_median_inrun - self.backend_median) / self.backend_median

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["median_error"] = self.median_error
        d["ttft_error"] = self.ttft_error
        d["median_error_upfront"] = self.median_error_upfront
        d["median_error_inrun"] = self.median_error_inrun
        return d


def balanced_link(om: OffloadedModel, prompts: Sequence[Prompt], max_new_tokens: int) -> EmulatedLink:
    """A link on which one expert's copy takes as long as one layer's decode compute."""
    step = resident_step(om, prompts, max_new_tokens)
    return EmulatedLink(bandwidth=om.store.expert_bytes(0) / (step / om.geometry.layers))


def _paired(
    om: OffloadedModel, prompts: Sequence[Prompt], policy: Any, capacity: Capacity, max_new_tokens: int,
    options: dict[str, Any], miss_mode: MissMode, probe: LoaderProbe,
) -> tuple[Any, float]:
    """The policy's run, with an all-resident baseline request of the same prompt before and
    after each of its requests (a drift in the machine's speed cancels to first order) and
    loader wake samples before each; returns the run and the baseline's median decode step."""
    with om.session(policy, capacity, prompts, max_new_tokens=max_new_tokens, options=options,
                    miss_mode=miss_mode) as run, baseline(
        om, [p for p in prompts for _ in (0, 1)], max_new_tokens
    ) as base:
        for p in prompts:
            probe.wake(WAKE_SAMPLES)
            base.request(p, max_new_tokens)
            run.request(p, max_new_tokens)
            base.request(p, max_new_tokens)
        return run.result(), float(np.median([x for r in base.timings for x in r.token_latency]))


def validate(
    om: OffloadedModel,
    prompts: Sequence[Prompt],
    policies: Sequence[str],
    capacity: Capacity,
    *,
    max_new_tokens: int = 32,
    calibration: Calibration | None = None,
    progress: Callable[[str], None] | None = None,
    miss_modes: Sequence[MissMode] = (MissMode.LOAD,),
) -> tuple[list[Fidelity], Calibration]:
    """Run each policy on the backend (its `om.link`), replay its trace in the simulator with the
    calibrated profile, and compare. Calibrates `om` first unless `calibration` is given.

    On a shared machine the compute speed drifts with other load (by several times within
    minutes), so each policy request is paired with an all-resident baseline request of the same
    prompt just before it (room for every expert, no link cap), and the profile's overheads are refitted to the baseline's median
    decode step (`sim_median`); the loader's copy costs (bandwidth, per-copy latency, the wake-up
    of a waiting thread, which grows with the machine's load) are measured again just before
    each run. `sim_median_upfront` keeps the single up-front calibration for comparison, and
    `sim_median_inrun` fits compute to the run's own stall-free step time, which isolates the
    error of the link and stall model."""
    with responsive_copies():
        return _validate(om, prompts, policies, capacity, max_new_tokens, calibration, progress, miss_modes)


def _validate(
    om: OffloadedModel, prompts: Sequence[Prompt], policies: Sequence[str], capacity: Capacity, max_new_tokens: int,
    calibration: Calibration | None, progress: Callable[[str], None] | None, miss_modes: Sequence[MissMode],
) -> tuple[list[Fidelity], Calibration]:
    from casmoe.sim.engine import simulate

    cal = calibration or calibrate(om, prompts, max_new_tokens=max_new_tokens)
    upfront = cal.profile("validate")
    preset = model_preset(om.model, om.geometry)
    out = []
    for text in policies:
        spec = PolicySpec.parse(text)
        if progress is not None:
            progress(spec.label)
        cls, options = spec.cls, dict(spec.options)
        for mode in miss_modes:
            probe = LoaderProbe(om, om.devices[0], om.link, cal.step_s / om.geometry.layers)
            try:
                bandwidth, latency = probe.line(20)
                run, step = _paired(om, prompts, cls, capacity, max_new_tokens, options, mode, probe)
            finally:
                probe.close()
            c = probe.result(bandwidth, latency)
            # compute-thread costs scale with the machine's speed, measured by the paired baseline
            now = replace(cal.at_speed(step), copy_bw=c.bandwidth, copy_latency=c.latency, wake=c.wake)
            busy = median_busy(run.requests)
            paired = refit(now, om, step, prompts, max_new_tokens).profile("validate")
            sims = tuple(
                simulate(run.trace, cls, capacity, profile, preset, options=options, miss_mode=mode)
                for profile in (paired, upfront, refit(now, om, busy, prompts, max_new_tokens).profile("validate"))
            )
            out.append(_fidelity(spec.label, capacity, mode, run, step, sims, c.wake))
    return out, cal


def _fidelity(label: str, capacity: Capacity, mode: MissMode, run: Any, step: float, sims: tuple[Any, ...],
              wake: float) -> Fidelity:
    sim, sim0, sim1 = sims
    lat = [x for r in run.requests for x in r.token_latency]
    total = sum(r.ttft + sum(r.token_latency) for r in run.requests)
    return Fidelity(
        policy=label,
        capacity=capacity.describe(),
        miss_mode=mode.value,
        backend_median=float(np.median(lat)),
        sim_median=sim.token_latency_p50_s,
        backend_ttft=float(np.mean([r.ttft for r in run.requests])),
        sim_ttft=sim.ttft_mean_s,
        backend_stall=run.stall,
        sim_stall=sim.stall_s,
        hit_rate=run.stats.hit_rate,
        sim_hit_rate=sim.stats.hit_rate,
        sim_median_upfront=sim0.token_latency_p50_s,
        sim_median_inrun=sim1.token_latency_p50_s,
        resident_step=step,
        backend_compute=total - run.stall,
        sim_compute=sim.compute_s,
        wake=wake,
    )
