"""casmoe held against published measurements of real offloading systems: `casmoe validate --published`.

`casmoe/sim/trust/published/measurements.toml` holds what papers, project READMEs and users measured, each
row with its source and, where casmoe can express it, its configuration in casmoe's terms
(`run`: the options of `casmoe simulate`, the box as a profile of `casmoe/sim/trust/published/profiles/`,
the runtime as a stack of `casmoe/sim/cost/stacks/`); a row casmoe cannot express says why (`scope`).

No number is predicted by a constant fitted on it:

- a stack's fitted fields name the rows they are fitted on (`fitted_on` in `casmoe/sim/cost/stacks/NAME.toml`,
  its simplest runs: an on-demand or all-on-GPU row); those rows are fit rows, never scored.
  Which rows: the system's own authors' or users' measurements where there are any, a paper
  table before a README, and a README row only where no paper row determines the field (a
  per-expert cost needs a model with many experts); this rule was written down in session 6
  after README-fitted DeepSpeed stacks had predicted the paper rows 0.41-0.54x (bench/RESULTS.md
  keeps both results);
- the shared defaults every stack without its own measurement takes (`casmoe/sim/cost/stacks/shared.toml`:
  the host kernels' share of DRAM bandwidth) are fitted leaving each system out in turn: a
  system's rows are predicted with the value fitted on the other systems' rows, and its stack is
  fitted under that value;
- `--fit` writes the constants fitted on every row (what users get) into the stack files.

Each prediction simulates the row's run on a trace of the model's routing shape: the shipped
trace where one exists (tiny-mixtral's routing for Mixtral-8x7B, synthetic-qwen3-top8 for
Qwen3-30B-A3B), else a synthetic one (`casmoe.synthetic`, default knobs) at the row's prompt and
output lengths and top-k. The spreads it measures per kind of configuration are what simulate,
search and the leaderboard print beside their figures (`spread`).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib
from casmoe.sim.cost.stack import Shared, Stack, load_shared, load_stack

from casmoe.errors import CasmoeError
from casmoe.sim.trust.uncertainty import FAMILIES, MEASUREMENTS, SPREAD_FILE, family_of

SHIPPED_TRACES = {"mixtral-8x7b": ("tiny-mixtral.npz", 2), "qwen3-30b-a3b": ("synthetic-qwen3-top8.npz", 8)}
"""Model preset -> (shipped trace of its routing shape, its top-k)."""
REQUESTS = 3
"""Requests of each row's trace simulated (the first held-out ones)."""
DECODE_TOKENS = 48
"""Decode tokens of each simulated request (a cache's decode rate settles within a few dozen)."""
STREAM_DECODE_TOKENS = 16
"""Decode tokens of the one request a streaming row simulates (every token pays the same)."""
SYNTHETIC_REQUESTS = 16
"""Requests of a synthetic trace: a policy that fits (MoE-Infinity's collection) fits on the
train part, the held-out ones are scored."""
RATES = {"decode_tok_s": "decode_tokens_per_s", "s_per_token": "decode_tokens_per_s"}
"""Published metric -> the simulate field it is compared with (as a rate: s_per_token inverted)."""


class ValidationError(CasmoeError, ValueError):
    """A published table or stack that cannot be validated as written."""


@dataclass(frozen=True)
class Row:
    """One published measurement (`measurements.toml`): its source, what was measured, and its
    configuration in casmoe's terms (`run`) or why it has none (`scope`)."""

    id: str
    system: str
    kind: str
    source: str
    metric: str
    value: float
    run: dict[str, Any] | None
    scope: str
    model: str
    box: str
    prompt_tokens: int
    output_tokens: int

    @property
    def rate(self) -> float:
        """The measured rate (tokens/s), whatever unit the source printed."""
        return 1.0 / self.value if self.metric == "s_per_token" else self.value

    @property
    def stack(self) -> str:
        return (self.run or {}).get("stack", "ideal")

    @property
    def family(self) -> str:
        """The kind of configuration, for the spreads (`uncertainty.family_of`)."""
        return family_of(self.run or {})


