"""casmoe held against published measurements of real systems: `casmoe validate published`.

`casmoe/sim/trust/published/measurements.toml` holds what papers, project READMEs and users
measured, each row with its source and, where casmoe can express it, its configuration in
casmoe's terms (`run`: the options of `casmoe simulate`, the box as a profile of
`casmoe/sim/trust/published/profiles/`, the runtime as a stack of `casmoe/sim/cost/stacks/`); a
row casmoe cannot express says why (`scope`).

No number is predicted by a constant fitted on its own measurement. Each stack's unknown costs
(the fields its file lists under `[fitted_on]`: a per-layer cost, the host kernels' share of DRAM
bandwidth, ...) are fitted on that stack's rows, leaving one setup out at a time: the rows one
source measured on one box (`Row.group`) are predicted by constants fitted on every other
setup's rows, the same source's other boxes included: a user asking about their own box has the
whole table but never their own measurements. A stack measured on one setup only is predicted
from a prior instead: each field at the median of what the other stacks fitted, leaving that
setup out of their fits too. The interval printed beside a figure makes a stricter claim, and is
checked leaving whole sources out (`casmoe.sim.trust.error_model`). `--fit` writes the constants
fitted on every row (what users get) into the stack files, and the error model, fitted on the
left-out residuals, beside the table.

Fitting a stack on its rows needs each row's speed at many values of its constants, and a row
is a simulation. The fit works on a linear model of each row's time per token in its constants
(`Linear`: exact for the additive per-layer and per-expert costs, and for efficiencies in their
reciprocal, the form in which a bandwidth-bound time depends on them), built from a few
simulations around the current values and rebuilt once around the fit; every reported figure
is a simulation at the fitted values, never the linear model's.

Each prediction simulates the row's run on a trace of the model's routing shape: the shipped
trace where one exists (tiny-mixtral's routing for Mixtral-8x7B, synthetic-qwen3-top8 for
Qwen3-30B-A3B), else a synthetic one (`casmoe.synthetic`, default knobs) at the row's prompt and
output lengths and top-k. A prefill row (`prefill_tok_s`, llama-bench's pp) is one request of
its prompt length, timed to its first token.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import replace as with_
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.output import write_text
from casmoe.planner.embedding import cache_dir
from casmoe.presets.gguf import model_preset
from casmoe.shipped import shipped
from casmoe.sim.cost.stack import SHARED_FILE, Shared, Stack, load_shared, load_stack, stack_paths
from casmoe.sim.run.grid import Grid
from casmoe.sim.run.runner import run
from casmoe.sim.trust.error_model import MODEL_FILE, ErrorModel, Point, leave_one_source_out, point_of
from casmoe.sim.trust.error_model import fit as fit_error
from casmoe.sim.trust.uncertainty import MEASUREMENTS, family_of
from casmoe.synthetic import SynthConfig, generate
from casmoe.tables import read_table
from casmoe.trace import Request, Trace
from casmoe.trace_io import load_trace, save_trace

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
PREFILL_PROMPT = 512
"""Prompt tokens of a prefill row that does not state its own (llama-bench's default pp512)."""


def _decode_rate(record: dict[str, Any], row: Row) -> float:
    return float(record["decode_tokens_per_s"])


def _prefill_rate(record: dict[str, Any], row: Row) -> float:
    """Prompt tokens over the time to the first token of the one request simulated."""
    return float(record["prefill_tokens"]) / (float(record["ttft_mean_s"]) * int(record["requests"]))


RATES: dict[str, Callable[[dict[str, Any], Row], float]] = {
    "decode_tok_s": _decode_rate, "s_per_token": _decode_rate, "prefill_tok_s": _prefill_rate}
"""Published metric -> the rate a simulate record predicts for it (s_per_token compared as a rate)."""


class ValidationError(CasmoeError, ValueError):
    """A published table or stack that cannot be validated as written."""


@dataclass(frozen=True)
class Row:
    """One published measurement (`measurements.toml`): its source, what was measured, and its
    configuration in casmoe's terms (`run`) or why it has none (`scope`). `disputed` names the
    source a measurement contradicts, where another source measured the same configuration far
    apart: such a row is predicted and shown, never fitted on or counted in the summary.
    `faster_than_bound` says why a row measured faster than casmoe's bound for its written
    configuration (a source that misprints, a setting it does not state): such a row is shown
    beyond its bound, and a beyond-bound row without a reason fails the table's test."""

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
    url: str = ""
    disputed: str = ""
    faster_than_bound: str = ""

    @property
    def rate(self) -> float:
        """The measured rate (tokens/s), whatever unit the source printed."""
        return 1.0 / self.value if self.metric == "s_per_token" else self.value

    @property
    def stack(self) -> str:
        return (self.run or {}).get("stack", "ideal")

    @property
    def family(self) -> str:
        """The kind of configuration, for the error model (`uncertainty.family_of`)."""
        return family_of(self.run or {})

    @property
    def document(self) -> str:
        """The source a row comes from: the page it was read from (its address without the
        anchor or query: one thread, one README at a commit, one paper), else the document its
        locator names."""
        if self.url:
            u = urlsplit(self.url)
            return f"{u.netloc}{u.path}".rstrip("/")
        return self.source.split(",")[0].split(" (")[0].strip()

    @property
    def group(self) -> str:
        """One measurement setup, the unit a prediction leaves out: a source's rows on one box.
        A user asking about their own box has the whole table but not their own measurements:
        a row is predicted with every other setup's rows, its source's other boxes included,
        never with a row of its own setup."""
        return f"{self.document} @ {self.box or (self.run or {}).get('hardware', '')}"

    @property
    def prefill(self) -> bool:
        return self.metric == "prefill_tok_s"


def load_rows(path: Path = MEASUREMENTS) -> list[Row]:
    rows = [row_from_dict(r, str(path)) for r in read_table(path)["row"]]
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
               int(r.get("prompt_tokens") or 0), int(r.get("output_tokens") or 0), str(r.get("url", "")),
               str(r.get("disputed", "")), str(r.get("faster_than_bound", "")))


