"""Every predicted figure says how far to trust it: the 80% interval of the error model fitted on
the published table's left-out residuals (`casmoe.sim.trust.error_model`), on each surface that
prints one: simulate's table and headline, the JSON/CSV records, search's Pareto table, the
leaderboard's markdown. The model is replaced by a fixed one, so the tests do not depend on a
`--fit` having run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from casmoe.report import OUTSIDE_MARK
from casmoe.sim.trust import error_model as em
from casmoe.sim.trust import uncertainty as u
from support.paths import REPO

SIGMA = math.log(1.5) / em.Z80
"""A model whose every interval is x/÷ 1.5 on a box and model it has seen."""


def point(**kw) -> em.Point:
    base = dict(family="cache", stack="mixtral-offloading", host_only=False, storage=False, box=(1.0, 2.0, 3.0, 4.0),
                model=(20.0, 18.0, 2.0, 1.0))
    return em.Point(**{**base, **kw})


def fixed(seen=(point(),), **weights) -> em.ErrorModel:
    w = dict.fromkeys(em.FEATURES, 0.0) | {"bias": math.log(SIGMA)} | weights
    return em.ErrorModel(tuple(w[f] for f in em.FEATURES), tuple(seen), rows=12, coverage=0.8, median_factor=1.5,
                         sources=5)


@pytest.fixture
def model(monkeypatch):
    monkeypatch.setattr(u, "load", lambda: fixed())
    monkeypatch.setenv("CASMOE_DATA", str(REPO / "traces"))


def record(p: em.Point = point(), **kw) -> dict:
    return {"stack": p.stack, "policy": "lru", "error_point": p.to_dict(), **kw}


def cell(rec: dict) -> str:
    from casmoe.report import uncertainty_cell

    return uncertainty_cell(u.annotate(rec))


def test_words_factor_and_what_lies_outside(model) -> None:
    inside = record()
    assert u.factor(inside) == pytest.approx(1.5) and cell(inside) == "x/÷ 1.50"
    assert u.spread(inside).startswith("x/÷ 1.50 (80% interval of the error model fitted on 12 published rows, which "
                                       "held 80% of published rows left out)")
    assert not u.annotate(inside)["uncertainty_outside"]
    far = record(point(box=(5.0, 2.0, 3.0, 4.0), stack="ktransformers"))
    text = u.spread(far)
    assert "no published row ran the ktransformers stack" in text and "its box is 5.8 doublings" in text
    assert cell(far) == "x/÷ 1.50†" and u.annotate(far)["uncertainty_outside"]
    ideal = record(stack="ideal")
    assert cell(ideal) == "upper bound" and "upper bound" in u.spread(ideal) and u.factor(ideal) is None
    assert u.annotate({"skipped": "no"}) == {"skipped": "no"}


def test_the_interval_widens_with_what_the_weights_say(monkeypatch) -> None:
    monkeypatch.setattr(u, "load", lambda: fixed(host=math.log(2.0), box_distance=0.5))
    assert u.factor(record(point(family="host"))) == pytest.approx(math.exp(em.Z80 * 2 * SIGMA))
    away = record(point(box=(1.0 + math.log(2), 2.0, 3.0, 4.0)))  # one doubling away: exp(0.5)
    assert u.factor(away) == pytest.approx(math.exp(em.Z80 * SIGMA * math.exp(0.5)))


def test_a_fit_recovers_the_spread_of_its_residuals() -> None:
    """Residuals of two kinds, one twice as spread as the other: the fitted model says so."""
    rng = np.random.default_rng(0)
    points = [point(family="cache")] * 300 + [point(family="host")] * 300
    residuals = list(rng.normal(0, 0.2, 300)) + list(rng.normal(0, 0.4, 300))
    w = em.fit(residuals, points, [points] * len(points))
    m = em.ErrorModel(w, tuple(points))
    assert m.sigma(point(family="cache")) == pytest.approx(0.2, rel=0.12)
    assert m.sigma(point(family="host")) == pytest.approx(0.4, rel=0.12)


def test_coverage_is_measured_leaving_each_source_out() -> None:
    rng = np.random.default_rng(1)
    points = [point()] * 200
    residuals = list(rng.normal(0, 0.3, 200))
    groups = [f"s{i % 10}" for i in range(200)]
    inside, factors = em.leave_one_source_out(residuals, points, groups, [points] * 200)
    assert 0.72 <= sum(inside) / len(inside) <= 0.88
    assert np.median(factors) == pytest.approx(math.exp(em.Z80 * 0.3), rel=0.1)


def test_a_model_round_trips_through_its_file(tmp_path) -> None:
    import tomllib

    m = fixed(seen=(point(), point(family="host", host_only=True, storage=True)))
    raw = tomllib.loads(m.to_toml())
    assert tuple(raw["weights"][f] for f in em.FEATURES) == m.weights
    assert [em.Point.from_dict(d) for d in raw["seen"]] == list(m.seen)
    assert raw["coverage"] == 0.8 and raw["rows"] == 12


def test_simulate_table_headline_and_files(model, tmp_path) -> None:
    import pandas as pd

    from casmoe.cli import app

    out = tmp_path / "sim"
    res = CliRunner().invoke(app, ["simulate", "--policy", "lru", "--policy", "n-cpu-moe[n=16]", "--capacity", "4",
                                   "--requests", "1", "--stack", "mixtral-offloading", "--plots", "none", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "uncertainty" in res.output and "x/÷" in res.output and OUTSIDE_MARK in res.output
    frame = pd.read_csv(out / "results.csv").set_index("policy")
    assert frame.loc["lru", "uncertainty_factor"] > 1.0
    records = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert records["lru"]["error_point"]["family"] == "cache"
    assert records["n-cpu-moe[n=16]"]["error_point"]["family"] == "host"


def test_search_pareto_table_and_json(model, tmp_path) -> None:
    from casmoe.cli import app

    out = tmp_path / "search"
    res = CliRunner().invoke(app, ["search", "--target", "tok/s>=0.1", "--policy", "lru", "--stack", "mixtral-offloading",
                                   "--requests", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "uncertainty" in res.output and "mixtral-offloading stack" in res.output
    (row,) = json.loads((out / "search.json").read_text())["pareto"]
    assert row["uncertainty_factor"] > 1.0 and row["uncertainty"].startswith("x/÷")


def test_leaderboard_markdown_carries_the_interval(model) -> None:
    from casmoe.sim.questions import leaderboard as lb

    h = lb.Halves("w", Path("w-heldout2.npz"), Path("w-train.npz"), "own split", 2, 40)
    base = {"trace": "w-heldout2.npz", "model": "mixtral-8x7b", "hardware": "mixoff-a100-sxm",
            "stack": "mixtral-offloading", "oracle": False, "hit_rate": 0.5, "ttft_p50_s": 0.1, "link_bytes": 1e9,
            "error_point": point().to_dict()}
    records = [u.annotate({**base, "policy": p, "capacity_spec": c, "decode_tokens_per_s": v})
               for p, c, v in (("lru", "2", 1.0), ("lru", "4", 2.0))]
    md = lb.markdown(records, [h])
    assert "decode tok/s | 2 slots/layer | 4 slots/layer | uncertainty\n---|---|---|---|" in md
    assert "\nlru | 1 | 2 | x/÷ 1.50\n" in md


def test_a_stored_point_speaks_with_the_model_of_now(model, tmp_path, monkeypatch) -> None:
    from casmoe.shipped import DEFAULT_TRACE, shipped
    from casmoe.sim.run.grid import Grid
    from casmoe.sim.run.runner import run_all

    (spec,) = Grid.of({"trace": str(shipped(DEFAULT_TRACE)), "policy": ["lru"], "capacity": ["4"], "requests": 1,
                       "stack": "mixtral-offloading"}, "test").specs(strict=True).specs
    (first,), computed = run_all([spec], tmp_path)
    assert computed == 1
    seen = em.Point.from_dict(first["error_point"])
    monkeypatch.setattr(u, "load", lambda: fixed(seen=(seen,)))
    (again,), computed = run_all([spec], tmp_path)
    assert computed == 0 and again["uncertainty_factor"] == pytest.approx(1.5)
    monkeypatch.setattr(u, "load", lambda: fixed(seen=(seen,), bias=math.log(math.log(3.0) / em.Z80)))
    (third,), computed = run_all([spec], tmp_path)
    assert computed == 0 and third["uncertainty_factor"] == pytest.approx(3.0)
