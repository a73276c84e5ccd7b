"""What a simulated decode figure is worth: the spread `casmoe validate --published --fit` measured
for its kind of configuration against published measurements of real systems.

Kept apart from `validation` (which runs grids) so that every run can say its uncertainty
without importing the validation machinery.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import tomllib

PUBLISHED = Path(__file__).with_name("published")
SPREAD_FILE = PUBLISHED / "spread.toml"
FAMILIES = ("cache", "host", "stream", "gpu")


def family(policy: str) -> str:
    """The kind of configuration a policy spec runs, for the spreads: every expert on the GPU,
    host compute, streaming whole layers, or caching."""
    if policy == "n-cpu-moe[n=0]":  # every expert on the GPU: nothing offloaded
        return "gpu"
    if policy.startswith(("n-cpu-moe", "ktransformers", "fiddler", "hybrimoe")):
        return "host"
    if policy.startswith("layer-offload"):
        return "stream"
    return "cache"


@lru_cache(maxsize=1)
def spreads() -> dict[str, dict[str, float]]:
    """The measured spreads per family (empty before the first `--fit`)."""
    if not SPREAD_FILE.exists():
        return {}
    return tomllib.loads(SPREAD_FILE.read_text())


def factor(record: dict[str, Any]) -> float | None:
    """The multiplicative spread (80% of published rows of the record's kind lay within
    figure x/÷ factor), or None where nothing was validated (the ideal stack, an unseen kind)."""
    if record.get("stack", "ideal") == "ideal":
        return None
    d = spreads().get(family(str(record.get("policy", ""))))
    return math.exp(d["p80_abs_log_ratio"]) if d else None


def spread(record: dict[str, Any]) -> str:
    """What a simulate record's decode figure is worth, in words: the validated spread of its
    kind of configuration, or why it has none."""
    if record.get("stack", "ideal") == "ideal":
        return "not validated: the ideal stack is an upper bound (name the runtime with --stack)"
    kind = family(str(record.get("policy", "")))
    f = factor(record)
    if f is None:
        return f"not validated: no published row of a {kind} configuration"
    return f"x/÷ {f:.2f} (80% of {int(spreads()[kind]['rows'])} published {kind} rows)"
