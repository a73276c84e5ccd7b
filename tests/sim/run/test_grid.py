"""`Grid`: every run option declared once, checked once, and built into `RunSpec`s."""

from __future__ import annotations

import numpy as np
import pytest
from support.builders import one_spec
from hypothesis import given
from hypothesis import strategies as st

from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.sim.run.grid import Grid, GridError, default_capacities
from casmoe.sim.run.options import OPTIONS, SHIPPED_REQUESTS


@given(st.integers(1, 16), st.integers(0, 80))
def test_default_capacities_run_from_top_k_to_what_fits(k, extra):
    fit = k + extra
    slots = [int(c.text) for c in default_capacities(fit, fit * 8, k, "box")]
    assert slots == sorted(set(slots)) and slots[0] == k and slots[-1] == fit
    assert set(slots) - {fit} <= {k, 2 * k, 3 * k, 4 * k}


def test_default_capacities_below_top_k_run_what_fits():
    """A box that holds fewer experts per layer than top_k runs what it holds (the rest staged)
    and the largest pool of whole experts; one that holds none names a configuration that runs."""
    assert [c.label for c in default_capacities(3, 57, 4, "box")] == ["3", "57 global"]
    assert [c.label for c in default_capacities(0, 5, 4, "box")] == ["5 global"]
    with pytest.raises(CasmoeError, match="n-cpu-moe --global-capacity 0"):
        default_capacities(0, 0, 4, "box")


def test_shipped_trace_runs_its_first_requests_and_specs_carry_the_parsed_miss_mode():
    runs = Grid.of({"policy": "lru", "capacity": "4", "miss_mode": " LOAD"}).specs()
    (group,) = runs.groups
    assert len(group.scored.indices) == SHIPPED_REQUESTS < group.scored.total
    assert f"{SHIPPED_REQUESTS} of {group.scored.total} requests (the first {SHIPPED_REQUESTS} of" in group.describe()
    assert [(s.miss_mode.value, s.capacity.text, s.trace.requests) for s in runs.specs] == [
        ("load", "4", tuple(range(SHIPPED_REQUESTS)))
    ]
    whole = Grid.of({"trace": str(shipped(DEFAULT_TRACE)), "policy": "lru", "capacity": "4"}).specs()
    assert whole.specs[0].trace.requests == () and "first" not in whole.groups[0].describe()


def test_a_capacity_beyond_the_gpus_is_refused_unless_overcommitted():
    box = {"policy": "lru", "hardware": "rtx4090x4@gpus=3"}  # Mixtral's 8 experts a layer do not fit 3 GPUs
    with pytest.raises(CasmoeError, match="holds 5 beside the dense weights.*--allow-overcommit"):
        Grid.of({**box, "capacity": "1000"}).specs()
    runs = Grid.of({**box, "capacity": "1000", "allow_overcommit": True}).specs()
    assert len(runs.specs) == 1 and any("simulated anyway" in n for n in runs.notes)
    lenient = Grid.of({**box, "capacity": ["4", "1000"]}).specs(strict=False)
    assert [s.capacity.text for s in lenient.specs] == ["4", "1000"]
    assert list(lenient.refused) == [lenient.specs[1]] and "holds 5" in lenient.refused[lenient.specs[1]]


def test_the_axes_multiply_and_a_combination_given_twice_runs_once():
    runs = Grid.of({"policy": ["lru", "lfu", "lru"], "capacity": [2, "4"], "batch": [1, 2]}).specs()
    assert len(runs.specs) == 2 * 2 * 2
    assert len({s.key for s in runs.specs}) == len(runs.specs)


@pytest.mark.parametrize(("values", "needle"), [
    ({"capacity": 4.5}, "capacity = 4.5 is not a whole number of slots or a memory size"),
    ({"batch": True}, "batch = True is not a whole number"),
    ({"batch": 0}, "batch must be >= 1"),
    ({"rate": float("nan")}, "rate = nan is not a finite number"),
    ({"polcy": "lru"}, "unknown option 'polcy'"),
    ({"requests": [1, 2]}, "requests takes one value"),
    ({"policies": "lru", "policy": "lfu"}, "given twice"),
])
def test_values_that_are_no_option_are_refused_in_one_line(values, needle):
    with pytest.raises(GridError, match=needle):
        Grid.of(values)


def test_numpy_numbers_are_numbers():
    spec = one_spec(capacity=np.int64(4), batch=np.int32(1), adaptive_gating=np.float32(0.5))
    assert spec.capacity.text == "4" and spec.batch == 1 and isinstance(spec.batch, int)


def test_a_sweep_file_takes_option_names_and_the_older_plural_ones(tmp_path):
    cfg = tmp_path / "grid.toml"
    cfg.write_text('policies = ["lru", "lfu"]\ncapacity = [4]\nhardware = "rtx5090"\nrequests = 2\n')
    grid = Grid.from_toml(cfg)
    assert grid.given["policy"] == ("lru", "lfu") and grid.given["hardware"] == ("rtx5090",)
    flags = Grid.of({"policy": ["semoe"]}, "flags")
    merged = grid.with_flags(flags)
    assert merged.given["policy"] == ("semoe",) and merged.given["capacity"] == ("4",)


def test_every_option_has_help_and_a_kind():
    for o in OPTIONS:
        assert o.help.endswith((".", ")")) and o.kind in (str, int, float, bool), o.name
    assert len({o.name for o in OPTIONS}) == len(OPTIONS)
