"""Fidelity: the simulator's per-token latency against the real backend's, same policy and trace.

The backend runs on this machine with a link cap chosen so that loading one expert costs about
as much as computing one layer (the regime where the policy matters); it records its trace.
`calibrate` measures the same machine and link into a hardware profile; the simulator replays
the recorded trace with that profile, the same policy and capacity. The error is the relative
difference of the median decode-token latencies (Vidur, a published LLM-inference simulator,
reports under 9%). Beside it, two views that a bimodal latency cannot swing: `token_error`, the
median over decode tokens of each token's simulated latency against its own measured one (the
simulator replays the run's own trace, so token t is the same work in both), and the error of
the mean. Why: on the balanced link a prefetching policy's copies land about when the next layer
needs them, so its tokens split into a fast and a slow mode (SE-MoE's 50th and 60th percentiles
15 ms apart on a 58 ms token, bench/RESULTS.md, "What validate backend measures") and the median alone jumps between them
with a percent of drift.

Where the error comes from is reported beside it: the whole run's stall and compute (time not
stalled) in the backend and in the simulator, so a residual can be read as "the link/stall
model" or "the compute model"; and the backend's own repeatability (its first run repeated in
the same rounds), under which an error is noise.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from casmoe.backends.calibrate import (
    Calibration,
    DecisionCost,
    LoaderProbe,
    baseline,
    between_baselines,
    calibrate,
    decision_cost,
    median_busy,
    median_step,
    refit,
    resident_step,
)
from casmoe.backends.copier import EmulatedLink, responsive_copies
from casmoe.backends.experts import model_preset
from casmoe.backends.runtime import OffloadedModel, Prompt
from casmoe.cache import Capacity, MissMode
from casmoe.policies import get_policy
from casmoe.policies.spec import PolicySpec
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.assembly import Run
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.latency import LatencyLog

WAKE_SAMPLES = 16
"""Loader wake samples taken before each round of the validated runs (see `LoaderProbe`)."""
NOISE_LIMIT = 0.05
"""The noise floor above which validate judges nothing: the backend's own latency for the same
work moves more than the 5% error the simulator is held to."""


def relative_error(measured: float, reference: float) -> float:
    """|measured - reference| / reference: every error validate reports."""
    return abs(measured - reference) / reference


def baseline_spread(medians: Sequence[float], per_round: int) -> float:
    """The noise floor the baselines show: the median, over consecutive baseline requests of one
    round (the same prompt, the same all-resident work, a run's request apart), of how far
    their median decode steps differ relative to their mean. A run's request is simulated at
    the mean of its two neighbours, so a machine whose speed moves this much between them can
    fake an error of about this size."""
    rounds = [medians[i : i + per_round] for i in range(0, len(medians), per_round)]
    steps = [relative_error(b, a) for r in rounds for a, b in zip(r, r[1:])]
    return float(np.median(steps)) if steps else 0.0


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
    token_error: float  # the median over decode tokens of |simulated - backend| / backend, token by token
    backend_mean: float  # mean decode-token latency
    sim_mean: float
    sim_median_pooled: float  # every request at the baseline's median step over all rounds
    sim_median_upfront: float  # with the one calibration made before all runs
    sim_median_inrun: float  # compute fitted to this run's own stall-free step time (diagnostic)
    resident_step: float  # median decode step of the all-resident baseline, all rounds
    backend_compute: float  # the whole run, not stalled
    sim_compute: float
    wake: float  # measured beside the runs: a waiting thread resumes this long after its copy lands
    backend_decide: float  # the whole run's seconds in the cache's decisions, by the backend's own timers
    sim_decide: float  # the same decisions timed over a replay (what `decide_us` was fitted to)
    decide_visit: float  # what the simulator charged per layer visit beyond the baseline's (at the median speed)
    decide_load: float  # and per load a visit asked for
    repeat_error: float  # the first run's backend median against a repeat of it in the same rounds
    baseline_spread: float  # consecutive identical baseline requests' medians apart (`baseline_spread`)

    ERRORS = {"median_error": ("sim_median", "backend_median"), "mean_error": ("sim_mean", "backend_mean"),
              "ttft_error": ("sim_ttft", "backend_ttft"),
              "median_error_pooled": ("sim_median_pooled", "backend_median"),
              "median_error_upfront": ("sim_median_upfront", "backend_median"),
              "median_error_inrun": ("sim_median_inrun", "backend_median")}

    def error(self, name: str) -> float:
        """One of `ERRORS`: a simulated figure against the backend's."""
        sim, backend = self.ERRORS[name]
        return relative_error(getattr(self, sim), getattr(self, backend))

    @property
    def median_error(self) -> float:
        return self.error("median_error")

    @property
    def noise_floor(self) -> float:
        """How far the backend's own latency moved for the same work during the validation."""
        return max(self.repeat_error, self.baseline_spread)

    @property
    def too_noisy(self) -> bool:
        return self.noise_floor > NOISE_LIMIT

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, **{name: self.error(name) for name in self.ERRORS}, "noise_floor": self.noise_floor,
                "too_noisy": self.too_noisy}


