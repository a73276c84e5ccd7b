"""How far a predicted figure may be off: an error model fitted on the published table's
left-out residuals, printed as an 80% interval beside every figure.

`casmoe validate published` predicts each published row with constants fitted on other
sources (`casmoe.sim.questions.validation`); the log of predicted over measured is a residual
the fit never saw. Residuals are not alike: a runtime measured by several sources lands closer
than one only its own paper measured; a placement that computes experts on the host depends on
the CPU's kernels more than an all-on-GPU run depends on the GPU's; a run that reads experts
from storage, or a box or model unlike any measured, lands further. So the residual's spread is
modelled per configuration: log σ = w · features (`Point.features`: the kind of configuration,
whether its runtime was measured by another source, whether it reads storage, how far its box
and model are from the nearest measured ones by their numbers, not their names), fitted by
maximum likelihood on the residuals (a normal of mean 0: the constants are fitted, a bias is
the fit's to remove), and the interval is the figure x/÷ exp(1.2816 σ): 80% of a normal.

The claim an interval makes is checked the same way as the figures: its coverage is measured
leaving one source out (the model fitted on every other source's residuals, the left-out
source's rows counted in or out of their intervals), and written with the model
(`published/error_model.toml`), so the number a user reads says how often it held.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from casmoe.tables import read_table

PUBLISHED = Path(__file__).with_name("published")
MODEL_FILE = PUBLISHED / "error_model.toml"
Z80 = 1.2815515655446004
"""The normal's 90th percentile: an interval of ±Z80 σ holds 80%."""
FEATURES = ("bias", "host", "cache", "stream", "host_only", "unseen_stack", "storage", "box_distance",
            "model_distance")
"""What the spread depends on (`Point.features`); all-on-GPU runs are the base the family terms
add to."""
RIDGE = 0.5
"""A weak pull of every weight but the bias toward 0 (no effect): a feature few rows carry
cannot take an extreme weight from one residual."""


@dataclass(frozen=True)
class Point:
    """A configuration as the error model sees it: its kind (`uncertainty.family`), its stack,
    whether the host is the whole box, whether it reads experts from storage, and its box and
    model as numbers (logs of the GPU's memory bandwidth, memory and link, the host's memory
    bandwidth; of the model's total and active parameters, experts and top-k)."""

    family: str
    stack: str
    host_only: bool
    storage: bool
    box: tuple[float, ...]
    model: tuple[float, ...]

    def features(self, seen: Sequence[Point]) -> list[float]:
        """The model's inputs against the configurations `seen` by the fit: distances to the
        nearest seen box and model (in units of a doubling of every number), and whether any seen
        configuration ran on this stack."""
        box = min((_distance(self.box, s.box) for s in seen), default=4.0)
        model = min((_distance(self.model, s.model) for s in seen), default=4.0)
        unseen = not any(s.stack == self.stack for s in seen)
        return [1.0, float(self.family == "host"), float(self.family == "cache"), float(self.family == "stream"),
                float(self.host_only), float(unseen), float(self.storage), box, model]

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "stack": self.stack, "host_only": self.host_only, "storage": self.storage,
                "box": list(self.box), "model": list(self.model)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        return cls(str(d["family"]), str(d["stack"]), bool(d["host_only"]), bool(d["storage"]),
                   tuple(float(x) for x in d["box"]), tuple(float(x) for x in d["model"]))


def _distance(a: Sequence[float], b: Sequence[float]) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / math.log(2)


def point_of(machine: Any, family: str, storage: bool) -> Point:
    """The point of a run on `machine` (`casmoe.sim.cost.machine.Machine`)."""
    hw, preset = machine.hardware, machine.preset
    g = preset.geometry
    box = tuple(math.log1p(x) for x in (hw.mem_bw_gbs, hw.memory_gib * max(hw.gpus, 1), hw.h2d_pinned_gbs,
                                         hw.cpu_mem_bw_gbs))
    model = (math.log(preset.total_params()), math.log(preset.active_params()), math.log(g.experts), math.log(g.top_k))
    return Point(family, machine.stack.label, hw.host_only, storage, box, model)


