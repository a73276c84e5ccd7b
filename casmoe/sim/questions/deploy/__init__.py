"""From a simulated answer to the deployment: `casmoe plan`.

`engines` holds each engine's flags as read in its source and writes its command lines;
`memory` the memory map (per GPU and per host NUMA node); `placement` the routing-aware choice
of what stays on which GPU; `model` what `--model` names (a preset, or a checkpoint's config matched to one); `routing` which trace a plan is fitted on; `plan` the search over
each engine's configurations, simulated through `Grid` and `run_all`.
"""

from casmoe.sim.questions.deploy.plan import Plan, PlanError, PlanRequest, make_plan

__all__ = ["Plan", "PlanError", "PlanRequest", "make_plan"]
