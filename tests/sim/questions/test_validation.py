"""casmoe held against published measurements (`casmoe.sim.questions.validation`): the table as data, the
fit that never predicts a row with its own setup's measurements, the linear models it fits on, the
bound that flags configurations that cannot have run, and the summary."""

from __future__ import annotations

import dataclasses
import math

import pytest

from casmoe.sim.questions import validation as v
from casmoe.sim.cost.stack import load_stack, stack_paths

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
    ids = ["mixoff-a100-hqq2-ondemand", "mixoff-a100-hqq3-ondemand"]
    truth = dataclasses.replace(load_stack("mixtral-offloading"), layer_us=3000.0, copy_efficiency=0.4,
                                fitted_on={"layer_us": ids, "copy_efficiency": ids})
    rows = {}
    for i in ids:
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


def test_the_linear_model_is_exact_in_an_additive_cost_and_close_in_an_efficiency() -> None:
    """A row's time moves exactly linearly with the per-layer cost; in an efficiency's
    reciprocal it is linear where the time is bandwidth-bound."""
    row = BY_ID["mixoff-a100-hqq2-ondemand"]
    stack = load_stack("mixtral-offloading").resolved()
    lin = v.linearize(row, stack, ["layer_us", "copy_efficiency"])
    for layer_us, eff in ((stack.layer_us + 1500.0, stack.copy_efficiency), (stack.layer_us, 0.7 * stack.copy_efficiency)):
        moved = dataclasses.replace(stack, layer_us=layer_us, copy_efficiency=eff)
        want = 1.0 / v.predict(row, moved)
        rel = 1e-9 if eff == stack.copy_efficiency else 0.05
        assert lin.time(v._to_x(moved, ["layer_us", "copy_efficiency"])) == pytest.approx(want, rel=rel)


def test_a_fit_on_the_linear_models_recovers_the_constants_that_made_the_rows() -> None:
    truth = dataclasses.replace(load_stack("mixtral-offloading").resolved(), layer_us=3000.0, copy_efficiency=0.4)
    rows = [dataclasses.replace(BY_ID[i], metric="decode_tok_s", value=v.predict(BY_ID[i], truth))
            for i in ("mixoff-a100-hqq2-ondemand", "mixoff-a100-hqq3-ondemand", "mixoff-t4-hqq2-ondemand")]
    start = dataclasses.replace(truth, layer_us=500.0, copy_efficiency=0.9)
    fit = v.fit_stack_rows(start, rows)
    assert fit.stack.layer_us == pytest.approx(3000.0, rel=0.05)
    assert fit.stack.copy_efficiency == pytest.approx(0.4, rel=0.05)


def test_a_setup_is_predicted_by_constants_fitted_without_it() -> None:
    """Each source's box is left out of the fit that predicts it: a row made wildly slower than
    the rest moves the others' constants, never its own prediction's."""
    truth = dataclasses.replace(load_stack("mixtral-offloading").resolved(), layer_us=3000.0, copy_efficiency=0.4)
    ids = ("mixoff-a100-hqq2-ondemand", "mixoff-3080m-hqq2-ondemand", "mixoff-t4-hqq2-ondemand", "mixoff-3060-hqq2-ondemand")
    rows = [dataclasses.replace(BY_ID[i], metric="decode_tok_s", value=v.predict(BY_ID[i], truth)) for i in ids]
    rows[0] = dataclasses.replace(rows[0], value=rows[0].value / 10)  # one setup measured 10x slower
    assert len({r.group for r in rows}) == 4
    result = v.validate(rows)
    by = {r.row.id: r for r in result.results}
    assert by[ids[0]].ratio == pytest.approx(10.0, rel=0.25)  # predicted from the other three: the truth
    assert all(by[i].fitted_on == 3 for i in ids)