# ---- predicting one row ---------------------------------------------------------------------------


def trace_for(row: Row) -> tuple[Path, int]:
    """The trace a row's run replays (its first `requests` held-out requests are scored), and
    that count: the shipped trace of the model's routing shape where one exists, else a
    synthetic one, its requests cut to a few dozen decode tokens (a decode rate settles within
    them: streaming at once, caches within a few dozen tokens). A prefill row: one synthetic
    request of its prompt length and one decode token."""
    run = row.run or {}
    model = run["model"]
    top_k = run.get("top_k")
    if row.prefill:
        return synthetic_trace(model, top_k, row.prompt_tokens or PREFILL_PROMPT, 1), 1
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
    g = model_preset(model).geometry
    if top_k is not None:
        g = with_(g, top_k=int(top_k))
    cfg = SynthConfig(requests=SYNTHETIC_REQUESTS, prefill=(prompt, prompt), decode=(output, output), spec=True, seed=0)
    key = hashlib.sha256(json.dumps([g.to_dict(), repr(cfg)], sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir(create=True) / f"validation-{Path(model).stem}-{key}.npz"
    if not path.exists():
        save_trace(generate(g, cfg), path)
    return path


def specs_for(row: Row, stack: Stack | None = None) -> list[Any]:
    """The run of a row (a list of one), with `stack` in place of the named one when given."""
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
        (spec,) = specs_for(row, stack)
        _PREDICTED[key] = RATES[row.metric](run(spec), row)
    return _PREDICTED[key]


_PREDICTED: dict[tuple, float] = {}


FIT_BOUNDS = {"step_us": (0.0, 5e6), "layer_us": (0.0, 1e5), "expert_us": (0.0, 1e5), "expert_loop_us": (0.0, 1e5), "host_expert_us": (0.0, 1e5),
              "copy_us": (0.0, 1e5), "host_efficiency": (0.01, 1.0), "host_flops_efficiency": (0.01, 1.0),
              "gpu_efficiency": (0.01, 1.0),
              "copy_efficiency": (0.01, 1.0)}


def bound(row: Row) -> float:
    """The fastest the row's configuration can run in casmoe's model: an ideal runtime (no cost
    of its own, copies at the link's pinned rate, host kernels at the host's peak bandwidth)."""
    return predict(row, load_stack("ideal"))


BOUND_TOLERANCE = 1.15
"""How far a measurement may beat casmoe's speed bound before its written configuration is
taken to be wrong (the link rates of the published boxes are known to ~15%)."""


# ---- fitting a stack on many rows: a linear model of each row's time ------------------------------


RECIPROCAL = ("copy_efficiency", "gpu_efficiency", "host_efficiency", "host_flops_efficiency")
"""Fields a bandwidth-bound time is linear in the reciprocal of; the others (microseconds) add."""
PRIOR_WEIGHT = 0.01
"""How strongly a fit is held to its prior, per field, in the log of its linear form (`_floor`
added): a field off its prior by a factor e costs as much as one row off by 1%, so a few rows move
it over orders of magnitude, and a field no row determines stays put."""


def _to_x(stack: Stack, fields: Sequence[str]) -> np.ndarray:
    return np.array([1.0 / getattr(stack, f) if f in RECIPROCAL else float(getattr(stack, f)) for f in fields])


def _from_x(stack: Stack, fields: Sequence[str], x: Sequence[float]) -> Stack:
    lo, hi = _x_bounds(fields)
    x = np.clip(np.asarray(x, float), lo, hi)
    return replace(stack, **{f: float(1.0 / v if f in RECIPROCAL else v) for f, v in zip(fields, x)})


def _x_bounds(fields: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = [], []
    for f in fields:
        a, b = FIT_BOUNDS[f]
        lo.append(1.0 / b if f in RECIPROCAL else a)
        hi.append(1.0 / a if f in RECIPROCAL else b)
    return np.array(lo), np.array(hi)


def _scale(fields: Sequence[str]) -> np.ndarray:
    """A typical size of each field's change, in its linear form: microseconds in hundreds, an
    efficiency's reciprocal in ones (the solver's steps)."""
    return np.array([1.0 if f in RECIPROCAL else 100.0 for f in fields])


def _floor(fields: Sequence[str]) -> np.ndarray:
    """Added before the prior's log: a cost of 0 microseconds is 50 away from one of 50."""
    return np.array([0.0 if f in RECIPROCAL else 50.0 for f in fields])


@dataclass(frozen=True)
class Linear:
    """A row's time per token (seconds; a prefill row: per prompt token) as a linear function of
    a stack's fields around `x0` (`_to_x`): `t0 + grad @ (x - x0)`, from 1 + len(fields) runs."""

    row: Row
    x0: np.ndarray
    t0: float
    grad: np.ndarray

    def time(self, x: np.ndarray) -> float:
        return self.t0 + float(self.grad @ (x - self.x0))


def linearize(row: Row, stack: Stack, fields: Sequence[str]) -> Linear:
    """`row`'s time around `stack`'s values of `fields`: a run at them and one per field moved by
    a step (the time is linear in each; any step gives the same slope where it is)."""
    x0 = _to_x(stack, fields)
    t0 = 1.0 / predict(row, stack)
    grad = np.zeros(len(fields))
    lo, hi = _x_bounds(fields)
    for i, f in enumerate(fields):
        step = 0.25 * x0[i] if f in RECIPROCAL else max(0.25 * x0[i], 50.0)
        if x0[i] + step > hi[i]:
            step = -step
        x = x0.copy()
        x[i] += step
        grad[i] = (1.0 / predict(row, _from_x(stack, fields, x)) - t0) / step
    return Linear(row, x0, t0, grad)


def fit_linear(lins: Sequence[Linear], fields: Sequence[str], prior: np.ndarray) -> np.ndarray:
    """The values of `fields` (linear form) that best match the rows' measured times in log
    (least squares on the linear models), held weakly to `prior` (`PRIOR_WEIGHT`)."""
    from scipy.optimize import least_squares

    lo, hi = _x_bounds(fields)
    scale, floor = _scale(fields), _floor(fields)
    measured = np.array([math.log(1.0 / lin.row.rate) for lin in lins])
    x0s = np.array([lin.x0 for lin in lins])
    t0s = np.array([lin.t0 for lin in lins])
    grads = np.array([lin.grad for lin in lins])

    def residuals(x: np.ndarray) -> np.ndarray:
        times = np.maximum(t0s + np.einsum("rf,rf->r", grads, x[None, :] - x0s), 1e-9)
        return np.concatenate([np.log(times) - measured, PRIOR_WEIGHT * (np.log(x + floor) - np.log(prior + floor))])

    start = np.clip(prior, lo, hi)
    return least_squares(residuals, start, bounds=(lo, hi), x_scale=scale).x


@dataclass
class StackFit:
    """One stack fitted on its rows: the values fitted on all of them (`stack`) and the linear
    models of every row around them, from which the fits leaving one source out are solved."""

    stack: Stack
    fields: list[str]
    rows: list[Row]
    lins: list[Linear]

    def without(self, group: str, prior: np.ndarray) -> np.ndarray | None:
        """The fields fitted on the rows of every other source (None: no other source)."""
        lins = [lin for lin in self.lins if lin.row.group != group]
        return fit_linear(lins, self.fields, prior) if lins else None


def fit_stack_rows(stack: Stack, rows: Sequence[Row], progress: Callable[[str], None] = lambda _: None) -> StackFit:
    """`stack`'s fitted fields (`fitted_on`'s keys) fitted on `rows` (its rows, disputed ones
    left out): linear models around its values, a fit, linear models again around the fit
    (the models are exact in the additive costs, close in the efficiencies), a second fit."""
    fields = list(stack.fitted_on)
    rows = [r for r in rows if not r.disputed]
    if not fields or not rows:
        return StackFit(stack, fields, list(rows), [])
    x = _to_x(stack, fields)
    for rounds in range(2):
        progress(f"fitting stack {stack.name} on {len(rows)} rows ({'first' if rounds == 0 else 'second'} pass)")
        lins = [linearize(r, stack, fields) for r in rows]
        x = fit_linear(lins, fields, x)
        stack = _from_x(stack, fields, x)
    return StackFit(stack, fields, list(rows), [linearize(r, stack, fields) for r in rows])


def fit_stack(stack: Stack, rows: dict[str, Row], shared: Shared) -> tuple[Stack, dict[str, float]]:
    """`stack` with its fitted fields (`fitted_on`) solved on their rows, under `shared`:
    least squares of log(predicted / published) by direct simulation (the few rows a user
    measured, `casmoe.sim.questions.calibration`); returns it (its zeros still meaning the
    shared default) and each field's standard error (how well the rows determine it; inf when as
    many fields as rows leave no residual)."""
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
    return model_preset((row.run or {})["model"]).geometry.layers


# ---- the whole table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    row: Row
    role: str  # "predicted", "beyond bound" (faster than its configuration can run), "out of scope"
    predicted: float | None = None  # the rate
    note: str = ""
    bound: float | None = None  # the rate of an ideal runtime in the row's configuration
    fitted_on: int = 0  # rows of other sources the stack's constants were fitted on (0: the prior)
    stack: dict[str, float] = field(default_factory=dict)  # the fitted fields' values it was predicted with
    point: Point | None = None  # the configuration as the error model sees it
    factor: float | None = None  # its 80% interval (x/÷), from the error model fitted leaving its source out

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.rate

    @property
    def scored(self) -> bool:
        """Counted in the summary: predicted and not disputed."""
        return self.role == "predicted" and not self.row.disputed and self.ratio is not None

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r.id, "system": r.system, "kind": r.kind, "group": r.group, "stack": r.stack if r.run else "",
            "family": r.family if r.run else "", "model": (r.run or {}).get("model", r.model),
            "hardware": (r.run or {}).get("hardware", ""), "metric": r.metric, "published": r.value,
            "published_tok_s": r.rate, "predicted_tok_s": self.predicted, "ratio": self.ratio,
            "abs_log_ratio": None if self.ratio is None else abs(math.log(self.ratio)), "bound_tok_s": self.bound,
            "role": self.role, "fitted_on_rows": self.fitted_on, "constants": self.stack, "disputed": r.disputed,
            "interval_factor": self.factor,
            "inside_interval": None if self.factor is None or self.ratio is None else abs(math.log(self.ratio)) <= math.log(self.factor),
            "note": self.note or r.scope, "source": r.source,
        }


@dataclass
class Validation:
    results: list[Result]
    stacks: dict[str, Stack]  # fitted on every row (what `--fit` writes)
    shared: Shared
    error: ErrorModel | None = None  # fitted on every scored row's residual, its coverage measured leaving sources out

    def predicted(self) -> list[Result]:
        return [r for r in self.results if r.scored]

    def summary(self) -> dict[str, Any]:
        scored = self.predicted()
        logs = [abs(math.log(r.ratio)) for r in scored]
        ratios = [r.ratio for r in scored]
        by = lambda key: {k: statistics.median(abs(math.log(r.ratio)) for r in scored if key(r) == k)  # noqa: E731
                          for k in sorted({key(r) for r in scored})}
        return {
            "rows": len(self.results),
            "predicted": len(logs),
            "sources": len({r.row.document for r in scored}),
            "setups": len({r.row.group for r in scored}),
            "out_of_scope": sum(r.role == "out of scope" for r in self.results),
            "beyond_bound": [r.row.id for r in self.results if r.role == "beyond bound"],
            "disputed": [r.row.id for r in self.results if r.row.disputed and r.role == "predicted"],
            "systems": sorted({r.row.system for r in scored}),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "max_abs_log_ratio": max(logs) if logs else None,
            "beyond_2x": sum(x > math.log(2) for x in logs),
            "beyond_2x_rows": [r.row.id for r in scored if abs(math.log(r.ratio)) > math.log(2)],
            "median_abs_log_ratio_by_stack": by(lambda r: r.row.stack),
            "median_abs_log_ratio_by_family": by(lambda r: r.row.family),
            "rankings": self.rankings(),
            "interval_coverage": None if self.error is None else self.error.coverage,
            "interval_median_factor": None if self.error is None else self.error.median_factor,
        }

    def rankings(self) -> dict[str, Any]:
        """Same-source comparisons: rows of one source, box, model and precision that differ in
        policy or system; each pair's measured order against the predicted one."""
        groups: dict[tuple, list[Result]] = {}
        for r in self.predicted():
            run = r.row.run or {}
            key = (r.row.group, run.get("hardware"), run.get("model"), run.get("quant"), r.row.metric)
            groups.setdefault(key, []).append(r)
        kept, wrong = 0, []
        for members in groups.values():
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    if abs(math.log(a.row.rate / b.row.rate)) < 0.02:  # a tie measured: no order to keep
                        continue
                    if (a.row.rate > b.row.rate) == (a.predicted > b.predicted):
                        kept += 1
                    else:
                        wrong.append(f"{a.row.id} vs {b.row.id}")
        return {"pairs": kept + len(wrong), "kept": kept, "broken": wrong}


def _prior(name: str, fits: dict[str, StackFit], group: str | None) -> np.ndarray:
    """Where a fit of stack `name` starts and is held: each field at the median of what the
    other stacks that fit it fitted on rows of other sources than `group` (None: every row);
    a field no other stack fits keeps the stack file's value."""
    own = fits[name]
    out = []
    for i, f in enumerate(own.fields):
        values = []
        for other, fit in fits.items():
            if other == name or f not in fit.fields:
                continue
            x = fit.without(group, _to_x(fit.stack, fit.fields)) if group is not None else _to_x(fit.stack, fit.fields)
            if x is not None:
                values.append(x[fit.fields.index(f)])
        out.append(statistics.median(values) if values else _to_x(load_stack(name), own.fields)[i])
    return np.array(out)


def validate(rows: list[Row] | None = None, progress: Callable[[str], None] | None = None) -> Validation:
    """Predict every row with a run as the module docstring says: each source's rows by
    constants fitted on the other sources' rows of the same stack."""
    rows = load_rows() if rows is None else rows
    say = progress or (lambda _: None)
    shared = load_shared()
    runs = [r for r in rows if r.run]
    names = sorted({r.stack for r in runs})
    shipped = {n: load_stack(n).resolved(shared) for n in names}
    say("the ideal bound of every row")
    bounds, results, skipped = {}, [], set()
    for r in runs:
        try:
            bounds[r.id] = bound(r)
        except CasmoeError as exc:
            results.append(Result(r, "out of scope", note=f"cannot be simulated: {exc}"))
            skipped.add(r.id)
    beyond = {i for i, b in bounds.items() if next(r for r in runs if r.id == i).rate > b * BOUND_TOLERANCE}
    fits = {n: fit_stack_rows(shipped[n], [r for r in runs if r.stack == n and r.id in bounds and r.id not in beyond], say)
            for n in names}
    for r in runs:
        if r.id in skipped:
            continue
        if r.id in beyond:
            results.append(Result(r, "beyond bound", bound=bounds[r.id], note=(
                f"measured {r.rate:.3g} tok/s, faster than casmoe's bound for the configuration written for it "
                f"({bounds[r.id]:.3g} tok/s: an ideal runtime, copies at the link's pinned rate): "
                + (r.faster_than_bound or "what ran is not what the row says (a precision, a placement or a box "
                   "the source does not state)"))))
    for name in names:
        fit = fits[name]
        mine = [r for r in runs if r.stack == name and r.id in bounds and r.id not in beyond]
        for group in sorted({r.group for r in mine}):
            members = [r for r in mine if r.group == group]
            say(f"{name}: {len(members)} rows of {group}")
            if not fit.fields:
                stack, n = fit.stack, 0
            else:
                x = fit.without(group, _prior(name, fits, group))
                n = sum(1 for lin in fit.lins if lin.row.group != group)
                stack = _from_x(fit.stack, fit.fields, x if x is not None else _prior(name, fits, group))
            values = {f: getattr(stack, f) for f in fit.fields}
            for r in members:
                try:
                    results.append(Result(r, "predicted", predict(r, stack), bound=bounds[r.id], fitted_on=n,
                                          stack=values, note=r.disputed and f"disputed: {r.disputed}"))
                except CasmoeError as exc:
                    results.append(Result(r, "out of scope", note=f"cannot be simulated: {exc}"))
    results += [Result(r, "out of scope") for r in rows if not r.run]
    order = {r.id: k for k, r in enumerate(rows)}
    results.sort(key=lambda x: order[x.row.id])
    say("the error model and its coverage, leaving one source out")
    results, model = with_intervals(results)
    return Validation(results, {n: f.stack for n, f in fits.items()}, shared, model)


def point_of_row(row: Row, stack: Stack) -> Point:
    """The error model's view of a row's configuration (its run as `specs_for` builds it)."""
    (spec,) = specs_for(row, stack)
    return point_of(spec.machine, row.family, spec.host_cache is not None)


def with_intervals(results: list[Result]) -> tuple[list[Result], ErrorModel | None]:
    """Each scored row's point and its 80% interval from the error model fitted leaving its
    source out, and the model fitted on every scored row, with the coverage so measured."""
    scored = [r for r in results if r.scored]
    if len(scored) < 2 or len({r.row.group for r in scored}) < 2:
        return results, None
    points = [point_of_row(r.row, replace(load_stack(r.row.stack), **r.stack)) for r in scored]
    groups = [r.row.document for r in scored]  # the interval's claim is checked on whole sources left out
    residuals = [math.log(r.ratio) for r in scored]
    setups = [r.row.group for r in scored]
    seen_of = [[p for p, s in zip(points, setups) if s != setup] for setup in setups]  # what its prediction saw
    inside, factors = leave_one_source_out(residuals, points, groups, seen_of)
    weights = fit_error(residuals, points, seen_of)
    model = ErrorModel(weights, tuple(points), len(scored), sum(inside) / len(inside),
                       statistics.median(factors), len(set(groups)))
    by_id = {r.row.id: (p, f) for r, p, f in zip(scored, points, factors)}
    out = [replace(r, point=by_id[r.row.id][0], factor=by_id[r.row.id][1]) if r.row.id in by_id else r for r in results]
    return out, model


FITTED_MARK = " | fitted: "
"""Where a fitted field's source (why the field exists, what it stands for) ends and the record
of its last fit begins: a refit replaces the record, never the reason."""


def write_fitted(v: Validation) -> list[Path]:
    """Write the constants fitted on every row (each stack's fitted fields, the rows they were
    fitted on) and the shared defaults: the median of the stacks' own host efficiencies."""
    written = []
    paths = stack_paths()
    for name, s in v.stacks.items():
        shipped = load_stack(name)
        ids = [r.row.id for r in v.results if r.row.stack == name and r.role == "predicted" and not r.row.disputed]
        if not shipped.fitted_on or not ids:
            continue
        groups = len({r.row.group for r in v.results if r.row.id in ids})
        sources = {f: (f"{shipped.sources.get(f, '').split(FITTED_MARK)[0]}{FITTED_MARK}{getattr(s, f):.4g} on "
                       f"{len(ids)} rows of {groups} sources by casmoe validate published --fit")
                   for f in shipped.fitted_on}
        fitted = replace(shipped, **{f: getattr(s, f) for f in shipped.fitted_on}, sources={**shipped.sources, **sources},
                         fitted_on={f: ids for f in shipped.fitted_on})
        header = [line for line in paths[name].read_text().splitlines() if line.startswith("#")]
        written.append(write_text(paths[name], "\n".join([*header, fitted.to_toml()])))
    own = {n: s.host_efficiency for n, s in v.stacks.items() if "host_efficiency" in load_stack(n).fitted_on}
    sh = v.shared
    if own:
        value = float(statistics.median(own.values()))
        why = "median of the host efficiencies fitted by " + ", ".join(f"{n} ({x:.3g})" for n, x in sorted(own.items()))
        sh = replace(sh, host_efficiency=value, sources={**sh.sources, "host_efficiency": why})
    text = ["# The constants every stack takes where it has no measurement of its own (a stack's 0 means",
            "# \"the shared default\"). Written by `casmoe validate published --fit`.",
            f"host_efficiency = {sh.host_efficiency!r}", f"host_flops_efficiency = {sh.host_flops_efficiency!r}", "",
            "[sources]", f"host_efficiency = {json.dumps(sh.sources.get('host_efficiency', ''))}",
            f"host_flops_efficiency = {json.dumps(sh.sources.get('host_flops_efficiency', ''))}"]
    written.append(write_text(SHARED_FILE, "\n".join(text) + "\n"))
    if v.error is not None:
        written.append(write_text(MODEL_FILE, v.error.to_toml()))
    return written
