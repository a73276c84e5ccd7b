"""Builders the test modules share: a model preset of a trace's own routing shape, the seed's
hardware profile, and one simulator run from a policy name."""

from __future__ import annotations

from typing import Any

import pytest

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.presets import ModelPreset


@pytest.fixture(autouse=True)
def _own_user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or fills the user's cache (`~/.cache/casmoe`): a test must not pass or fail
    by what an earlier run left there. One folder for the whole session, so a planner or an
    embedder export fitted by one test serves the next, as it would a user."""
    import os

    if "CASMOE_CACHE" not in os.environ or not os.environ["CASMOE_CACHE"].startswith(str(tmp_path_factory.getbasetemp())):
        monkeypatch.setenv("CASMOE_CACHE", str(tmp_path_factory.getbasetemp() / "casmoe-cache"))


def shaped_preset(g: Geometry, head_dim: int = 8, name: str = "test") -> ModelPreset:
    """A preset with exactly `g`'s routing shape and a tiny dense part."""
    return ModelPreset(name, "tests", g, heads=1, kv_heads=1, head_dim=head_dim, vocab=16)


def seed_box() -> Any:
    """The seed paper's 4x RTX 4090 profile."""
    from casmoe.sim.hardware import load_profile

    return load_profile("rtx4090x4")


def sim_run(trace: Any, policy: str | type = "lru", capacity: int | Capacity = 2, hw: Any = None, *,
            preset: ModelPreset | None = None, devices: int = 1, quant: Any = None, pinned: bool = True,
            **kw: Any) -> Any:
    """`run_trace` of a policy (a name or a class) on `hw` (the seed box) with a preset of the
    trace's shape, unless `preset` is given; `kw` are run_trace's."""
    from casmoe.policies import get_policy
    from casmoe.sim.engine import run_trace
    from casmoe.sim.machine import Machine

    cls = get_policy(policy) if isinstance(policy, str) else policy
    cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
    machine = Machine(preset or shaped_preset(trace.geometry), hw or seed_box(), devices, quant, pinned)
    return run_trace(trace, cls, cap, machine, **kw)


def one_spec(**options: Any) -> Any:
    """The one `RunSpec` of these `casmoe simulate` options (LRU at 4 slots on the first two
    requests of the shipped trace unless they say otherwise)."""
    from casmoe.sim.grid import Grid

    runs = Grid.of({"policy": "lru", "capacity": "4", "requests": 2, **options}).specs()
    assert len(runs.specs) == 1, runs.specs
    return runs.specs[0]
