"""`casmoe search`: bisection finds what a brute-force grid finds, resumes from its point store,
and answers on the command line with a table, a JSON summary and a plot."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import pytest
from typer.testing import CliRunner

from casmoe.cli import app
from casmoe.options import CapacitySpec
from casmoe.shipped import shipped
from casmoe.sim.run.grid import Grid
from casmoe.sim.run.runner import run_all
from casmoe.sim.questions.search import SearchError, Target, configs, memory_gb, search, slot_range

TRACE = str(shipped("tiny-mixtral.npz"))
BASE = {"trace": TRACE, "model": "mixtral-8x7b", "requests": 3, "split": "all"}
CONFIGS = configs(Grid.of({**BASE, "gpus": [2, 4], "policy": ["lru", "semoe"], "quant": ["trace", "int4"]}))


def brute_force(tmp_path, target_text=None):
    """Every config at every cache size from top_k to all experts; the fewest slots that meet it."""
    sizes = {c: range(slot_range(c)[0], slot_range(c)[1] + 1) for c in CONFIGS}
    grid = {(c, s): dataclasses.replace(c, capacity=CapacitySpec(str(s))) for c in CONFIGS for s in sizes[c]}
    records, _ = run_all(list(grid.values()), tmp_path / "grid")
    by = dict(zip(grid, records))
    metric = [r["decode_tokens_per_s"] for r in records if "skipped" not in r]
    target = Target.parse(target_text or f"tok/s>={statistics.median(metric)}")
    fewest = {}
    for c in CONFIGS:
        met = [s for s in sizes[c] if target.met(by[c, s])]
        if met:
            fewest[c] = min(met)
    return target, fewest, by


def test_the_search_answers_what_the_whole_grid_answers(tmp_path):
    target, fewest, by = brute_force(tmp_path)
    assert 0 < len(fewest) < len(CONFIGS) or len({v for v in fewest.values()}) > 1  # the target splits the configs
    result = search(CONFIGS, target, str(tmp_path / "search"))
    got = {c: r["capacity_slots"] for c, r in result.answers}
    assert got == fewest
    for c, r in result.answers:
        assert r == by[c, r["capacity_slots"]] | {"key": r["key"]}  # the evidence is the grid's record
    assert {c for c, _ in result.infeasible} == set(CONFIGS) - set(fewest)
    assert result.simulated == result.probed < result.grid
    # the Pareto answers: none beaten by another answer on GPUs, memory and the metric at once
    front = result.pareto()
    for c, r in front:
        for c2, r2 in result.answers:
            assert not (c2.machine.devices <= c.machine.devices and memory_gb(r2) < memory_gb(r)
                        and r2["decode_tokens_per_s"] >= r["decode_tokens_per_s"])


def test_a_repeated_search_simulates_nothing(tmp_path):
    target = Target.parse("tok/s>=3")
    first = search(CONFIGS[:2], target, str(tmp_path))
    again = search(CONFIGS[:2], target, str(tmp_path))
    assert first.simulated > 0 and again.simulated == 0
    assert [(c, r["capacity_slots"]) for c, r in again.answers] == [(c, r["capacity_slots"]) for c, r in first.answers]


@pytest.mark.parametrize("text", ["tok/s<=3", "speed>>3", "ttft_p99>=2", "speed>=3", "tok/s>=fast", "tok/s>=nan"])
def test_bad_targets_are_one_line_errors(text):
    with pytest.raises(SearchError):
        Target.parse(text)


def test_cli_search_writes_the_table_json_and_plot(tmp_path):
    out = tmp_path / "s"
    res = CliRunner().invoke(app, ["search", "--target", "tok/s>=3", "--gpus", "4", "--policy", "lru", "--requests", "3",
                                   "--out", str(out), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "simulated" in res.output and (out / "search.png").stat().st_size > 0
    summary = json.loads((out / "search.json").read_text())
    (row,) = summary["pareto"]
    record = json.loads((out / row["evidence"]).read_text())
    assert record["decode_tokens_per_s"] >= 3 and record["capacity_slots"] == row["slots_per_layer"]
    assert row["engine_terms"] == f"{row['slots_per_layer']} slots per layer" or row["engine_terms"].startswith("all on")


def test_a_placements_answer_is_said_in_its_engines_terms(tmp_path):
    """'22/layer' is not what a llama.cpp user types: a placement's answer is its --n-cpu-moe N (or
    all on the GPU), a KTransformers mask its GPU-expert count or ratio."""
    from casmoe.sim.questions.search import in_engine_terms

    configs_ = configs(Grid.of({**BASE, "gpus": 2, "policy": ["n-cpu-moe", "ktransformers"]}))
    result = search(configs_, Target.parse("tok/s>=0.01"), str(tmp_path / "s"))
    said = {c.policy.name: in_engine_terms(c, r) for c, r in result.answers}
    assert said["n-cpu-moe"].startswith(("llama.cpp --n-cpu-moe", "all on the GPU"))
    if said["n-cpu-moe"].startswith("llama.cpp"):
        assert 0 < int(said["n-cpu-moe"].rpartition(" ")[2]) <= 32  # blocks of Mixtral's 32 on the host
    assert said["ktransformers"].startswith(("KTransformers --kt-", "all on the GPU"))


def test_cli_search_errors_are_one_line(tmp_path, monkeypatch, capsys):
    from casmoe.cli import main

    monkeypatch.setattr(sys, "argv", ["casmoe", "search", "--target", "tok/s<=3", "--out", str(tmp_path / "b")])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "better higher" in err and "Traceback" not in err, err


LINKED = configs(Grid.of({**BASE, "gpus": 4, "policy": "lru", "link": ["pcie3", "pcie4", "pcie5"],
                           "host_ram": [48.0, 256.0]}))


def test_links_and_host_ram_are_axes_pruned_against_the_whole_grid(tmp_path):
    """Link generations and host RAM sizes as axes: each config's answer is the brute-force
    grid's, a config that a faster-link or larger-RAM one dominates is settled without a run
    when that one misses, and fewer points run than plain bisection of every config needs."""
    lo, hi = slot_range(LINKED[0])
    grid = {(c, s): dataclasses.replace(c, capacity=CapacitySpec(str(s))) for c in LINKED for s in range(lo, hi + 1)}
    records, _ = run_all(list(grid.values()), tmp_path / "grid")
    by = dict(zip(grid, records))
    hw = {c: c.machine.hardware for c in LINKED}
    small_ram_fastest = next(c for c in LINKED if hw[c].h2d_pinned_gbs == max(h.h2d_pinned_gbs for h in hw.values())
                             and hw[c].host_ram_gib == 48.0)
    best = max(by[small_ram_fastest, s]["decode_tokens_per_s"] for s in range(lo, hi + 1))
    target = Target.parse(f"tok/s>={best * 1.05}")  # beyond every 48 GiB config if faster links do no worse
    fewest = {c: min(s for s in range(lo, hi + 1) if target.met(by[c, s]))
              for c in LINKED if any(target.met(by[c, s]) for s in range(lo, hi + 1))}
    assert 0 < len(fewest) < len(LINKED)
    result = search(LINKED, target, str(tmp_path / "search"))
    assert {c: r["capacity_slots"] for c, r in result.answers} == fewest
    assert {c for c, _ in result.infeasible} == set(LINKED) - set(fewest)
    assert any(why.startswith("not simulated") for _, why in result.infeasible)
    plain = sum(search([c], target, str(tmp_path / "one")).probed for c in LINKED)
    assert result.simulated == result.probed < plain < result.grid
    assert all(r["hardware"].startswith("rtx4090x4@gpus=4,link=") for r in result.records)


def test_bad_links_and_ram_are_one_line_errors():
    from casmoe.sim.box.hardware import HardwareError

    with pytest.raises(HardwareError, match="unknown link generation"):
        configs(Grid.of({**BASE, "policy": "lru", "link": "pcie9"}))
    with pytest.raises(Exception, match="host_ram must be >= 0|GiB > 0"):
        configs(Grid.of({**BASE, "policy": "lru", "host_ram": 0.0}))
    with pytest.raises(SearchError, match="chooses the cache size"):
        configs(Grid.of({**BASE, "policy": "lru", "capacity": 4}))


# ---- the box's price: a Pareto dimension, and a tie goes to the cheaper box ----------------------

from casmoe.sim.box.prices import load_prices  # noqa: E402
from casmoe.sim.questions.search import TIE, SearchResult  # noqa: E402
from support.paths import REPO

PCIE = configs(Grid.of({**BASE, "gpus": 4, "policy": "lru", "link": ["pcie4", "pcie5"]}))


def _answers(speeds, memory=(2.0, 2.0), configs_=PCIE):
    return [(c, {"decode_tokens_per_s": v, "capacity_gb": m, "key": f"k{i}"})
            for i, (c, v, m) in enumerate(zip(configs_, speeds, memory))]


def _result(answers, prices=None):
    prices = prices or load_prices()
    return SearchResult(Target.parse("tok/s>=3"), answers, [], 0, 0, 0, [],
                        {c: prices.box(c.machine.hardware) for c, _ in answers})


def _link(config):
    return config.machine.hardware.name.rpartition("link=")[2]


def test_a_tie_within_one_percent_goes_to_the_cheaper_box():
    """The study's case: PCIe 5 for a placement that never uses the link, 30.62 against 30.58."""
    pcie4, pcie5 = PCIE if _link(PCIE[0]) == "pcie4" else PCIE[::-1]
    result = _result(_answers([30.58, 30.62], configs_=[pcie4, pcie5]))
    assert result.price(pcie4).usd < result.price(pcie5).usd
    assert [_link(c) for c, _ in result.pareto()] == ["pcie4"]
    # beyond the tolerance the faster, dearer box is an answer too, listed after the cheaper one
    result = _result(_answers([30.0, 30.0 * (1 + 2 * TIE)], configs_=[pcie4, pcie5]))
    assert [_link(c) for c, _ in result.pareto()] == ["pcie4", "pcie5"]
    # the dearer box that needs less memory is an answer as well
    result = _result(_answers([30.58, 30.62], memory=(4.0, 2.0), configs_=[pcie4, pcie5]))
    assert [_link(c) for c, _ in result.pareto()] == ["pcie4", "pcie5"]


