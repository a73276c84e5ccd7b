"""A software stack calibrated on what a user measured: `casmoe calibrate measured FILE`.

A user who timed one or a few runs on their own box (on-demand and one cached policy, say) knows
the answer for those runs only. The published table's machinery (`casmoe.sim.questions.validation`) fits a
stack's unknown costs on rows; this module puts the user's rows in that table's schema, decides
which of the stack's costs the rows can determine, fits them with the same `fit_stack`, and says
how far to trust the result:

- each fitted number's standard error (inf, "not determined", when as many numbers as rows
  leave no residual to judge them by);
- each row predicted by a refit without it (leave one out) when there are more rows than fitted
  numbers: the honest check, since a fit always matches the rows it was fitted on.

The stack written (`Calibration.stack`) is what `casmoe simulate --stack FILE` reads to predict
the policies and cache sizes the user did not measure; each fitted field's source names the file,
the rows, the day and its standard error (STYLE principle 14).

The measurements file is the published table's `[[row]]` format, trimmed to what a user knows:

    [[row]]
    id = "ondemand"                      # unique within the file
    rate = 2.1                           # measured decode tokens/s (or metric + value, as published)
    run = { model = "mixtral-8x7b", hardware = "my-box.toml", quant = "int4", policy = "ondemand", capacity = "2" }

`run` holds `casmoe simulate` options (model and hardware required; the trace is chosen for the
model's routing shape, as for the published rows). A CSV with columns `id`, `rate` and one column
per run option says the same in one line per row.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.report import sig
from casmoe.sim.cost.stack import Shared, Stack, load_shared, load_stack
from casmoe.sim.questions.measured_files import Context, is_engine_output
from casmoe.sim.questions.measured_files import read as read_engine_output
from casmoe.sim.questions.validation import (
    BOUND_TOLERANCE,
    FIT_BOUNDS,
    RATES,
    Row,
    bound,
    fit_stack,
    predict,
    row_from_dict,
    specs_for,
)
from casmoe.userfile import read_toml

ROW_KEYS = ("id", "rate", "metric", "value", "system", "source", "prompt_tokens", "output_tokens", "notes", "run")
"""Keys of a measured row itself; in a CSV every other column is a run option."""
RUN_SET_BY_CALIBRATE = ("trace", "requests", "split")
"""Run options the calibration chooses itself (the trace of the model's routing shape, as for the
published rows): a user's value would be silently replaced, so it is refused."""
CANDIDATES = ("layer_us", "copy_efficiency", "host_efficiency")
"""Fields fitted by default, in the order they are tried: the per-layer software cost moves every
row; the copies' share of the link and the host kernels' share of DRAM bandwidth only rows that
copy experts or compute them on the host."""
STEPS = {"layer_us": ("add", 200.0), "copy_efficiency": ("scale", 0.8), "host_efficiency": ("scale", 0.8)}
"""How far each candidate is moved to see how the rows' rates follow it."""
MOVES = 1e-3
"""A field whose step moves no row's log-rate by this much is not seen by the rows."""
SEPARABLE = 0.1
"""Smallest singular value of the chosen fields' normalised sensitivities (1: orthogonal, 0: one
field's effect is another's) below which a field is not separable from those already chosen."""


class CalibrationError(CasmoeError, ValueError):
    """A measurements file, base stack or field list that cannot be calibrated on."""


# ---- reading the measurements ---------------------------------------------------------------------


