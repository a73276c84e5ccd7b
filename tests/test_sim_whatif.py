"""`what_if`: the decisions `casmoe simulate` makes before anything runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec
from casmoe.policies import POLICIES, parse_policies
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.sim.whatif import SHIPPED_REQUESTS, default_capacities, what_if


@given(st.integers(1, 16), st.integers(0, 80))
def test_default_capacities_run_from_top_k_to_what_fits(k, extra):
    fit = k + extra
    slots = [int(c.text) for c in default_capacities(fit, k, "box")]
    assert slots == sorted(set(slots)) and slots[0] == k and slots[-1] == fit
    assert set(slots) - {fit} <= {k, 2 * k, 3 * k, 4 * k}


def test_default_capacities_below_top_k_is_a_clear_error():
    with pytest.raises(CasmoeError, match="below top_k=4"):
        default_capacities(3, 4, "box")


def test_shipped_trace_runs_its_first_requests_and_points_carry_the_parsed_miss_mode():
    lru = parse_policies(["lru"], POLICIES)
    plan = what_if(shipped(DEFAULT_TRACE), lru, [CapacitySpec("4")], shipped=True, miss_mode=" LOAD")
    assert len(plan.trace.requests) == SHIPPED_REQUESTS < plan.total_requests
    assert f"{SHIPPED_REQUESTS} of {plan.total_requests} requests (the first {SHIPPED_REQUESTS} of" in plan.describe()
    assert [(p.miss_mode, p.capacity.text, p.requests) for p in plan.points] == [
        ("load", "4", tuple(range(SHIPPED_REQUESTS)))
    ]
    whole = what_if(shipped(DEFAULT_TRACE), lru, [CapacitySpec("4")], requests=0)
    assert len(whole.trace.requests) == whole.total_requests and "first" not in whole.describe()


def test_a_capacity_beyond_the_gpus_is_refused_unless_overcommitted():
    lru = parse_policies(["lru"], POLICIES)
    with pytest.raises(CasmoeError, match="holds 7 beside the dense weights.*--allow-overcommit"):
        what_if(shipped(DEFAULT_TRACE), lru, [CapacitySpec("1000")], shipped=True)
    plan = what_if(shipped(DEFAULT_TRACE), lru, [CapacitySpec("1000")], shipped=True, overcommit=True)
    assert len(plan.points) == 1 and any("simulated anyway" in n for n in plan.notes)