def load_rows(path: Path = MEASUREMENTS) -> list[Row]:
    rows = [row_from_dict(r, str(path)) for r in tomllib.loads(path.read_text())["row"]]
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValidationError(f"{path}: row ids repeat")
    return rows


def row_from_dict(r: dict[str, Any], where: str) -> Row:
    """One `[[row]]` of the published schema (a user's measurements, `casmoe.sim.questions.calibration`,
    are put in this schema first, so both tables mean the same by each key)."""
    if r.get("run") is not None and r["metric"] not in RATES:
        raise ValidationError(f"{where}: row {r['id']}: metric {r['metric']!r} cannot be validated yet (only {', '.join(RATES)})")
    return Row(r["id"], r["system"], r["kind"], r["source"], r["metric"], float(r["value"]), r.get("run"),
               r.get("scope", ""), str(r.get("model", "")), str(r.get("box", "")),
               int(r.get("prompt_tokens") or 0), int(r.get("output_tokens") or 0))


# ---- predicting one row ---------------------------------------------------------------------------


def trace_for(row: Row) -> tuple[Path, int]:
    """The trace a row's run replays (its first `requests` held-out requests are scored), and
    that count: the shipped trace of the model's routing shape where one exists, else a
    synthetic one, its requests cut to a few dozen decode tokens (a decode rate settles within
    them: streaming at once, caches within a few dozen tokens)."""
    from casmoe.shipped import shipped

    run = row.run or {}
    model = run["model"]
    top_k = run.get("top_k")
    stream = row.family == "stream"  # every token pays the same: one short request measures it
    decode, requests = (STREAM_DECODE_TOKENS, 1) if stream else (DECODE_TOKENS, REQUESTS)
    name, k = SHIPPED_TRACES.get(model, (None, None))
    if name is not None and top_k in (None, k):
        source = shipped(name)
    else:
        source = synthetic_trace(model, top_k, row.prompt_tokens or 128, decode)
    return _cut(source, decode), requests


def _cut(source: Path, decode: int) -> Path:
    """`source` with every request's decode cut to `decode` tokens, kept in the user cache
    under its content and the cut."""
    from casmoe.planner.embedding import cache_dir
    from casmoe.trace import Request, Trace
    from casmoe.trace_io import load_trace, save_trace

    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    path = cache_dir(create=True) / f"validation-{source.stem}-{digest}-d{decode}.npz"
    if not path.exists():
        whole = load_trace(str(source))

        def cut(r: Request) -> Request:
            end = r.prefill + decode
            arrays = {n: getattr(r, n)[:end] for n in ("topk", "weights", "logits", "spec") if getattr(r, n) is not None}
            return replace(r, **arrays, output_ids=None, output=None)

        save_trace(Trace(whole.geometry, [cut(r) for r in whole.requests], dict(whole.meta)), path)
    return path


