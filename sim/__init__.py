"""casmoe.sim: the SimPy model of PCIe/GPU timing driven by routing traces.

Modules (import them directly; this package imports nothing so `import casmoe.sim` stays cheap):

- `hardware`: `HardwareProfile` (TOML, a source per number), `load_profile`, shipped `profiles/`;
- `link`: host-to-device `Link` (free-at time, demand ahead of queued prefetches), `HostCap`;
- `compute`: `RooflineCompute` (dense part, routed experts, LM head, hand-over), `FixedCompute`;
- `engine`: `simulate(trace, policy, capacity, hardware, preset, ...)`, `StepPlan`;
- `result`: `SimResult`; `timeline`: Chrome/Perfetto recorder; `sweep`: grids, local or Ray.
"""
