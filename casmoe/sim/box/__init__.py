"""casmoe.sim.box: the box a run is priced on.

- `hardware`: `HardwareProfile` (TOML, a source per number), `load_profile`, variants
  (`rtx4090x4@gpus=1,link=pcie5`), the shipped `profiles/` and the published boxes' profiles;
  `catalog/` holds the vendor facts of GPUs and CPUs the published boxes are built from;
- `prices`: what a box costs in dollars (`prices.toml`), for search's Pareto table.
"""