def load_measured(path: str | Path, context: Context | None = None) -> list[Row]:
    """The rows of a user's TOML or CSV (see the module docstring), or of llama-bench's output or
    llama-server's log (`casmoe.sim.questions.measured_files`, with `context`: the box and model
    those files do not name), each checked: a rate, a model and a box, run options `casmoe
    simulate` accepts, and no two rows the same measurement."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"measurements file {path} not found")
    engine = is_engine_output(path)
    if engine and (context is None or not context.hardware):
        raise CalibrationError(f"{path} is llama.cpp's own output, which does not name the box it ran on: give "
                               "--hardware (a profile: `casmoe hardware detect --out my-box.toml` writes this machine's)")
    if not engine and context is not None:
        raise CalibrationError(f"{path}: its rows name their own runs (model, hardware, stack): leave --hardware and "
                               "--model out (they are for llama-bench output and llama-server logs)")
    if engine:
        raws = read_engine_output(path, context).rows
    elif path.suffix.lower() == ".csv":
        raws = _csv_rows(path)
    else:
        raws = read_toml(path, "measurements file", CalibrationError).get("row")
        if not isinstance(raws, list) or not raws:
            raise CalibrationError(f"{path}: no [[row]] tables (each: id, rate, run = {{ model, hardware, policy, ... }})")
    rows = [_row(raw, k, path) for k, raw in enumerate(raws)]
    ids = [r.id for r in rows]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise CalibrationError(f"{path}: row ids repeat: {', '.join(repeated)}")
    seen: dict[str, str] = {}
    for r in rows:  # one run written twice adds no information, and would make a fit look sure of itself
        same = json.dumps([r.run, r.metric, r.prompt_tokens], sort_keys=True, default=str)
        if same in seen:
            raise CalibrationError(f"{path}: rows {seen[same]} and {r.id} are the same run (every option alike): one "
                                   "measurement counted twice would fit as if confirmed; keep one, or average the runs "
                                   "into one row")
        seen[same] = r.id
    for r in rows:
        try:
            specs_for(r)
        except CasmoeError as exc:
            raise CalibrationError(f"{path}: row {r.id}: {str(exc).removeprefix(f'row {r.id}: ')}") from None
    return rows


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    """CSV lines in the TOML's shape: the row's own keys, every other filled cell a run option."""
    with path.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's byte-order mark is not part of the first key
        lines = list(csv.DictReader(f))
    if not lines:
        raise CalibrationError(f"{path}: no rows (a header line with id, rate and run options, then a line per run)")
    out = []
    for line in lines:
        cells = {k.strip(): _cell(v) for k, v in line.items() if k and v is not None and v.strip()}
        out.append({**{k: v for k, v in cells.items() if k in ROW_KEYS},
                    "run": {k: v for k, v in cells.items() if k not in ROW_KEYS}})
    return out


def _cell(text: str) -> Any:
    """A CSV cell as the TOML would have typed it (whole numbers, numbers, true/false, text)."""
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text)
    except ValueError:
        return text


def _row(raw: Any, k: int, path: Path) -> Row:
    """One measured row in the published schema (`validation.row_from_dict`)."""
    if not isinstance(raw, dict):
        raise CalibrationError(f"{path}: row {k + 1} is not a table")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise CalibrationError(f"{path}: row {k + 1} has no id")
    where = f"{path}: row {rid}"
    unknown = sorted(set(raw) - set(ROW_KEYS))
    if unknown:
        raise CalibrationError(f"{where}: unknown keys {unknown} (run options go in its run table)")
    if "rate" in raw:
        metric, value = "decode_tok_s", raw["rate"]
    elif "value" in raw:
        metric, value = raw.get("metric", "decode_tok_s"), raw["value"]
    else:
        raise CalibrationError(f"{where}: no rate (the decode tokens/s you measured)")
    if metric not in RATES:
        raise CalibrationError(f"{where}: metric {metric!r} cannot be calibrated on (only {', '.join(RATES)})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CalibrationError(f"{where}: the rate must be a number > 0, got {value!r}")
    run = raw.get("run")
    if not isinstance(run, dict):
        raise CalibrationError(f"{where}: no run table (the casmoe simulate options of the run measured)")
    for key in ("model", "hardware"):
        if not run.get(key):
            raise CalibrationError(f"{where}: its run names no {key} (the {'model preset' if key == 'model' else 'box, a profile name or TOML'} it ran)")
    chosen = [key for key in RUN_SET_BY_CALIBRATE if key in run]
    if chosen:
        raise CalibrationError(f"{where}: {', '.join(chosen)} is chosen by calibrate (the model's routing shape); leave it out")
    return row_from_dict({"id": rid, "system": str(raw.get("system", "measured")), "kind": "user measurement",
                          "source": str(raw.get("source", path)), "metric": metric, "value": float(value), "run": run,
                          "prompt_tokens": raw.get("prompt_tokens"), "output_tokens": raw.get("output_tokens")}, str(path))


def base_stack(rows: Sequence[Row], given: str | Path | None) -> Stack:
    """The stack to calibrate: `--stack` (a shipped name or a TOML), else the one the rows name
    (they ran on one runtime), else `ideal`."""
    named = sorted({str(r.run["stack"]) for r in rows if r.run and r.run.get("stack")})
    if len(named) > 1:
        raise CalibrationError(f"the rows name different stacks ({', '.join(named)}): a calibration fits one runtime")
    if given is not None and named and str(given) != named[0]:
        raise CalibrationError(f"--stack {given} but the rows name stack {named[0]}: give one")
    return load_stack(given if given is not None else (named[0] if named else "ideal"))


# ---- which fields the rows determine --------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """Whether a field is fitted, and why (what the command prints)."""

    field: str
    fitted: bool
    why: str


def _stepped(stack: Stack, name: str, shared: Shared) -> Stack:
    kind, by = STEPS[name]
    value = getattr(stack.resolved(shared), name)
    return replace(stack, **{name: value + by if kind == "add" else value * by}).resolved(shared)


def sensitivities(rows: Sequence[Row], stack: Stack, shared: Shared, names: Sequence[str]) -> Any:
    """[rows, fields]: how each row's log-rate moves when each field takes its step (`STEPS`)."""
    base = np.array([math.log(predict(r, stack.resolved(shared))) for r in rows])
    return np.array([[math.log(predict(r, _stepped(stack, n, shared))) for r in rows] for n in names]).T - base[:, None]