def balanced_link(om: OffloadedModel, prompts: Sequence[Prompt], max_new_tokens: int) -> EmulatedLink:
    """A link on which one expert's copy takes as long as one layer's decode compute."""
    step = resident_step(om, prompts, max_new_tokens)
    return EmulatedLink(bandwidth=om.store.expert_bytes(0) / (step / om.geometry.layers))


def _interleaved(
    om: OffloadedModel, prompts: Sequence[Prompt], runs: Sequence[tuple[Any, dict[str, Any], MissMode]],
    capacity: Capacity, max_new_tokens: int, probe: LoaderProbe, progress: Callable[[str], None] | None,
) -> tuple[list[Any], list[list[float]], float]:
    """Every run's requests in rounds, one prompt per round: loader wake samples, then the
    runs' requests between baseline ones (`between_baselines`; the runs take turns going
    first). Returns the runs' results, each request's resident step (its neighbours'), the
    baseline's median step over all rounds and the baselines' spread (`baseline_spread`)."""
    with ExitStack() as stack:
        sessions = [
            stack.enter_context(om.session(cls, capacity, prompts, max_new_tokens=max_new_tokens, options=options,
                                           miss_mode=mode))
            for cls, options, mode in runs
        ]
        base = stack.enter_context(baseline(om, [p for p in prompts for _ in range(len(runs) + 1)], max_new_tokens))
        steps: list[list[float]] = [[] for _ in runs]
        for i, p in enumerate(prompts):
            probe.wake(WAKE_SAMPLES)
            turn = i % len(runs)
            order = [*range(turn, len(runs)), *range(turn)]
            for j, (_, step) in zip(order, between_baselines(base, [sessions[j] for j in order], p, max_new_tokens)):
                steps[j].append(step)
            if progress is not None:
                progress(f"prompt {i + 1}")
        spread = baseline_spread([median_step([t]) for t in base.timings], len(runs) + 1)
        return [s.result() for s in sessions], steps, median_step(base.timings), spread


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
    calibrated profile, and compare. Calibrates `om` first unless `calibration` is given;
    `progress` hears of each prompt's round.

    On a shared machine the compute speed drifts with other load (by tens of percent within
    seconds, several times within minutes), so the runs' requests are interleaved in rounds
    with all-resident baseline requests of the same prompt (room for every expert, no link
    cap), and each request is simulated on the machine its neighbours saw: the profile's
    compute-thread figures scaled, and its overheads refitted, to the mean of the baseline
    medians just before and after it (`sim_median`); the loader's copy costs (bandwidth,
    per-copy latency, the wake-up of a waiting thread, which grows with the machine's load)
    are measured beside the rounds. Diagnostics: `sim_median_pooled` simulates every request at
    the baseline's median over all rounds, `sim_median_upfront` with the single up-front
    calibration, and `sim_median_inrun` fits compute to the run's own stall-free step time,
    which isolates the error of the link and stall model. The first run is repeated in the
    rounds (not simulated): `repeat_error`, how far the backend's own median moves for the same
    work, and `baseline_spread`, how far consecutive identical baseline requests are apart, make
    the noise floor under which an error says nothing (`Fidelity.too_noisy` above
    `NOISE_LIMIT`)."""
    with responsive_copies():
        return _validate(om, prompts, policies, capacity, max_new_tokens, calibration, progress, miss_modes)


def _validate(
    om: OffloadedModel, prompts: Sequence[Prompt], policies: Sequence[str], capacity: Capacity, max_new_tokens: int,
    calibration: Calibration | None, progress: Callable[[str], None] | None, miss_modes: Sequence[MissMode],
) -> tuple[list[Fidelity], Calibration]:
    cal = calibration or calibrate(om, prompts, max_new_tokens=max_new_tokens)
    preset = model_preset(om.model, om.geometry)
    specs = [(spec, mode) for spec in map(PolicySpec.parse, policies) for mode in miss_modes]
    probe = LoaderProbe(om, om.devices[0], om.link, cal.step_s / om.geometry.layers)
    try:
        bandwidth, latency = probe.line(20)
        runs = [(spec.cls, dict(spec.options), mode) for spec, mode in specs]
        results, steps, step, spread = _interleaved(om, prompts, runs + runs[:1], capacity, max_new_tokens, probe, progress)
    finally:
        probe.close()
    c = probe.result(bandwidth, latency)
    repeat, first = median_step(results.pop().requests), median_step(results[0].requests)

    def profile(step_s: float, decide: DecisionCost) -> Any:
        """The machine at a resident decode step of `step_s`: compute-thread costs scale with its
        speed (the policy's decisions, timed after the rounds, at the rounds' median speed), the
        loader's are as measured beside the rounds."""
        at_cal = replace(cal, decide=decide.scaled(cal.step_s / step))
        now = replace(at_cal.at_speed(step_s), copy_bw=min(c.bandwidth, cal.mem_bw), copy_latency=c.latency, wake=c.wake)
        return refit(now, om, step_s, prompts, max_new_tokens).profile("validate")

    # each policy's own decisions, timed over a replay of its run's routing, beyond the
    # all-resident baseline's (whose visits the resident step holds)
    resident = decision_cost(results[0].trace, get_policy("lru"), Capacity(om.geometry.experts))
    out = []
    for (spec, mode), run, speeds in zip(specs, results, steps):
        decide = decision_cost(run.trace, spec.cls, capacity, dict(spec.options), miss_mode=mode).excess(resident)
        decide = decide.scaled(cal.decide_factor)  # as the compute thread runs them (`runtime_costs`)

        def sim(hw: Any, log: LatencyLog | None = None) -> Any:
            return run_trace(Run(run.trace, spec.cls, capacity, Machine(preset, hw), options=dict(spec.options), miss_mode=mode), latency=log)

        per_request = [_request_latencies(sim, profile(s, decide), i, run.requests) for i, s in enumerate(speeds)]
        lat = [x for tokens, _ in per_request for x in tokens]
        measured = [x for r in run.requests for x in r.token_latency]  # the same tokens, in the same order
        pooled = sim(profile(step, decide))
        at_upfront = sim(replace(cal, decide=decide.scaled(cal.step_s / step)).profile("validate"))
        inrun = sim(profile(median_busy(run.requests), decide))
        out.append(Fidelity(
            policy=spec.label,
            capacity=capacity.describe(),
            miss_mode=mode.value,
            backend_median=median_step(run.requests),
            sim_median=float(np.median(lat)),
            token_error=float(np.median([relative_error(s, b) for s, b in zip(lat, measured)])),
            backend_mean=float(np.mean(measured)),
            sim_mean=float(np.mean(lat)),
            backend_ttft=float(np.mean([r.ttft for r in run.requests])),
            sim_ttft=float(np.mean([ttft for _, ttft in per_request])),
            backend_stall=run.stall,
            sim_stall=pooled.stall_s,
            hit_rate=run.stats.hit_rate,
            sim_hit_rate=pooled.stats.hit_rate,
            sim_median_pooled=pooled.token_latency_p50_s,
            sim_median_upfront=at_upfront.token_latency_p50_s,
            sim_median_inrun=inrun.token_latency_p50_s,
            resident_step=step,
            backend_compute=sum(r.ttft + sum(r.token_latency) for r in run.requests) - run.stall,
            sim_compute=pooled.compute_s,
            wake=c.wake,
            backend_decide=run.decide_s,
            sim_decide=decide.measured_s,
            decide_visit=decide.per_visit,
            decide_load=decide.per_load,
            repeat_error=relative_error(repeat, first),
            baseline_spread=spread,
        ))
    return out, cal


def _request_latencies(sim: Callable[..., Any], hw: Any, i: int, requests: Sequence[Any]) -> tuple[list[float], float]:
    """Request `i`'s decode-step latencies and TTFT in a simulated run of all the requests on
    `hw` (the decode steps of requests one after another are in request order)."""
    log = LatencyLog()
    sim(hw, log)
    counts = [len(r.token_latency) for r in requests]
    if len(log.token_latency) != sum(counts):
        raise RuntimeError(f"the simulator took {len(log.token_latency)} decode steps, the backend {sum(counts)}")
    first = sum(counts[:i])
    return log.token_latency[first:first + counts[i]], log.ttft[i]
