"""casmoe.sim: the SimPy model of PCIe/GPU timing driven by routing traces.

`casmoe.sim.simulate(...)` is `casmoe simulate` as a function (`api`: records and a pandas
DataFrame, the command line's defaults and validation), loaded on first use.

Modules (import them directly; this package imports nothing so `import casmoe.sim` stays cheap):

- `api`: `simulate(...)`, the what-if API (`Results`: records, `frame()`, `headline()`, notes);
- `fits`: capacities, devices and host RAM checked against the profile (`--allow-overcommit`);

- `hardware`: `HardwareProfile` (TOML, a source per number), `load_profile`, shipped `profiles/`;
- `link`: host-to-device `Link` (free-at time, demand ahead of queued prefetches), `HostCap`;
- `tiers`: the host RAM tier over the storage drive (`--host-cache`), chunked two-tier misses;
- `compute`: `RooflineCompute` (dense part, routed experts, LM head, hand-over), `FixedCompute`;
- `decide`: the decision pass (one cache's events per step, as replay makes them);
- `timing`: the timing pass (`StepTimer`: what a step's decisions cost on the machine);
- `timeliness`: per-layer late hits and wasted prefetches, the perfect-prefetch stall bound;
- `engine`: `simulate(trace, policy, capacity, hardware, preset, ...)`, `StepPlan`, the offline path;
- `serving`: SimPy processes for arrivals, users, the continuous-batching scheduler and devices;
- `latency`: TTFT, TPOT, end-to-end and queue figures of a run;
- `result`: `SimResult`; `timeline`: Chrome/Perfetto recorder; `sweep`: grids, local or Ray.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`simulate` and `Results` load with the simulator on first use."""
    if name not in ("simulate", "Results"):
        raise AttributeError(f"module 'casmoe.sim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("casmoe.sim.api"), name)