def choose_fields(rows: Sequence[Row], stack: Stack, shared: Shared) -> list[Choice]:
    """The candidates (`CANDIDATES`) the rows determine: a field is fitted when some row's rate
    moves with it, its effect is not (nearly) that of the fields already chosen, and fewer
    fields than rows are chosen so far. Two runs of one configuration determine only the
    per-layer cost; runs that copy different amounts (on-demand against a cache, two sizes)
    separate the copies' share of the link from it."""
    s = sensitivities(rows, stack, shared, CANDIDATES)
    chosen: list[int] = []
    out = []
    for j, name in enumerate(CANDIDATES):
        col = s[:, j]
        if np.max(np.abs(col)) < MOVES:
            out.append(Choice(name, False, "no measured row depends on it" + (
                "" if name == "layer_us" else f" ({'none copies experts' if name == 'copy_efficiency' else 'none computes experts on the host'})")))
            continue
        if len(chosen) >= len(rows):
            out.append(Choice(name, False, f"{len(rows)} row{'s' if len(rows) > 1 else ''} determine{'s' if len(rows) == 1 else ''} "
                              f"at most {len(rows)} field{'s' if len(rows) > 1 else ''}: measure another configuration to fit it"))
            continue
        m = s[:, chosen + [j]]
        m = m / np.linalg.norm(m, axis=0)
        sigma = float(np.linalg.svd(m, compute_uv=False)[-1])
        if sigma < SEPARABLE:
            out.append(Choice(name, False, f"the rows' rates move with it as with {', '.join(CANDIDATES[c] for c in chosen)} "
                              f"(separability {sigma:.2f} < {SEPARABLE}): rows that differ in what they copy or compute on "
                              "the host would separate it"))
            continue
        chosen.append(j)
        why = ("every row's rate moves with it: the time a measured token leaves over beyond the hardware, per layer of a pass"
               if not out and len(chosen) == 1 else f"the rows' rates move with it unlike with the fields before it "
               f"(separability {sigma:.2f})")
        out.append(Choice(name, True, why))
    return out


def check_fields(names: Sequence[str], rows: Sequence[Row]) -> list[str]:
    """`--fit` as given: known fitted fields, no more than rows."""
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in FIT_BOUNDS]
    if unknown:
        raise CalibrationError(f"--fit: unknown field {', '.join(unknown)}; fittable: {', '.join(FIT_BOUNDS)}")
    if len(set(names)) != len(names):
        raise CalibrationError("--fit names a field twice")
    if not names:
        raise CalibrationError("--fit names no field")
    if len(names) > len(rows):
        raise CalibrationError(f"--fit names {len(names)} fields but the file has {len(rows)} row{'s' if len(rows) > 1 else ''}: "
                               "a fit needs at least as many measurements as unknowns")
    return names


# ---- the fit and its checks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One measured row against the calibrated stack: fitted (the rows it was fitted on include
    it), with more rows than fields predicted by a refit without it, and the fastest its
    configuration can run in casmoe's model (`validation.bound`: no stack can fit a row beyond it)."""

    row: Row
    fitted: float
    left_out: float | None
    bound: float

    @property
    def beyond_bound(self) -> bool:
        """Measured faster than the configuration written for it can run: what ran is not what
        the row says (a precision, a box or a cache size that differs), so no stack explains it."""
        return self.row.rate > self.bound * BOUND_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        run = self.row.run or {}
        return {"id": self.row.id, "policy": run.get("policy"), "capacity": run.get("capacity") or run.get("global_capacity"),
                "measured_tok_s": self.row.rate, "fitted_tok_s": self.fitted, "fitted_ratio": self.fitted / self.row.rate,
                "left_out_tok_s": self.left_out,
                "left_out_ratio": None if self.left_out is None else self.left_out / self.row.rate,
                "bound_tok_s": self.bound, "beyond_bound": self.beyond_bound}


@dataclass(frozen=True)
class Calibration:
    """The fitted stack, each fitted field's standard error (inf: not determined), the choice of
    fields and the per-row checks."""

    base: Stack
    stack: Stack
    errors: dict[str, float]
    choices: list[Choice]
    checks: list[Check]

    @property
    def fields(self) -> list[str]:
        return list(self.errors)

    def describe(self, name: str) -> str:
        """A fitted field's value and how well the rows determine it."""
        return describe_error(name, getattr(self.stack, name), self.errors[name], len(self.checks) - len(self.errors))

    def left_out_median_abs_log_ratio(self) -> float | None:
        logs = [abs(math.log(c.left_out / c.row.rate)) for c in self.checks if c.left_out is not None]
        return statistics.median(logs) if logs else None

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base.name, "stack": self.stack.name,
                "fitted": {f: {"value": getattr(self.stack, f), "standard_error": None if math.isinf(e) else e}
                           for f, e in self.errors.items()},
                "choices": [{"field": c.field, "fitted": c.fitted, "why": c.why} for c in self.choices],
                "rows": [c.to_dict() for c in self.checks],
                "left_out_median_abs_log_ratio": self.left_out_median_abs_log_ratio()}