def test_a_box_of_unknown_price_is_searched_and_shown_as_unknown(tmp_path):
    text = (REPO / "casmoe" / "sim" / "box" / "profiles" / "rtx4090x4.toml").read_text()
    (tmp_path / "box.toml").write_text(text.replace('gpu = "NVIDIA GeForce RTX 4090"', 'gpu = "Unpriced GPU"'))
    mine = configs(Grid.of({**BASE, "gpus": 4, "policy": "lru", "hardware": str(tmp_path / "box.toml")}))
    shipped_box = [c for c in PCIE if _link(c) == "pcie4"]
    result = _result(_answers([30.0, 40.0], configs_=shipped_box + mine))
    assert result.price(mine[0]).usd is None and "no price for GPU 'Unpriced GPU'" in result.price(mine[0]).describe()
    assert [c for c, _ in result.pareto()] == shipped_box + mine  # neither beats the other on price; unknown last


def test_the_cli_prints_each_rows_price_and_takes_a_prices_file(tmp_path):
    (tmp_path / "p.toml").write_text('[gpu."NVIDIA GeForce RTX 4090"]\nusd = 1000\nsource = "a quote"\n')
    out = tmp_path / "s"
    res = CliRunner().invoke(app, ["search", "--target", "tok/s>=3", "--gpus", "4", "--policy", "lru", "--requests", "3",
                                   "--out", str(out), "--jobs", "1", "--prices", str(tmp_path / "p.toml")])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "search.json").read_text())
    (row,) = summary["pareto"]
    assert row["price_usd"] == pytest.approx(4 * 1000 + 256 * 6.25 + 100)
    words = " ".join(res.output.split())  # a table title wraps where its table's width says
    assert "price_usd" in words and "4 x NVIDIA GeForce RTX 4090 $4,000" in words and "a tie" in words
    res = CliRunner().invoke(app, ["search", "--target", "tok/s>=3", "--gpus", "4", "--policy", "lru", "--requests", "3",
                                   "--out", str(out), "--jobs", "1", "--budget", "5000"])
    assert res.exit_code == 0 and "over --budget $5,000" in res.output, res.output


