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


@dataclass(frozen=True)
class EAPConfig:
    """The predictor's architecture and training knobs (defaults: the seed paper's encoder)."""

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
    """Gate, matcher, label and split settings, the predictor's, and the seed of both.

    `exclude_tasks`: requests of these tasks are left out of the fit (leave-one-task-out)."""

    epsilon: float = 0.8
    neighbours: int = 5
    buffer: int = 30
    phase: Phase = Phase.DECODE
    weighted: bool = True
    holdout_every: int = 5
    exclude_tasks: tuple[str, ...] = ()
    seed: int = 0
    eap: EAPConfig = field(default_factory=EAPConfig)

    def __post_init__(self) -> None:
        if self.holdout_every < 0 or self.holdout_every == 1:
            raise PlannerError("holdout_every must be 0 (no hold-out) or >= 2")
        if self.neighbours < 1 or self.buffer < 1:
            raise PlannerError("neighbours and buffer must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.value
        return d

    @classmethod
    def from_dict(cls, d: Any) -> PlannerConfig:
        """From `to_dict`'s form, every field checked against its default's type (planner.json
        is a file a user can edit: `"epsilon": "0.8"` is refused, not compared as a string)."""
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
        elif isinstance(want, tuple):
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        else:  # a nested dataclass: checked by its own call
            ok = isinstance(value, dict)
        if not ok:
            kinds = [(enum.Enum, "a string"), (bool, "true or false"), (int, "an integer"), (float, "a finite number"),
                     (tuple, "a list of strings")]
            kind = next((k for t, k in kinds if isinstance(want, t)), "a mapping")
            raise PlannerError(f"{where}.{name} must be {kind}, not {value!r}")
    return d
