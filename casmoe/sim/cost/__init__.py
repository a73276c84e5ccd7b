"""casmoe.sim.cost: what prices a token.

- `machine`: `Machine`, the model preset at its precisions on a box under a software stack;
- `compute`: `RooflineCompute` (dense part, routed experts, LM head, hand-over), `FixedCompute`;
- `stack`: `Stack`, the costs a runtime pays that the hardware does not explain (`stacks/*.toml`).
"""