@pytest.mark.parametrize("text, says", [
    ("policy>=3", "not a measured number"),
    ("late_by_layer<=1", "is a list"),
    ("devices>=2", "what a run is given"),
    ("capacity_slots<=4", "what a run is given"),
    ("misses>=100", "better lower"),
    ("hit_rate>=fifty", "give a number"),
    ("tok/s>=1e999", "finite"),
    ("ttft_p99<=-1", "never negative"),
    ("hit_rate>=1.5", "between 0 and 1"),
    ("hit_rate>=150%", "between 0 and 1"),
])
def test_targets_that_are_no_measured_number_are_refused(text, says):
    with pytest.raises(SearchError, match=says):
        Target.parse(text)


def test_every_measured_number_of_a_record_is_a_target_in_its_direction():
    assert Target.parse("misses<=100").op == "<=" and Target.parse("stall_s<=1").metric == "stall_s"
    assert Target.parse("hit_rate>=50%").value == 0.5 and Target.parse("hits>=10").op == ">="
    with pytest.raises(SearchError, match="--rate"):
        Target.parse("queue_wait_p99_s<=1").check(CONFIGS)


def test_a_config_label_names_its_precision():
    from casmoe.sim.questions.search import label

    (forced,) = configs(Grid.of({**BASE, "gpus": 4, "policy": "lru", "quant": "int4"}))
    (default,) = configs(Grid.of({**BASE, "gpus": 4, "policy": "lru"}))
    assert label(forced).endswith("lru, int4") and label(default).endswith("lru, bf16")