def test_disputed_rows_are_few_and_each_names_a_row_that_contradicts_it() -> None:
    """Disputing a row takes it out of the score: kept to a few, each with the contradicting
    measurement as a row of the table a reader can open."""
    disputed = [r for r in BY_ID.values() if r.disputed]
    assert len(disputed) <= 3
    for r in disputed:
        named = [i for i in BY_ID if i in r.disputed and i != r.id]
        assert named and all(not BY_ID[i].disputed for i in named), r.id


def test_a_disputed_row_is_predicted_but_neither_fitted_on_nor_counted() -> None:
    row = dataclasses.replace(BY_ID["mixoff-a100-hqq2-lru"], disputed="contradicted by x")
    val = v.Validation([v.Result(row, "predicted", row.rate * 50)], {}, v.load_shared())
    assert val.summary()["predicted"] == 0 and val.summary()["disputed"] == [row.id]
    fit = v.fit_stack_rows(load_stack("mixtral-offloading"), [row])
    assert fit.rows == []


def test_rows_are_grouped_by_source_and_box() -> None:
    a, b = BY_ID["mixoff-a100-hqq2-lru"], BY_ID["mixoff-t4-hqq2-lru"]
    assert a.document == b.document and a.group != b.group
    assert BY_ID["mixoff-a100-hqq3-lru"].group == a.group


def _result(i: str, predicted: float, role: str = "predicted") -> v.Result:
    return v.Result(BY_ID[i], role, predicted)


def test_summary_and_rankings_read_only_scored_rows() -> None:
    a, b = BY_ID["mixoff-a100-hqq2-lru"], BY_ID["mixoff-a100-hqq2-full"]
    results = [
        _result(a.id, a.rate * 2.0),  # x2: right order below, since full is faster measured and predicted
        _result(b.id, b.rate * 2.5),
        _result("mixoff-a100-hqq2-ondemand", 99.0, role="out of scope"),
        v.Result(BY_ID["hfaccel-mixoff-a100-hqq2-naive"], "beyond bound", bound=0.5),
    ]
    val = v.Validation(results, {}, v.load_shared())
    s = val.summary()
    assert s["predicted"] == 2 and s["beyond_bound"] == ["hfaccel-mixoff-a100-hqq2-naive"]
    assert s["median_abs_log_ratio"] == pytest.approx((math.log(2.0) + math.log(2.5)) / 2)
    assert s["beyond_2x"] == 1 and s["beyond_2x_rows"] == [b.id]
    assert s["rankings"] == {"pairs": 1, "kept": 1, "broken": []}


def test_a_prefill_row_is_one_request_timed_to_its_first_token() -> None:
    row = dataclasses.replace(BY_ID["mixoff-a100-hqq2-ondemand"], metric="prefill_tok_s", prompt_tokens=64)
    (spec,) = v.specs_for(row)
    assert len(spec.trace.requests) == 1
    record = {"prefill_tokens": 64, "ttft_mean_s": 0.5, "requests": 1}
    assert v.RATES["prefill_tok_s"](record, row) == pytest.approx(128.0)


def test_cli_help_names_the_published_mode() -> None:
    from typer.testing import CliRunner

    from casmoe.cli import app

    result = CliRunner().invoke(app, ["validate", "--help"])
    assert result.exit_code == 0 and "published" in result.output and "backend" in result.output
    result = CliRunner().invoke(app, ["validate", "published", "--help"])
    assert result.exit_code == 0 and "--fit" in result.output and "--model" not in result.output


@pytest.mark.slow
def test_the_whole_table_is_predicted_leaving_each_setup_out() -> None:
    result = v.validate()
    for r in result.results:
        if r.role == "predicted":
            assert r.predicted > 0 and r.bound >= r.predicted * (1 - 1e-9)
        if r.role == "beyond bound":  # no published row beats its configuration's ideal without a reason
            assert r.row.rate > r.bound * v.BOUND_TOLERANCE
            assert r.row.faster_than_bound, f"{r.row.id} beats its bound and says nothing why"
    s = result.summary()
    assert s["predicted"] >= 25 and len(s["systems"]) >= 7
    assert 0 < s["interval_coverage"] <= 1
