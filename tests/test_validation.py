"""casmoe held against published measurements (`casmoe.sim.questions.validation`): the table as data, the
fit that never scores its own rows, the bound that flags configurations that cannot have run,
and the spreads every prediction prints."""

from __future__ import annotations

import dataclasses
import math

import pytest

from casmoe.sim.questions import validation as v
from casmoe.sim.cost.stack import Shared, load_stack, stack_paths

ROWS = v.load_rows()
BY_ID = {r.id: r for r in ROWS}


def test_the_table_has_what_the_issue_asks_for() -> None:
    """At least 25 rows casmoe can express, from at least 7 systems, each with a source."""
    runs = [r for r in ROWS if r.run]
    assert len(runs) >= 25
    assert len({r.system for r in runs}) >= 7
    for r in ROWS:
        assert r.source and r.kind and r.value > 0, r.id
        assert r.run or r.scope, f"{r.id}: neither a configuration nor why it has none"


def test_every_run_names_a_shipped_stack_and_a_published_box() -> None:
    from casmoe.sim.box.hardware import load_profile

    stacks = stack_paths()
    for r in ROWS:
        if r.run:
            assert r.stack in stacks, r.id
            load_profile(r.run["hardware"])  # a published box, found by name


def test_every_run_is_one_configuration() -> None:
    # a bare policy name with variants (n-cpu-moe: with and without op offload) would run two
    from casmoe.policies import POLICIES, parse_policies

    for r in ROWS:
        if r.run:
            assert len(parse_policies([r.run["policy"]], POLICIES)) == 1, r.id


def test_fit_rows_are_never_the_rows_a_stack_is_scored_on() -> None:
    """Each stack's fitted fields name rows of its own stack; no row is fitted by two stacks."""
    seen: dict[str, str] = {}
    for name in stack_paths():
        for ids in load_stack(name).fitted_on.values():
            for i in ids:
                assert BY_ID[i].stack == name
                assert seen.setdefault(i, name) == name


def _row(**edit) -> v.Row:
    base = BY_ID["mixoff-a100-hqq2-ondemand"]
    return dataclasses.replace(base, **edit)


def test_a_row_is_predicted_on_its_cut_trace_with_held_out_requests() -> None:
    (spec,) = v.specs_for(BY_ID["mixoff-a100-hqq2-lru"])
    assert spec.trace.requests and len(spec.trace.requests) == v.REQUESTS
    assert spec.policy.name == "lru" and spec.machine.stack.name == "mixtral-offloading"
    assert spec.machine.quant.name == "hqq2" and spec.machine.dense_quant.name == "hqq4"


def test_the_ideal_bound_is_never_slower_than_a_stack() -> None:
    for i in ("mixoff-a100-hqq2-ondemand", "mixoff-a100-hqq2-lru", "hfaccel-mixoff-a100-hqq2-naive"):
        row = BY_ID[i]
        assert v.bound(row) >= v.predict(row, load_stack(row.stack).resolved()) * (1 - 1e-9)


def test_fit_recovers_the_constants_that_made_the_measurements() -> None:
    """Rows "measured" by a known stack: the fit finds its per-layer cost and copy efficiency
    again from the two on-demand rows whose experts differ only in bytes."""
    truth = dataclasses.replace(load_stack("mixtral-offloading"), layer_us=3000.0, copy_efficiency=0.4)
    rows = {}
    for i in ("mixoff-a100-hqq2-ondemand", "mixoff-a100-hqq3-ondemand"):
        r = BY_ID[i]
        measured = v.predict(r, truth.resolved())
        rows[i] = dataclasses.replace(r, metric="decode_tok_s", value=measured)
    start = dataclasses.replace(truth, layer_us=0.0, copy_efficiency=1.0)
    fitted, errors = v.fit_stack(start, rows, v.load_shared())
    assert fitted.layer_us == pytest.approx(3000.0, rel=0.05)
    assert fitted.copy_efficiency == pytest.approx(0.4, rel=0.05)
    assert set(errors) == {"layer_us", "copy_efficiency"}  # two rows, two fields: no residual to judge them by
    assert all(math.isinf(e) for e in errors.values())


def test_a_fit_on_rows_that_do_not_exist_is_refused() -> None:
    stack = dataclasses.replace(load_stack("llama.cpp"), fitted_on={"layer_us": ["no-such-row"]})
    with pytest.raises(v.ValidationError, match="no-such-row"):
        v.fit_stack(stack, BY_ID, v.load_shared())


