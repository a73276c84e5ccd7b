"""casmoe.sim.trust: how far to trust a figure.

- `uncertainty`: the spread the published table measured for each kind of configuration, said
  beside every figure;
- `published/`: the published measurements of real systems, their boxes and those boxes' profiles.
"""