@dataclass(frozen=True)
class ErrorModel:
    """Fitted weights, the configurations they were fitted on (distances are measured to
    them), and what the fit measured of itself."""

    weights: tuple[float, ...]
    seen: tuple[Point, ...]
    rows: int = 0
    coverage: float | None = None  # share of rows inside their 80% interval, leaving one source out
    median_factor: float | None = None  # the median interval's x/÷ factor, leaving one source out
    sources: int = 0
    notes: dict[str, str] = field(default_factory=dict)

    def sigma(self, point: Point, seen: Sequence[Point] | None = None) -> float:
        x = point.features(self.seen if seen is None else seen)
        return math.exp(sum(w * v for w, v in zip(self.weights, x)))

    def factor(self, point: Point) -> float:
        """The 80% interval's multiplicative half-width: the figure x/÷ this."""
        return math.exp(Z80 * self.sigma(point))

    def to_toml(self) -> str:
        lines = ["# The error model of casmoe's predictions (casmoe/sim/trust/error_model.py), written by",
                 "# `casmoe validate published --fit`: log sigma = weights . features, fitted on the published",
                 "# table's left-out residuals; coverage and median_factor measured leaving one source out.",
                 f"rows = {self.rows}", f"sources = {self.sources}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in (("coverage", self.coverage), ("median_factor", self.median_factor))
                  if v is not None]
        lines += ["", "[weights]", *(f"{n} = {w!r}" for n, w in zip(FEATURES, self.weights)), "",
                  "[notes]", *(f"{k} = {json.dumps(v)}" for k, v in self.notes.items())]
        for p in self.seen:
            lines += ["", "[[seen]]", *(f"{k} = {json.dumps(v)}" for k, v in p.to_dict().items())]
        return "\n".join(lines) + "\n"


def fit(residuals: Sequence[float], points: Sequence[Point], seen_of: Sequence[Sequence[Point]]) -> tuple[float, ...]:
    """Weights maximising the likelihood of `residuals` (log predicted/measured) as normals of
    mean 0 and log σ = w · features, each row's features taken against `seen_of[i]` (the
    configurations its prediction was fitted on), held weakly to 0 (`RIDGE`)."""
    import numpy as np
    from scipy.optimize import minimize

    X = np.array([p.features(s) for p, s in zip(points, seen_of)])
    e2 = np.array(residuals, float) ** 2
    ridge = np.full(len(FEATURES), RIDGE)
    ridge[0] = 0.0

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        s = X @ w  # log sigma
        inv = np.exp(-2 * s)
        value = float(np.sum(s + 0.5 * e2 * inv) + 0.5 * np.sum(ridge * w * w))
        grad = X.T @ (1 - e2 * inv) + ridge * w
        return value, grad

    w0 = np.zeros(len(FEATURES))
    w0[0] = math.log(math.sqrt(max(float(np.mean(e2)), 1e-6)))
    return tuple(float(x) for x in minimize(loss, w0, jac=True, method="L-BFGS-B").x)


def leave_one_source_out(residuals: Sequence[float], points: Sequence[Point], groups: Sequence[str],
                         seen_of: Sequence[Sequence[Point]]) -> tuple[list[bool], list[float]]:
    """For each source, the model fitted on every other source's residuals, and each of its rows
    in or out of the 80% interval that model gives it; returns (inside, factor) per row."""
    inside, factors = [0] * len(points), [0.0] * len(points)
    for group in sorted(set(groups)):
        train = [i for i, g in enumerate(groups) if g != group]
        if not train:
            continue
        w = fit([residuals[i] for i in train], [points[i] for i in train], [seen_of[i] for i in train])
        model = ErrorModel(w, ())
        for i, g in enumerate(groups):
            if g == group:
                sigma = model.sigma(points[i], seen_of[i])
                inside[i] = abs(residuals[i]) <= Z80 * sigma
                factors[i] = math.exp(Z80 * sigma)
    return [bool(x) for x in inside], factors


@lru_cache(maxsize=1)
def load() -> ErrorModel | None:
    """The shipped error model (None before the first `casmoe validate published --fit`)."""
    if not MODEL_FILE.exists():
        return None
    raw = read_table(MODEL_FILE)
    weights = tuple(float(raw["weights"][n]) for n in FEATURES)
    seen = tuple(Point.from_dict(d) for d in raw.get("seen", []))
    return ErrorModel(weights, seen, int(raw.get("rows", 0)), raw.get("coverage"), raw.get("median_factor"),
                      int(raw.get("sources", 0)), dict(raw.get("notes", {})))