def test_the_shared_default_leaves_the_predicted_system_out() -> None:
    base = Shared(0.8, 0.5, {"host_efficiency": "file", "host_flops_efficiency": "file"})
    a = dataclasses.replace(load_stack("ideal"), name="a", host_efficiency=0.2, fitted_on={"host_efficiency": ["x"]})
    b = dataclasses.replace(load_stack("ideal"), name="b", host_efficiency=0.4, fitted_on={"host_efficiency": ["y"]})
    c = dataclasses.replace(load_stack("ideal"), name="c")  # fits none: takes the shared default
    stacks = {"a": a, "b": b, "c": c}
    systems = {"a": {"A"}, "b": {"B"}, "c": set()}
    assert v.shared_without(None, stacks, systems, base).host_efficiency == pytest.approx(0.3)
    assert v.shared_without("A", stacks, systems, base).host_efficiency == pytest.approx(0.4)
    assert v.shared_without("B", stacks, systems, base).host_efficiency == pytest.approx(0.2)
    lonely = {"a": a, "c": c}
    assert v.shared_without("A", lonely, {"a": {"A"}, "c": set()}, base) is base  # nothing else measured it


def _result(i: str, predicted: float, role: str = "predicted") -> v.Result:
    return v.Result(BY_ID[i], role, predicted)


def test_summary_rankings_and_spreads_read_only_predicted_rows() -> None:
    a, b = BY_ID["mixoff-a100-hqq2-lru"], BY_ID["mixoff-a100-hqq2-full"]
    results = [
        _result(a.id, a.rate * 2.0),  # x2: right order below, since full is faster measured and predicted
        _result(b.id, b.rate * 2.5),
        _result("mixoff-a100-hqq2-ondemand", 99.0, role="fit"),
        v.Result(BY_ID["hfaccel-mixoff-a100-hqq2-naive"], "beyond bound", bound=0.5),
    ]
    val = v.Validation(results, {}, v.load_shared())
    s = val.summary()
    assert s["predicted"] == 2 and s["fit_rows"] == 1 and s["beyond_bound"] == ["hfaccel-mixoff-a100-hqq2-naive"]
    assert s["median_abs_log_ratio"] == pytest.approx((math.log(2.0) + math.log(2.5)) / 2)
    assert s["beyond_2x"] == 1
    # measured: full > lru > ondemand; predicted: full > lru, but the fit row's 99 beats both
    assert s["rankings"]["pairs"] == 3 and len(s["rankings"]["broken"]) == 2
    spreads = val.spreads()
    assert set(spreads) == {"cache"} and spreads["cache"]["rows"] == 2
    assert spreads["cache"]["p80_abs_log_ratio"] == pytest.approx(math.log(2.5))


def test_spread_says_what_a_figure_is_worth(monkeypatch) -> None:
    from casmoe.sim.trust import uncertainty as u

    monkeypatch.setattr(u, "spreads", lambda: {"host": {"p80_abs_log_ratio": math.log(1.5), "rows": 7.0}})
    assert "not validated" in u.spread({"stack": "ideal", "policy": "lru"})
    assert u.spread({"stack": "llama.cpp", "policy": "n-cpu-moe[n=3]"}) == "x/÷ 1.50 (80% of 7 published host rows)"
    assert u.spread({"stack": "llama.cpp", "policy": "lru"}) == ("not validated: no published row of a cache configuration; "
                                                                 "outside what was validated: stack llama.cpp has no published cache row")
    assert [u.family(p) for p in ("n-cpu-moe[n=0]", "fiddler", "layer-offload[n=2]", "se-moe")] == [
        "gpu", "host", "stream", "cache"]
    # host compute is the policy's own declaration: a placement, a per-step host choice, the cpu miss mode
    assert [u.family(p, m) for p, m in (("routed-placement", "load"), ("hybrimoe", "load"), ("lru", "cpu"),
                                        ("lru", "load"))] == ["host", "host", "host", "cache"]


def test_cli_help_names_the_published_mode() -> None:
    from typer.testing import CliRunner

    from casmoe.cli import app

    result = CliRunner().invoke(app, ["validate", "--help"])
    assert result.exit_code == 0 and "--published" in result.output and "--fit" in result.output


@pytest.mark.slow
def test_the_whole_table_is_predicted_without_scoring_a_fit_row() -> None:
    result = v.validate()
    fit = {i for name in stack_paths() for ids in load_stack(name).fitted_on.values() for i in ids}
    for r in result.results:
        if r.role == "predicted":
            assert r.row.id not in fit and r.predicted > 0 and r.bound >= r.predicted * (1 - 1e-9)
        if r.role == "beyond bound":
            assert r.row.rate > r.bound * v.BOUND_TOLERANCE
    s = result.summary()
    assert s["predicted"] >= 25 and len(s["systems"]) >= 7
