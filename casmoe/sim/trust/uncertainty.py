"""What a simulated decode figure is worth: the spread `casmoe validate --published --fit` measured
for its kind of configuration against published measurements of real systems, and where the
configuration lies outside what those measurements covered.

Kept apart from `validation` (which runs grids) so that every run can say its uncertainty
without importing the validation machinery. Every surface that prints a predicted figure
(simulate's table and headline, search's Pareto table, the leaderboard) reads a record's
`uncertainty` (words) and `uncertainty_factor` (a number, None where nothing was validated) and
`uncertainty_outside` (whether it lies outside the published table), which `annotate` sets;
`casmoe.report.uncertainty_cell` makes the table cell of them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

PUBLISHED = Path(__file__).with_name("published")
SPREAD_FILE = PUBLISHED / "spread.toml"
MEASUREMENTS = PUBLISHED / "measurements.toml"
FAMILIES = ("cache", "host", "stream", "gpu")
IDEAL = "ideal"


def family(policy: str, miss_mode: str = "load") -> str:
    """The kind of configuration a run is, for the spreads: every expert on the GPU, host
    compute (a placement, a per-step host choice, or the cpu miss mode: the policy's own
    declaration, `ExpertCache.computes_on_host`), streaming whole layers, or caching."""
    from casmoe.cache import MissMode
    from casmoe.policies import POLICIES

    if policy == "n-cpu-moe[n=0]":  # every expert on the GPU: nothing offloaded
        return "gpu"
    cls = POLICIES.get(policy.partition("[")[0])
    if cls is not None and cls.computes_on_host(MissMode(miss_mode)):
        return "host"
    if policy.startswith("layer-offload"):
        return "stream"
    return "cache"


def family_of(record: dict[str, Any]) -> str:
    """`family` of a record (or a published row's run)."""
    return family(str(record.get("policy", "")), str(record.get("miss_mode") or "load"))


@lru_cache(maxsize=1)
def spreads() -> dict[str, dict[str, float]]:
    """The measured spreads per family (empty before the first `--fit`)."""
    if not SPREAD_FILE.exists():
        return {}
    return tomllib.loads(SPREAD_FILE.read_text())


@dataclass(frozen=True)
class Coverage:
    """What the published table's simulated rows cover: the model presets, the boxes (published
    profiles) and each stack's kinds of configuration."""

    models: frozenset[str]
    boxes: frozenset[str]
    kinds: frozenset[tuple[str, str]]  # (stack, family)


@lru_cache(maxsize=1)
def coverage() -> Coverage:
    """Read once from `casmoe/sim/trust/published/measurements.toml` (its rows with a `run`)."""
    runs = [r["run"] for r in tomllib.loads(MEASUREMENTS.read_text())["row"] if r.get("run")]
    return Coverage(frozenset(str(r["model"]) for r in runs), frozenset(str(r["hardware"]) for r in runs),
                    frozenset((str(r.get("stack", IDEAL)), family_of(r)) for r in runs))


def factor(record: dict[str, Any]) -> float | None:
    """The multiplicative spread (80% of published rows of the record's kind lay within
    figure x/÷ factor), or None where nothing was validated (the ideal stack, an unseen kind)."""
    if record.get("stack", IDEAL) == IDEAL:
        return None
    d = spreads().get(family_of(record))
    return math.exp(d["p80_abs_log_ratio"]) if d else None


def outside(record: dict[str, Any]) -> list[str]:
    """Where the record's configuration lies outside the published rows the spread was measured
    on, in words (none for a record that names neither model, box nor stack): a model or a box
    no published row ran, a stack with no published row of this kind of configuration."""
    cov, out = coverage(), []
    model, box, stack = record.get("model"), record.get("hardware"), record.get("stack")
    if model is not None and model not in cov.models:
        out.append(f"no published row runs {model}")
    if box is not None and str(box).partition("@")[0] not in cov.boxes:
        out.append(f"{box} is not one of the {len(cov.boxes)} published boxes")
    kind = family_of(record)
    if stack not in (None, IDEAL) and (stack, kind) not in cov.kinds:
        out.append(f"stack {stack} has no published {kind} row")
    return out


def spread(record: dict[str, Any]) -> str:
    """What a simulate record's decode figure is worth, in words: the validated spread of its
    kind of configuration, or why it has none, then where it lies outside what was validated."""
    if record.get("stack", IDEAL) == IDEAL:
        return "not validated: the ideal stack is an upper bound (name the runtime with --stack)"
    kind = family_of(record)
    f = factor(record)
    if f is None and not spreads():
        text = "not validated yet: no spread measured (casmoe validate --published --fit measures them)"
    elif f is None:
        text = f"not validated: no published row of a {kind} configuration"
    else:
        text = f"x/÷ {f:.2f} (80% of {int(spreads()[kind]['rows'])} published {kind} rows)"
    beyond = outside(record)
    return text + (f"; outside what was validated: {'; '.join(beyond)}" if beyond else "")


def annotate(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its `uncertainty` (words), `uncertainty_factor` (None where nothing was
    validated) and `uncertainty_outside` (the configuration lies outside the published table) as
    of the spreads now: a stored point is re-annotated when read, so an earlier `--fit` never
    speaks for the current one. A skipped record is returned as it is."""
    if "skipped" in record:
        return record
    return {**record, "uncertainty": spread(record), "uncertainty_factor": factor(record),
            "uncertainty_outside": bool(outside(record))}
