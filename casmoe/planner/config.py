"""The planner's settings, with no numpy: the CLI builds its options from these defaults at
start-up, and `casmoe --help` should not pay for numpy."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from casmoe.errors import CasmoeError


class Phase(enum.Enum):
    """Which tokens of a request a pattern sums over."""

    DECODE = "decode"
    PREFILL = "prefill"
    ALL = "all"


class PlannerError(CasmoeError, ValueError):
    """A planner that cannot be fitted, read, or applied to the given trace."""


PREDICTORS = ("linear", "transformer")


@dataclass(frozen=True)
class EAPConfig:
    """The predictor: `kind` "linear" (ridge on the prompt's sentence embedding, penalty
    `ridge`: the default, no torch) or "transformer" (the seed paper's encoder, trained with
    the knobs below; it needs torch to fit and to serve)."""

    kind: str = "linear"
    ridge: float = 1.0
    hidden: int = 64
    layers: int = 6
    heads: int = 4
    intermediate: int = 128
    head_hidden: int = 64
    max_len: int = 64
    dropout: float = 0.1
    alpha: float = 0.1
    temperature: float = 0.05
    huber_delta: float = 1.0
    epochs: int = 30
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01


@dataclass(frozen=True)
class PlannerConfig:
    """Gate, matcher, label and split settings, the predictor's, the trajectory stage's, and
    the seed of all.

    `exclude_tasks`: requests of these tasks are left out of the fit (leave-one-task-out).
    `folds`: the fit data is cut into this many validation folds (by task when it has two or
    more tasks, else by request), whose out-of-fold answers fit the confidence gate and train
    the trajectory stage. `epsilon` is the seed's fixed gate, used by planners fitted before
    the confidence gate and by `casmoe planner eval --epsilon`. `horizon`: the trajectory
    stage predicts use within this many decode tokens (0: it regresses the log distance to
    the next use instead); `cadence`: it re-matches the routing path every this many."""

    epsilon: float = 0.8
    neighbours: int = 5
    buffer: int = 30
    phase: Phase = Phase.DECODE
    weighted: bool = True
    holdout_every: int = 5
    exclude_tasks: tuple[str, ...] = ()
    seed: int = 0
    folds: int = 4
    horizon: int = 8
    cadence: int = 8
    eap: EAPConfig = field(default_factory=EAPConfig)

    def __post_init__(self) -> None:
        if self.eap.kind not in PREDICTORS:
            raise PlannerError(f"predictor kind must be one of {', '.join(PREDICTORS)}, got {self.eap.kind!r}")
        if self.folds < 2 or self.horizon < 0 or self.cadence < 1:
            raise PlannerError("folds must be >= 2, horizon >= 0 and cadence >= 1")
        if self.holdout_every < 0 or self.holdout_every == 1:
            raise PlannerError("holdout_every must be 0 (no hold-out) or >= 2")
        if self.neighbours < 1 or self.buffer < 1:
            raise PlannerError("neighbours and buffer must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlannerConfig:
        extra = {"exclude_tasks": tuple(d.get("exclude_tasks", ()))}  # absent in folders of older versions
        eap = {"kind": "transformer", **d["eap"]}  # folders before the linear predictor hold a transformer
        return cls(**{**d, **extra, "phase": Phase(d["phase"]), "eap": EAPConfig(**eap)})
