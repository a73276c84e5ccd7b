"""From a simulated answer to the deployment: `casmoe plan`.

`model` says what `--model` names (a preset, the user's GGUF, a checkpoint's config, a Hugging
Face id); `support` what each engine version can run (casmoe/engines/support.toml); `quality` which
precisions a plan compares and what each costs; `engines` each engine's flags as read in its
source and the command lines written with them; `memory` the memory map (per GPU and per host
NUMA node, from the simulator's own sizes); `placement` the routing-aware choice of what stays on
which GPU; `routing` which trace a plan is fitted on; `configurations` each engine's
configurations at one precision; `candidate` one of them, as one object; `plan` the search over
them all, simulated through `Grid` and `run_all`, ranked and written; `terms` any simulated
placement as its engine is told it (search's and the leaderboard's answers).
"""

from casmoe.sim.questions.deploy.plan import Plan, PlanError, PlanRequest, make_plan

__all__ = ["Plan", "PlanError", "PlanRequest", "make_plan"]
