"""The planner's settings, with no numpy: the CLI builds its options from these defaults at
start-up, and `casmoe --help` should not pay for numpy."""

from __future__ import annotations

import enum
import math
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
EMBEDDINGS = ("int8", "fp32")
"""Prompt-embedding precisions a planner can be fitted with (casmoe/planner/embedding.py)."""


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
    the next use instead); `cadence`: it re-matches the routing path every this many.
    `embedding`: the prompt embedder's precision, one of EMBEDDINGS (int8: about 3x faster
    per prompt; bench/bench_embedder.py); the planner serves with the one it was fitted with
    (folders from before the field: fp32)."""

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
    embedding: str = "int8"
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
        if self.embedding not in EMBEDDINGS:
            raise PlannerError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {self.embedding!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.value
        return d

    @classmethod
    def from_dict(cls, d: Any) -> PlannerConfig:
        """From `to_dict`'s form, every field checked against its default's type (planner.json
        is a file a user can edit: `"epsilon": "0.8"` is refused, not compared as a string)."""
        if isinstance(d, dict):  # fields later versions added, absent from older folders
            d = {"folds": 4, "horizon": 8, "cadence": 8, "embedding": "fp32", **d}
            if isinstance(d.get("eap"), dict):  # before the linear predictor: a transformer
                d["eap"] = {"kind": "transformer", "ridge": 1.0, **d["eap"]}
        d = dict(_typed(cls, d, "config"))
        d.setdefault("exclude_tasks", ())  # absent in folders of older versions
        try:
            d["phase"] = Phase(d["phase"])
        except ValueError:
            raise PlannerError(f"config.phase must be one of {[p.value for p in Phase]}, not {d['phase']!r}") from None
        d["exclude_tasks"] = tuple(d["exclude_tasks"])
        d["eap"] = EAPConfig(**_typed(EAPConfig, d["eap"], "config.eap"))
        return cls(**d)


def _typed(cls: type, d: Any, where: str) -> dict[str, Any]:
    """`d`'s entries for the fields of dataclass `cls`, each of its default's type (an int is a
    float; a bool is neither), floats finite; every field but `exclude_tasks` required."""
    if not isinstance(d, dict):
        raise PlannerError(f"{where} must be a mapping, not {type(d).__name__}")
    fields = {f.name: f for f in cls.__dataclass_fields__.values()}
    unknown = sorted(set(d) - set(fields))
    missing = sorted(set(fields) - set(d) - {"exclude_tasks"})
    if unknown or missing:
        raise PlannerError(f"{where}: {'unknown' if unknown else 'missing'} field {(unknown or missing)[0]!r}")
    defaults = cls()
    for name, value in d.items():
        want = getattr(defaults, name)
        if isinstance(want, enum.Enum):
            ok = isinstance(value, str)
        elif isinstance(want, bool):
            ok = isinstance(value, bool)
        elif isinstance(want, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(want, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif isinstance(want, str):
            ok = isinstance(value, str)
        elif isinstance(want, tuple):
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        else:  # a nested dataclass: checked by its own call
            ok = isinstance(value, dict)
        if not ok:
            kinds = [(enum.Enum, "a string"), (str, "a string"), (bool, "true or false"), (int, "an integer"),
                     (float, "a finite number"), (tuple, "a list of strings")]
            kind = next((k for t, k in kinds if isinstance(want, t)), "a mapping")
            raise PlannerError(f"{where}.{name} must be {kind}, not {value!r}")
    return d
