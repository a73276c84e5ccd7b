"""casmoe.sim.box: the box a run is priced on.

- `hardware`: `HardwareProfile` (TOML, a source per number), `load_profile`, variants
  (`rtx4090x4@gpus=1,link=pcie5`), the shipped `profiles/` and the published boxes' profiles;
  `catalog/` holds the vendor facts of GPUs and CPUs the published boxes are built from;
- `prices`: what a box costs in dollars (`prices.toml`), for search's Pareto table;
- `detect`: the user's own box as a profile, every number read, measured or assumed (said which),
  built from `reader` (the one way to a machine's tools and files, live or recorded), `readings`
  (their outputs parsed), `parts` (the catalogs' and links' figures for the parts found) and
  `bandwidth` (a short probe of the host's memory).
"""
