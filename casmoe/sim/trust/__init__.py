"""casmoe.sim.trust: how far to trust a figure.

- `error_model`: the spread of a prediction's error as a function of its configuration, fitted on
  the published table's left-out residuals, its 80% interval's coverage measured leaving sources out;
- `uncertainty`: that interval and where a configuration lies far from what was measured, said
  beside every figure;
- `published/`: the published measurements of real systems, their boxes and those boxes' profiles,
  and the fitted error model.
"""
