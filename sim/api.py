"""What-ifs from Python: `casmoe.sim.simulate(...)` is `casmoe simulate` as a function.

Same defaults (the shipped trace's first requests, every GPU of the profile, every policy, the
cache sizes the box holds, the requests no fitted policy saw), same validation (a capacity, a
device count or RAM the profile lacks is refused unless `allow_overcommit`), and options as the
command line takes them (`quant="bf16"`, `capacities=[4, "24GB"]`, `policies=["lru",
"casmoe[predictor=noisy]"]`). The answer holds one record per run, as `results.json`, and a
pandas DataFrame of them:

    >>> import casmoe.sim
    >>> res = casmoe.sim.simulate(policies=["lru", "lfu"], capacities=[2, 4], requests=2)
    >>> res.frame()[["policy", "capacity", "decode_tokens_per_s"]]  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, check_arguments
from casmoe.policies import POLICIES, PolicySpec, parse_policies
from casmoe.selection import Selection
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.sim.serving import Workload
from casmoe.sim.sweep import run_point
from casmoe.sim.timeline import Timeline
from casmoe.sim.whatif import WhatIf, what_if

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Results:
    """The runs of one what-if: `records` (dicts, a `skipped` entry for a run that could not
    be built), `plan` (trace, preset, box, points) and what the user should know (`notes`)."""

    records: list[dict[str, Any]]
    plan: WhatIf

    @property
    def notes(self) -> list[str]:
        return self.plan.notes

    def frame(self) -> pd.DataFrame:
        """The runs that ran, one row each (columns as results.csv; nested values as lists)."""
        import pandas as pd

        return pd.DataFrame([r for r in self.records if "skipped" not in r])

    def headline(self) -> list[str]:
        """The fastest policy per cache size, as `casmoe simulate` prints it."""
        from casmoe.report import headline

        return headline([r for r in self.records if "skipped" not in r])


def _texts(values: Any) -> list[str]:
    """One value or several, as the command line's repeatable flags."""
    if values is None:
        return []
    if isinstance(values, (str, int, PolicySpec)) and not isinstance(values, bool):
        values = [values]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, PolicySpec)):
            raise CasmoeError(f"expected a name, a number of slots or a memory size such as '24GB', got {v!r}")
        out.append(v)
    return out


def _with_fitted_planner(specs: list[PolicySpec], source: Path, gating: float | None) -> tuple[list[PolicySpec], Any]:
    """`specs` with `casmoe[planner=auto]` before CasMoE's oracle brackets, its planner fitted
    now (or read from the cache) on the train split of `source` as the runs will route it
    (`casmoe.planner.cached`); `specs` as they are for a trace without prompts."""
    from casmoe.gating import gate_trace
    from casmoe.planner.cached import AUTO, cached_planner
    from casmoe.trace_io import load_trace

    fitted = cached_planner(gate_trace(load_trace(source), gating))
    if fitted is None:
        return specs, None
    at = next((i for i, s in enumerate(specs) if s.name == "casmoe"), len(specs))
    return [*specs[:at], PolicySpec("casmoe", (("planner", AUTO),)), *specs[at:]], fitted


def simulate(
    trace: str | os.PathLike[str] | None = None,
    policies: str | Iterable[str | PolicySpec] | None = None,
    capacities: int | str | Iterable[int | str] | None = None,
    *,
    global_capacities: int | str | Iterable[int | str] | None = None,
    model: str | None = None,
    hardware: str | os.PathLike[str] = "rtx4090x4",
    batch: int = 1,
    miss_mode: str = "load",
    quant: str | None = None,
    devices: int = 0,
    pinned: bool = True,
    requests: int | None = None,
    split: str = "auto",
    tasks: Sequence[str] = (),
    span: str = "",
    arrival: str | None = None,
    rate: float | None = None,
    users: int | None = None,
    think: float = 0.0,
    max_batch: int = 8,
    schedule: str = "prefill-first",
    chunk: int = 512,
    seed: int = 0,
    host_cache: str | None = None,
    host_policy: str = "lru",
    allow_overcommit: bool = False,
    adaptive_gating: float | None = None,
    timeline: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Results:
    """Simulate `policies` x `capacities` on `hardware`; the arguments are `casmoe simulate`'s
    options (see `casmoe simulate --help`), with its defaults. `timeline` writes a
    Chrome/Perfetto trace of the first run; `progress(done, total)` is called after each run."""
    check_arguments(simulate, locals())
    policy_texts = [p.label if isinstance(p, PolicySpec) else p for p in _texts(policies)]
    source = Path(trace) if trace is not None else shipped(DEFAULT_TRACE)
    specs, fitted = parse_policies(policy_texts, POLICIES), None
    if not policy_texts:  # every policy: CasMoE with a real planner too, beside its oracle brackets
        specs, fitted = _with_fitted_planner(specs, source, adaptive_gating)
    caps = [CapacitySpec(str(c)) for c in _texts(capacities)]
    caps += [CapacitySpec(str(c), per_layer=False) for c in _texts(global_capacities)]
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise CasmoeError(f"batch must be a whole number >= 1, got {batch!r}")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 0:
        raise CasmoeError(f"devices must be a whole number >= 0 (0: every GPU of the profile), got {devices!r}")
    workload = Workload.from_options(arrival, rate, users, think, max_batch, schedule, chunk, seed)
    plan = what_if(
        source, specs, caps, shipped=trace is None, model=model, hardware=hardware,
        batch=batch, miss_mode=miss_mode, quant=quant, devices=devices, pinned=pinned, requests=requests,
        selection=Selection.of(split, tasks, span), workload=workload, host_cache=host_cache,
        host_policy=host_policy, overcommit=allow_overcommit, gating=adaptive_gating,
    )
    if fitted is not None:
        plan.notes.append(fitted.describe())
    first = plan.points[0]
    recorder = None if timeline is None else Timeline(plan.trace.geometry.experts, plan.devices,
                                                      f"{first.policy.label} @ {first.capacity.label}")
    records = []
    for i, p in enumerate(plan.points):
        try:
            records.append(run_point(p, recorder if i == 0 else None))
        except CasmoeError as exc:
            if len(plan.points) == 1:
                raise
            records.append({**p.describe(), "skipped": str(exc)})
        if progress is not None:
            progress(i + 1, len(plan.points))
    if all("skipped" in r for r in records):  # nothing to report: a refusal, not an empty table
        raise CasmoeError(f"no run could be simulated; {records[0]['policy']} @ {records[0]['capacity_spec']}: "
                          f"{records[0]['skipped']}")
    if recorder is not None:
        recorder.write(Path(timeline))
    return Results(records, plan)
