"""The CasMoE planner: prompt-level prediction of every layer's experts.

`load_planner(folder)` gives a `Planner` whose `predict(prompt)` returns scores [L, E] for
`planner.geometry`; `fit_planner(trace, PlannerConfig(...))` builds one. Importing this package
loads neither torch nor the sentence model: they load when a planner is fitted or read.
"""

from casmoe.planner.planner import EAPConfig, Planner, PlannerConfig, PlannerError, fit_planner, load_planner

__all__ = ["EAPConfig", "Planner", "PlannerConfig", "PlannerError", "fit_planner", "load_planner"]
