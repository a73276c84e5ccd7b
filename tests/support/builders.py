"""Builders of simulator inputs: a model preset of a trace's own routing shape, the seed box, one
simulator run from a policy name, the one `RunSpec` of some `casmoe simulate` options."""

from __future__ import annotations

from typing import Any

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.presets import ModelPreset


def shaped_preset(g: Geometry, head_dim: int = 8, name: str = "test") -> ModelPreset:
    """A preset with exactly `g`'s routing shape and a tiny dense part."""
    return ModelPreset(name, "tests", g, heads=1, kv_heads=1, head_dim=head_dim, vocab=16)


def seed_box() -> Any:
    """The seed paper's 4x RTX 4090 profile."""
    from casmoe.sim.box.hardware import load_profile

    return load_profile("rtx4090x4")


def sim_run(trace: Any, policy: str | type = "lru", capacity: int | Capacity = 2, hw: Any = None, *,
            preset: ModelPreset | None = None, devices: int = 1, quant: Any = None, pinned: bool = True,
            **kw: Any) -> Any:
    """`run_trace` of a policy (a name or a class) on `hw` (the seed box) with a preset of the
    trace's shape, unless `preset` is given; `kw` are the `Run`'s fields and run_trace's own."""
    from dataclasses import fields

    from casmoe.policies import get_policy
    from casmoe.sim.cost.machine import Machine
    from casmoe.sim.passes.assembly import Run
    from casmoe.sim.passes.driver import run_trace

    cls = get_policy(policy) if isinstance(policy, str) else policy
    cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
    machine = Machine(preset or shaped_preset(trace.geometry), hw or seed_box(), devices, quant, pinned)
    of_run = {f.name for f in fields(Run)}
    run = Run(trace, cls, cap, machine, **{k: v for k, v in kw.items() if k in of_run})
    return run_trace(run, **{k: v for k, v in kw.items() if k not in of_run})


def one_spec(**options: Any) -> Any:
    """The one `RunSpec` of these `casmoe simulate` options (LRU at 4 slots on the first two
    requests of the shipped trace unless they say otherwise)."""
    from casmoe.sim.run.grid import Grid

    runs = Grid.of({"policy": "lru", "capacity": "4", "requests": 2, **options}).specs()
    assert len(runs.specs) == 1, runs.specs
    return runs.specs[0]
