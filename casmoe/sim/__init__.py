"""casmoe.sim: the SimPy model of PCIe/GPU timing driven by routing traces.

`casmoe.sim.simulate(...)` is `casmoe simulate` as a function (`api`: records and a pandas
DataFrame, the command line's defaults and validation), loaded on first use; `testing` holds the
simulator half of the policy contract (`check_policy`).

Subpackages, bottom to top (a module imports only from its own room and the rooms before it;
tests/project/test_layers.py keeps that):
- `box/`: the hardware (`HardwareProfile`, shipped profiles, the published boxes' catalog) and
  what a box costs in dollars;
- `cost/`: what prices a token: the model at its precisions on a box under a software stack
  (`Machine`), the roofline, the runtime's own costs (`Stack`);
- `passes/`: the passes that walk a run in time: decisions, timing (and its compiled twin), the
  link and the host RAM tier, the offline driver and the SimPy serving processes, what a run reports;
- `trust/`: how far to trust a figure: the published measurements and the spread they measured;
- `run/`: a run described once (`RunSpec`), from options or a grid, checked against the box,
  and run into a folder that keeps its results;
- `questions/`: questions answered with runs: search, leaderboard, deploy (`casmoe plan`),
  validation against the published table, calibration on a user's own runs.

Import modules directly; this package imports nothing, so `import casmoe.sim` stays cheap.
"""


import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """`simulate` and `Results` load with the simulator on first use."""
    if name not in ("simulate", "Results"):
        raise AttributeError(f"module 'casmoe.sim' has no attribute {name!r}")

    return getattr(importlib.import_module("casmoe.sim.api"), name)
