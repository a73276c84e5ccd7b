"""casmoe.sim: the SimPy model of PCIe/GPU timing driven by routing traces.

`casmoe.sim.simulate(...)` is `casmoe simulate` as a function (`api`: records and a pandas
DataFrame, the command line's defaults and validation), loaded on first use.

Modules (import them directly; this package imports nothing so `import casmoe.sim` stays cheap):

A run, described once:
- `run_options`: every run option declared once (type, default, help, whether it is a grid axis);
- `grid`: `Grid`, run-option values (from the CLI or a TOML), and the one function building runs;
- `spec`: `RunSpec`, one simulation with every value parsed, keyed by the content it depends on;
- `machine`: `Machine`, the model at its precisions on a box under a software stack;
- `fits`: capacities, devices and host RAM checked against the profile (`--allow-overcommit`);
- `run`: running one `RunSpec` (`run`) or many into a folder keeping their results (`run_all`);
- `api`: `simulate(...)`, the what-if API (`Results`: records, `frame()`, `headline()`, notes).

What prices a token:
- `hardware`: `HardwareProfile` (TOML, a source per number), `load_profile`, shipped `profiles/`,
  the published boxes in `catalog/`; `prices`: what a box costs (`prices.toml`);
- `stack`: `Stack`, the costs a runtime pays that the hardware does not explain (`stacks/*.toml`);
- `link`: host-to-device `Link` (free-at time, demand ahead of queued prefetches), `HostCap`;
- `tiers`: the host RAM tier over the storage drive (`--host-cache`), chunked two-tier misses;
- `compute`: `RooflineCompute` (dense part, routed experts, LM head, hand-over), `FixedCompute`.

The passes:
- `decide`: the decision pass (one cache's events per step, as replay makes them);
- `timing`: the timing pass (`StepTimer`: what a step's decisions cost on the machine), with
  `timing_kernel` and `compiled_timing` (the same timing compiled);
- `assembly`: a run's plan (`StepPlan`), setup and state; `engine`: the offline driver;
- `serving`: SimPy processes for arrivals, users, the continuous-batching scheduler and devices;
- `timeliness`: per-layer late hits and wasted prefetches, the perfect-prefetch stall bound;
- `latency`: TTFT, TPOT, end-to-end and queue figures; `result`: `SimResult`;
- `timeline`: the Chrome/Perfetto recorder.

Questions answered with runs:
- `search`: the cheapest configurations meeting a target; `leaderboard`: every policy on every
  workload, scored on requests no fitted part saw; `deploy/`: `casmoe plan`, engine commands,
  memory maps and placements;
- `validation`: the published measurements (`published/`) predicted with stacks fitted on other
  rows; `uncertainty`: the spread it measured, said beside every figure; `calibration`: a
  stack fitted on a user's own measured runs (`casmoe calibrate --measured`);
- `testing`: the simulator half of the policy contract (`check_policy`).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`simulate` and `Results` load with the simulator on first use."""
    if name not in ("simulate", "Results"):
        raise AttributeError(f"module 'casmoe.sim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("casmoe.sim.api"), name)
