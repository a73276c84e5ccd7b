"""Every predicted figure says how far to trust it: the spread the published table measured for its
kind of configuration (`casmoe.sim.trust.uncertainty`), on each surface that prints one: simulate's
table and headline, the JSON/CSV records, search's Pareto table, the leaderboard's markdown.
The spreads are monkeypatched, so the tests do not depend on a `--fit` having run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from casmoe.report import OUTSIDE_MARK, sig
from casmoe.sim.trust import uncertainty as u

REPO = Path(__file__).resolve().parents[1]
TABLE = {"cache": {"p80_abs_log_ratio": math.log(1.5), "rows": 12.0},
         "stream": {"p80_abs_log_ratio": math.log(2.0), "rows": 9.0}}
"""No host row validated: n-cpu-moe has no spread."""
CACHE = "x/÷ 1.50 (80% of 12 published cache rows)"


@pytest.fixture
def spreads(monkeypatch):
    monkeypatch.setattr(u, "spreads", lambda: TABLE)
    monkeypatch.setenv("CASMOE_DATA", str(REPO / "traces"))


def cell(record: dict) -> str:
    from casmoe.report import uncertainty_cell

    return uncertainty_cell(u.annotate(record))


def test_words_factor_and_what_lies_outside(spreads) -> None:
    inside = {"stack": "mixtral-offloading", "policy": "lru", "model": "mixtral-8x7b", "hardware": "mixoff-a100-sxm"}
    assert u.spread(inside) == CACHE and cell(inside) == "x/÷ 1.50" and u.factor(inside) == pytest.approx(1.5)
    assert u.annotate(inside)["uncertainty_factor"] == pytest.approx(1.5) and not u.annotate(inside)["uncertainty_outside"]
    mine = {**inside, "model": "qwen3-235b", "hardware": "rtx4090x4@link=pcie5", "stack": "ktransformers"}
    assert u.spread(mine) == (CACHE + "; outside what was validated: no published row runs qwen3-235b; rtx4090x4@link=pcie5 "
                              "is not one of the 14 published boxes; stack ktransformers has no published cache row")
    assert cell(mine) == "x/÷ 1.50†"
    host = {**inside, "policy": "n-cpu-moe[n=3]", "stack": "llama.cpp"}
    assert u.spread(host) == "not validated: no published row of a host configuration"
    assert cell(host) == "not validated" and u.annotate(host)["uncertainty_factor"] is None
    ideal = {**inside, "stack": "ideal"}
    assert cell(ideal) == "upper bound" and "upper bound" in u.spread(ideal)
    assert u.annotate({"skipped": "no"}) == {"skipped": "no"}


def test_simulate_table_headline_and_files(spreads, tmp_path) -> None:
    import pandas as pd

    from casmoe.cli import app

    out = tmp_path / "sim"
    res = CliRunner().invoke(app, ["simulate", "--policy", "lru", "--policy", "n-cpu-moe[n=16]", "--capacity", "4",
                                   "--requests", "1", "--stack", "mixtral-offloading", "--plots", "none", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = res.output
    # the headline names the stack its figure assumed and the spread; the box is none of the published ones
    assert "tok/s" in text and ", on the mixtral-offloading stack (" in text
    assert "uncertainty" in text and "x/÷ 1.50†" in text and "not validated" in text
    assert f"lru on mixtral-offloading: {CACHE}; outside what was validated: rtx4090x4 is not one of" in text
    assert "n-cpu-moe[n=16] on mixtral-offloading: not validated: no published row of a host configuration" in text
    assert OUTSIDE_MARK in text
    frame = pd.read_csv(out / "results.csv").set_index("policy")
    assert frame.loc["lru", "uncertainty_factor"] == pytest.approx(1.5)
    assert math.isnan(frame.loc["n-cpu-moe[n=16]", "uncertainty_factor"])
    assert frame.loc["lru", "uncertainty"].startswith(CACHE)
    records = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert records["n-cpu-moe[n=16]"]["uncertainty_factor"] is None


def test_the_python_headline_names_stack_and_spread(spreads) -> None:
    import casmoe.sim

    res = casmoe.sim.simulate(policies=["lru"], capacities=[4], requests=1)
    line, stacks = res.headline().splitlines()
    # the ideal stack's upper bound, then the figure on the runtime that runs LRU (Mixtral-Offloading's)
    (lru,) = res.records
    assert line.endswith(f"lru {sig(lru['decode_tokens_per_s'])} tok/s, itself the best plain cache; on its runtime "
                         f"{sig(lru['on_runtime']['decode_tokens_per_s'])}")
    assert lru["on_runtime"]["decode_tokens_per_s"] < lru["decode_tokens_per_s"]
    assert stacks == ("upper bounds on the ideal stack (no runtime cost); on their runtimes' stacks: "
                      "lru on mixtral-offloading (x/÷ 1.50†)")
    assert res.frame()["uncertainty_factor"].isna().all()


def test_search_pareto_table_and_json(spreads, tmp_path) -> None:
    from casmoe.cli import app

    out = tmp_path / "search"
    res = CliRunner().invoke(app, ["search", "--target", "tok/s>=0.1", "--policy", "lru", "--stack", "mixtral-offloading",
                                   "--requests", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "uncertainty" in res.output and "x/÷ 1.50†" in res.output and "mixtral-offloading stack" in res.output
    assert f"every row: {CACHE}" in res.output  # one answer, one uncertainty
    (row,) = json.loads((out / "search.json").read_text())["pareto"]
    assert row["uncertainty_factor"] == pytest.approx(1.5) and row["uncertainty"].startswith(CACHE)
    assert row["stack"] == "mixtral-offloading"


def test_leaderboard_markdown_carries_the_spread(spreads) -> None:
    from casmoe.sim.questions import leaderboard as lb

    h = lb.Halves("w", Path("w-heldout2.npz"), Path("w-train.npz"), "own split", 2, 40)
    base = {"trace": "w-heldout2.npz", "model": "mixtral-8x7b", "hardware": "mixoff-a100-sxm",
            "stack": "mixtral-offloading", "oracle": False, "hit_rate": 0.5, "ttft_p50_s": 0.1, "link_bytes": 1e9}
    records = [u.annotate({**base, "policy": p, "capacity_spec": c, "decode_tokens_per_s": v})
               for p, c, v in (("lru", "2", 1.0), ("lru", "4", 2.0), ("n-cpu-moe", "2", 5.0), ("n-cpu-moe", "4", 6.0))]
    md = lb.markdown(records, [h])
    assert "priced as mixtral-8x7b on mixoff-a100-sxm, stack mixtral-offloading" in md
    assert "decode tok/s | 2 slots/layer | 4 slots/layer | uncertainty\n---|---|---|---|" in md
    assert "\nlru | 1 | 2 | x/÷ 1.50\n" in md and "\nn-cpu-moe | 5 | 6 | not validated\n" in md
    assert "hit rate | 2 slots/layer | 4 slots/layer\n" in md  # the spreads are of decode tok/s only
    assert f"- lru: {CACHE}\n" in md
    assert "- n-cpu-moe: not validated: no published row of a host configuration; outside what was validated: stack " \
           "mixtral-offloading has no published host row" in md


def test_a_stored_point_speaks_with_the_spreads_of_now(spreads, tmp_path, monkeypatch) -> None:
    from casmoe.shipped import DEFAULT_TRACE, shipped
    from casmoe.sim.run.grid import Grid
    from casmoe.sim.run.runner import run_all

    (spec,) = Grid.of({"trace": str(shipped(DEFAULT_TRACE)), "policy": ["lru"], "capacity": ["4"], "requests": 1,
                       "stack": "mixtral-offloading"}, "test").specs(strict=True).specs
    (first,), computed = run_all([spec], tmp_path)
    assert computed == 1 and first["uncertainty_factor"] == pytest.approx(1.5)
    monkeypatch.setattr(u, "spreads", lambda: {"cache": {"p80_abs_log_ratio": math.log(3.0), "rows": 5.0}})
    (again,), computed = run_all([spec], tmp_path)
    assert computed == 0 and again["uncertainty_factor"] == pytest.approx(3.0) and again["uncertainty"].startswith("x/÷ 3.00")
