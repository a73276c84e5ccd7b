"""The CasMoE planner: prompt-level prediction of every layer's experts.

`load_planner(folder)` gives a `Planner` whose `predict(prompt)` returns scores [L, E] for
`planner.geometry`; `fit_planner(trace, PlannerConfig(...))` builds one. Importing this package
loads neither torch nor the sentence model: they load when a planner is fitted or read.
"""

import importlib
from typing import TYPE_CHECKING, Any

from casmoe.planner.config import EAPConfig, PlannerConfig, PlannerError

if TYPE_CHECKING:
    from casmoe.planner.planner import Planner, fit_planner, load_planner

__all__ = ["EAPConfig", "Planner", "PlannerConfig", "PlannerError", "fit_planner", "load_planner"]


def __getattr__(name: str) -> Any:
    """`Planner`, `fit_planner` and `load_planner` load with numpy on first use (the CLI's
    start-up imports this package for the settings only)."""
    if name not in ("Planner", "fit_planner", "load_planner"):
        raise AttributeError(f"module 'casmoe.planner' has no attribute {name!r}")
    return getattr(importlib.import_module("casmoe.planner.planner"), name)