def synthetic_trace(model: str, top_k: int | None, prompt: int, output: int) -> Path:
    """A synthetic trace of `model`'s routing shape (`casmoe.synthetic`, default knobs; enough
    requests that a held-out few are left after the fit part), kept in the user cache."""
    from dataclasses import replace as with_

    from casmoe.planner.embedding import cache_dir
    from casmoe.presets import get_preset
    from casmoe.synthetic import SynthConfig, generate
    from casmoe.trace_io import save_trace

    g = get_preset(model).geometry
    if top_k is not None:
        g = with_(g, top_k=int(top_k))
    cfg = SynthConfig(requests=SYNTHETIC_REQUESTS, prefill=(prompt, prompt), decode=(output, output), spec=True, seed=0)
    key = hashlib.sha256(json.dumps([g.to_dict(), repr(cfg)], sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir(create=True) / f"validation-{model}-{key}.npz"
    if not path.exists():
        save_trace(generate(g, cfg), path)
    return path


def specs_for(row: Row, stack: Stack | None = None) -> list[Any]:
    """The run of a row (a list of one), with `stack` in place of the named one when given."""
    from casmoe.sim.run.grid import Grid

    run = dict(row.run or {})
    run.pop("top_k", None)
    path, requests = trace_for(row)
    # the published run ran on its box: casmoe's memory check (which does not know each engine's
    # buffers) must not refuse it; the timing is what is validated here
    grid = Grid.of({**run, "trace": str(path), "requests": requests, "split": "heldout", "allow_overcommit": True},
                   f"row {row.id}")
    if stack is not None:
        grid = grid.with_values(stack=stack)
    specs = grid.specs(strict=True).specs
    if len(specs) != 1:  # a bare policy name runs its variants, a missing capacity the default sizes
        runs = [s.describe() for s in specs]
        varies = sorted(k for k in runs[0] if len({json.dumps(r.get(k), default=str) for r in runs}) > 1)
        raise ValidationError(f"row {row.id}: its run expands to {len(specs)} runs, differing in {', '.join(varies)}; "
                              "a row is one configuration: give one value of each (a policy's variant, a capacity)")
    return specs


def predict(row: Row, stack: Stack | None = None) -> float:
    """The row's metric as a rate, as casmoe predicts it (remembered per row content, trace size
    and stack values: the fits ask for the same runs again; two tables may reuse an id)."""
    key = (row.id, json.dumps(row.run, sort_keys=True, default=str), row.metric, row.prompt_tokens,
           (REQUESTS, DECODE_TOKENS, STREAM_DECODE_TOKENS),
           None if stack is None else json.dumps(stack.to_dict(), sort_keys=True, default=str))
    if key not in _PREDICTED:
        from casmoe.sim.run.runner import run

        (spec,) = specs_for(row, stack)
        _PREDICTED[key] = float(run(spec)[RATES[row.metric]])
    return _PREDICTED[key]


_PREDICTED: dict[tuple, float] = {}


# ---- fitting ------------------------------------------------------------------------------------


FIT_BOUNDS = {"step_us": (0.0, 5e6), "layer_us": (0.0, 1e5), "expert_us": (0.0, 1e5), "expert_loop_us": (0.0, 1e5), "host_expert_us": (0.0, 1e5),
              "copy_us": (0.0, 1e5), "host_efficiency": (0.01, 1.0), "gpu_efficiency": (0.01, 1.0),
              "copy_efficiency": (0.01, 1.0)}


def fit_stack(stack: Stack, rows: dict[str, Row], shared: Shared) -> tuple[Stack, dict[str, float]]:
    """`stack` with its fitted fields (`fitted_on`) solved on their rows, under `shared`:
    least squares of log(predicted / published); returns it (its zeros still meaning the shared
    default) and each field's standard error
    (how well the rows determine it; inf when as many fields as rows leave no residual)."""
    import numpy as np
    from scipy.optimize import least_squares

    fields_ = list(stack.fitted_on)
    if not fields_:
        return stack, {}
    ids = sorted({i for f in fields_ for i in stack.fitted_on[f]})
    missing = [i for i in ids if i not in rows or rows[i].run is None]
    if missing:
        raise ValidationError(f"stack {stack.name}: fitted on rows that are not validated rows: {missing}")
    lo = np.array([FIT_BOUNDS[f][0] for f in fields_])
    hi = np.array([FIT_BOUNDS[f][1] for f in fields_])
    scale = np.where(hi > 1.0, 1000.0, 1.0)  # microseconds fitted in milliseconds

    def with_values(x: Sequence[float]) -> Stack:
        return replace(stack, **{f: float(v * s) for f, v, s in zip(fields_, x, scale)})

    def residuals(x: Sequence[float]) -> list[float]:
        s = with_values(x).resolved(shared)
        return [math.log(predict(rows[i], s) / rows[i].rate) for i in ids]

    start = {f: (getattr(stack, f) or (0.5 if hi_ <= 1.0 else 0.0)) for f, hi_ in zip(fields_, hi)}  # a 0 efficiency: start mid-way
    x0 = np.array([min(max(start[f], lo_), hi_) for f, lo_, hi_ in zip(fields_, lo, hi)]) / scale
    if "layer_us" in fields_:  # seed: the per-layer time the first row's measured token leaves over
        first = rows[ids[0]]
        layers = get_layers(first)
        base = predict(first, with_values(np.where(np.array(fields_) == "layer_us", 0.0, x0)).resolved(shared))
        gap = max(1.0 / first.rate - 1.0 / base, 0.0) / layers * 1e6
        x0[fields_.index("layer_us")] = min(gap, hi[fields_.index("layer_us")]) / 1000.0
    res = least_squares(residuals, x0, bounds=(lo / scale, hi / scale), diff_step=1e-2, xtol=1e-3, ftol=1e-4,
                        max_nfev=25)
    fitted = with_values(res.x)
    errors = {f: float("inf") for f in fields_}
    dof = len(ids) - len(fields_)
    if dof > 0:
        try:
            cov = np.linalg.inv(res.jac.T @ res.jac) * float(res.fun @ res.fun) / dof
            errors = {f: float(math.sqrt(max(cov[k, k], 0.0)) * scale[k]) for k, f in enumerate(fields_)}
        except np.linalg.LinAlgError:
            pass
    return fitted, errors


def get_layers(row: Row) -> int:
    from casmoe.presets import get_preset

    return get_preset((row.run or {})["model"]).geometry.layers


def uses_shared_host(row: Row, stacks: dict[str, Stack]) -> bool:
    """Whether the row computes experts on the host with the shared default efficiency (its
    stack neither states nor fits its own)."""
    stack = stacks[row.stack]
    return row.family == "host" and stack.host_efficiency == 0 and "host_efficiency" not in stack.fitted_on


def shared_without(system: str | None, stacks: dict[str, Stack], fit_system: dict[str, set[str]], base: Shared) -> Shared:
    """The shared host efficiency as the median of the host efficiencies stacks fitted on their
    own rows, leaving out the stacks fitted on rows of `system` (None: leave none out); `base`
    when no other stack fitted one."""
    own = {n: s.host_efficiency for n, s in stacks.items() if "host_efficiency" in s.fitted_on and system not in fit_system[n]}
    if not own:
        return base
    value = float(statistics.median(own.values()))
    return replace(base, host_efficiency=value,
                   sources={**base.sources, "host_efficiency": "median of the host efficiencies fitted by "
                            + ", ".join(f"{n} ({v:.3g})" for n, v in sorted(own.items()))})


BOUND_TOLERANCE = 1.15
"""How far a measurement may beat casmoe's speed bound before its written configuration is
taken to be wrong (the link rates of the published boxes are known to ~15%)."""


def bound(row: Row) -> float:
    """The fastest the row's configuration can run in casmoe's model: an ideal runtime (no cost
    of its own, copies at the link's pinned rate, host kernels at the host's peak bandwidth)."""
    ideal = replace(load_stack("ideal"), host_efficiency=1.0, host_flops_efficiency=1.0)
    return predict(row, ideal)


# ---- the whole table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    row: Row
    role: str  # "predicted", "fit" (a stack was fitted on it), "beyond bound" (faster than its configuration can run), "out of scope"
    predicted: float | None = None  # the rate
    shared: float | None = None  # the host efficiency in effect
    note: str = ""
    bound: float | None = None  # the rate of an ideal runtime in the row's configuration

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.rate

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r.id, "system": r.system, "kind": r.kind, "stack": r.stack if r.run else "", "family": r.family if r.run else "",
            "metric": r.metric, "published": r.value, "published_tok_s": r.rate, "predicted_tok_s": self.predicted,
            "ratio": self.ratio, "abs_log_ratio": None if self.ratio is None else abs(math.log(self.ratio)),
            "bound_tok_s": self.bound, "role": self.role, "host_efficiency": self.shared, "note": self.note or r.scope, "source": r.source,
        }


@dataclass
class Validation:
    results: list[Result]
    stacks: dict[str, Stack]  # fitted on every row (what `--fit` writes)
    shared: Shared
    errors: dict[str, dict[str, float]] = field(default_factory=dict)

    def predicted(self) -> list[Result]:
        return [r for r in self.results if r.role == "predicted"]

    def summary(self) -> dict[str, Any]:
        logs = [abs(math.log(r.ratio)) for r in self.predicted() if r.ratio]
        ratios = [r.ratio for r in self.predicted() if r.ratio]
        return {
            "rows": len(self.results),
            "predicted": len(logs),
            "fit_rows": sum(r.role == "fit" for r in self.results),
            "out_of_scope": sum(r.role == "out of scope" for r in self.results),
            "beyond_bound": [r.row.id for r in self.results if r.role == "beyond bound"],
            "systems": sorted({r.row.system for r in self.predicted()}),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "max_abs_log_ratio": max(logs) if logs else None,
            "beyond_2x": sum(x > math.log(2) for x in logs),
            "rankings": self.rankings(),
        }

    def rankings(self) -> dict[str, Any]:
        """Same-source comparisons: rows of one source, box, model and precision that differ in
        policy or system; each pair's measured order against the predicted one."""
        groups: dict[tuple, list[Result]] = {}
        for r in self.results:
            if r.predicted is None or r.role not in ("predicted", "fit"):
                continue
            run = r.row.run or {}
            key = (r.row.source.split(",")[0], run.get("hardware"), run.get("model"), run.get("quant"), r.row.metric)
            groups.setdefault(key, []).append(r)
        kept = broken = 0
        wrong = []
        for members in groups.values():
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    if abs(math.log(a.row.rate / b.row.rate)) < 0.02:  # a tie measured: no order to keep
                        continue
                    if (a.row.rate > b.row.rate) == (a.predicted > b.predicted):
                        kept += 1
                    else:
                        broken += 1
                        wrong.append(f"{a.row.id} vs {b.row.id}")
        return {"pairs": kept + broken, "kept": kept, "broken": wrong}

    def spreads(self) -> dict[str, dict[str, float]]:
        """Per kind of configuration (family x stack validated or not): the 80th percentile
        of |log ratio| over the predicted rows (how far to trust a figure of that kind)."""
        out: dict[str, dict[str, float]] = {}
        for kind in FAMILIES:
            logs = sorted(abs(math.log(r.ratio)) for r in self.predicted() if r.row.family == kind and r.ratio)
            if logs:
                q = logs[min(len(logs) - 1, math.ceil(0.8 * len(logs)) - 1)]
                out[kind] = {"p80_abs_log_ratio": q, "rows": len(logs), "median_abs_log_ratio": statistics.median(logs)}
        return out


def validate(rows: list[Row] | None = None, progress: Callable[[str], None] | None = None) -> Validation:
    """Predict every validated row as the module docstring says: leaving each system out for the
    shared constants, never scoring a stack's fit rows."""
    rows = load_rows() if rows is None else rows
    by_id = {r.id: r for r in rows}
    base = load_shared()
    say = progress or (lambda _: None)
    shipped = {n: load_stack(n) for n in sorted({r.stack for r in rows if r.run})}
    fit_rows = {i: n for n, s in shipped.items() for ids in s.fitted_on.values() for i in ids}
    for i, name in fit_rows.items():  # a stack fitted on a row that uses the shared default would tie the two
        if uses_shared_host(by_id[i], shipped):
            raise ValidationError(f"stack {name} is fitted on {i}, which uses the shared host efficiency: fit its own")
    say("the ideal bound of every row")
    bounds = {r.id: bound(r) for r in rows if r.run}
    beyond = {i for i, b in bounds.items() if by_id[i].rate > b * BOUND_TOLERANCE}
    for i, name in fit_rows.items():
        if i in beyond:
            raise ValidationError(f"stack {name} is fitted on {i}, which ran faster than its configuration can "
                                  f"({by_id[i].rate:.3g} tok/s against a bound of {bounds[i]:.3g}): fit it on another row")
    stacks, errors = {}, {}
    for name, s in shipped.items():
        say(f"fitting stack {name}")
        stacks[name], errors[name] = fit_stack(s, by_id, base)
    fit_system = {n: {by_id[i].system for ids in s.fitted_on.values() for i in ids} for n, s in shipped.items()}
    shared = shared_without(None, stacks, fit_system, base)
    results = []
    for system in sorted({r.system for r in rows if r.run}):
        mine = [r for r in rows if r.system == system and r.run]
        say(f"{system}: {len(mine)} rows")
        shared_s = shared_without(system, stacks, fit_system, base)
        for r in mine:
            stack = stacks[r.stack].resolved(shared_s)
            role = "fit" if r.id in fit_rows else "predicted"
            if r.id in beyond:
                results.append(Result(r, "beyond bound", bound=bounds[r.id], note=(
                    f"measured {r.rate:.3g} tok/s, faster than casmoe's bound for the configuration written for it "
                    f"({bounds[r.id]:.3g} tok/s: an ideal runtime, copies at the link's pinned rate): what ran is not "
                    "what the row says (a precision, a placement or a box the source does not state)")))
                continue
            try:
                results.append(Result(r, role, predict(r, stack), stack.host_efficiency,
                                      "a stack constant was fitted on this row" if role == "fit" else "", bounds[r.id]))
            except CasmoeError as exc:
                results.append(Result(r, "out of scope", note=f"cannot be simulated: {exc}"))
    results += [Result(r, "out of scope") for r in rows if not r.run]
    order = {r.id: k for k, r in enumerate(rows)}
    results.sort(key=lambda x: order[x.row.id])
    return Validation(results, stacks, shared, errors)


FITTED_MARK = " | fitted: "
"""Where a fitted field's source (why the field exists, what it stands for) ends and the record
of its last fit begins: a refit replaces the record, never the reason."""


def _fitted_source(why: str, value: float, error: float | None, ids: Sequence[str]) -> str:
    se = "not determined (as many fields as rows)" if error is None or math.isinf(error) else f"{error:.3g}"
    return (f"{why.split(FITTED_MARK)[0]}{FITTED_MARK}{value:.4g} (standard error {se}) on {', '.join(ids)} "
            "by casmoe validate --published --fit")


def write_fitted(v: Validation) -> list[Path]:
    """Write the constants fitted on every row: each stack's fitted fields, the shared defaults,
    and the spreads per kind of configuration."""
    from casmoe.sim.cost.stack import SHARED_FILE, stack_paths

    from casmoe.output import write_text

    written = []
    paths = stack_paths()
    for name, s in v.stacks.items():
        shipped = load_stack(name)
        sources = {**shipped.sources, **{f: _fitted_source(shipped.sources.get(f, ""), getattr(s, f), v.errors[name].get(f),
                                                           ids) for f, ids in shipped.fitted_on.items()}}
        fitted = replace(shipped, **{f: getattr(s, f) for f in shipped.fitted_on}, sources=sources)
        header = [line for line in paths[name].read_text().splitlines() if line.startswith("#")]
        written.append(write_text(paths[name], "\n".join([*header, fitted.to_toml()])))
    sh = v.shared
    text = ["# The constants every stack takes where it has no measurement of its own (a stack's 0 means",
            "# \"the shared default\"). Written by `casmoe validate --published --fit`, fitted on every validated",
            "# row that uses it; each system's rows are predicted with the value fitted leaving that system out.",
            f"host_efficiency = {sh.host_efficiency!r}", f"host_flops_efficiency = {sh.host_flops_efficiency!r}", "",
            "[sources]", f"host_efficiency = {json.dumps(sh.sources.get('host_efficiency', ''))}",
            f"host_flops_efficiency = {json.dumps(sh.sources.get('host_flops_efficiency', ''))}"]
    written.append(write_text(SHARED_FILE, "\n".join(text) + "\n"))
    spreads = v.spreads()
    lines = ["# How far casmoe's predictions land from published measurements, per kind of configuration",
             "# (casmoe validate --published --fit): the 80th percentile of |log(predicted / published)| over",
             "# the rows predicted (never fitted on). simulate, search and the leaderboard print it beside a figure."]
    for kind, d in spreads.items():
        lines += ["", f"[{kind}]"] + [f"{k} = {v_!r}" for k, v_ in d.items()]
    written.append(write_text(SPREAD_FILE, "\n".join(lines) + "\n"))
    return written