def describe_error(name: str, value: float, error: float, spare: int) -> str:
    """`400 ± 3.1 us (standard error)`, or why there is no error bar (`spare`: rows beyond the
    fields fitted); a value at its bound says so (the rows ask for more than the field can mean)."""
    unit = " us" if name.endswith("_us") else ""
    if math.isinf(error):
        text = f"{sig(value, 4)}{unit}, not determined " + (
            "(as many fields as rows: no residual to judge it by)" if spare <= 0 else "(the rows do not separate it)")
    else:
        text = f"{sig(value, 4)} ± {sig(error, 2)}{unit} (standard error)"
    if _at_bound(name, value):
        lo, hi = FIT_BOUNDS[name]
        text += f", at its bound ({sig(lo if value <= (lo + hi) / 2 else hi, 4)})"
    return text


def calibrate(rows: Sequence[Row], base: Stack, fields: Sequence[str] | None = None, *, source: str, when: str,
              name: str | None = None, shared: Shared | None = None) -> Calibration:
    """Fit `fields` of `base` (default: `choose_fields`) on `rows` with `validation.fit_stack`,
    check each row by a refit without it when rows outnumber fields, and return the stack with
    each fitted field sourced: `source` (how the user ran it) on which rows, `when` (a date the
    caller passes: time is injected), and its standard error."""
    shared = shared or load_shared()
    rows = list(rows)
    if fields is None:
        choices = choose_fields(rows, base, shared)
        fields = [c.field for c in choices if c.fitted]
        if not fields:
            raise CalibrationError("no stack field is determined by these rows (no row's rate moves with "
                                   f"{', '.join(CANDIDATES)}): name them with --fit")
    else:
        fields = check_fields(fields, rows)
        choices = [Choice(f, True, "named by --fit") for f in fields]
    by_id = {r.id: r for r in rows}
    ids = [r.id for r in rows]
    fitted, errors = fit_stack(replace(base, fitted_on={f: ids for f in fields}), by_id, shared)
    resolved = fitted.resolved(shared)
    checks = []
    for r in rows:
        left_out = None
        if len(rows) > len(fields):
            others = [i for i in ids if i != r.id]
            without, _ = fit_stack(replace(base, fitted_on={f: others for f in fields}), by_id, shared)
            left_out = predict(r, without.resolved(shared))
        checks.append(Check(r, predict(r, resolved), left_out, bound(r)))
    spare = len(rows) - len(fields)
    sources = {f: f"fitted by `{source}` on rows {', '.join(ids)} ({when}): {describe_error(f, getattr(fitted, f), errors[f], spare)}"
               for f in fields}
    stack = replace(fitted, name=name or f"{base.name}-calibrated",
                    description=f"{base.name} calibrated on {len(rows)} measured row{'s' if len(rows) > 1 else ''} ({source})",
                    sources={**base.sources, **sources}, fitted_on={f: ids for f in fields})
    at_bound = [f for f in fields if _at_bound(f, getattr(fitted, f))]
    missed = [c for c in checks if abs(math.log(c.fitted / c.row.rate)) > math.log(MISSED)]
    if at_bound and missed:  # the rows ask for more than the fields can mean: a unit or a run written wrong
        worst = max(missed, key=lambda c: abs(math.log(c.fitted / c.row.rate)))
        why = (f"faster than its configuration can run in casmoe's model ({worst.bound:.4g} tok/s with no software "
               "cost): check its run (precision, box, cache size)" if worst.beyond_bound else
               "slower than any runtime cost explains: check its rate (tokens per second, not per millisecond) and "
               "its run (model, precision, box, policy)")
        raise CalibrationError(
            f"the fit ran {', '.join(at_bound)} to the end of its range and still misses row {worst.row.id} "
            f"{worst.fitted / worst.row.rate:.3g}x (measured {worst.row.rate:.4g} tok/s, fitted {worst.fitted:.4g}): "
            f"{why}")
    return Calibration(base, stack, errors, choices, checks)


MISSED = 2.0
"""A fitted row this far from its measurement (either way) is not explained by the fit."""


def _at_bound(name: str, value: float) -> bool:
    lo, hi = FIT_BOUNDS[name]
    near = 1e-3 * (hi - lo)  # a bounded fit stops just inside its bound
    return value <= lo + near or value >= hi - near
