"""`casmoe leaderboard`: fitted components see only train requests, every policy is scored, a re-run resumes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from casmoe.policies import POLICIES
from casmoe.sim.questions import leaderboard as lb
from casmoe.trace import Request, Trace
from casmoe.trace_io import load_trace, save_trace
from support.paths import REPO



def small_trace(path: Path, splits: bool, spec: bool = True) -> Path:
    from casmoe.presets import get_preset

    g = get_preset("mixtral-8x7b").geometry  # a shape a model preset prices
    rng = np.random.default_rng(1)
    reqs = []
    for i in range(6):
        topk = np.stack([[rng.choice(g.experts, 2, replace=False) for _ in range(g.layers)] for _ in range(6)]).astype(np.int16)
        s = np.full_like(topk, -1)
        s[:, :-1] = topk[:, 1:]
        reqs.append(Request(topk, np.full(topk.shape, 0.5, np.float32), 3, f"prompt {i}", spec=s if spec else None))
    meta = {"splits": ["train"] * 4 + ["heldout"] * 2} if splits else {}
    save_trace(Trace(g, reqs, meta), path)
    return path


def test_halves_use_the_traces_own_labels_or_hold_out_every_fifth(tmp_path):
    own = lb.prepare(small_trace(tmp_path / "a.npz", splits=True), tmp_path / "w", requests=0)
    assert own.requests == 2 and "own" in own.split
    none = lb.prepare(small_trace(tmp_path / "b.npz", splits=False), tmp_path / "w", requests=0)
    assert "held out" in none.split
    train, held = load_trace(none.train), load_trace(none.scored)
    assert len(train.requests) + len(held.requests) == 6 and held.requests


def test_fitted_policies_are_fitted_on_train_requests_only(tmp_path):
    path = small_trace(tmp_path / "a.npz", splits=True)
    w = lb.prepare(path, tmp_path / "w", requests=0)
    scored, train = load_trace(w.scored), load_trace(w.train)
    prompts = lambda t: {r.prompt for r in t.requests}  # noqa: E731
    assert prompts(scored) == {"prompt 4", "prompt 5"} and not prompts(scored) & prompts(train)
    specs = lb.policies(w, fit_planner=False)
    assert {s.name for s in specs} == set(POLICIES)
    for s in specs:
        fit = POLICIES[s.name].fit
        if fit is not None and not s.oracle:
            assert dict(s.options) == {fit.option: str(w.train)}
    assert lb.capacities(2) == ["2", "3", "4", "8"]
    assert lb.capacities(8, 128) == ["8", "12", "16", "32", "128"]  # and all on the GPU
    assert lb.capacities(2, 8) == ["2", "3", "4", "8"]  # 4 x top_k is every expert already


def test_leaderboard_end_to_end_and_resumes(tmp_path):
    path = small_trace(tmp_path / "a.npz", splits=True)
    env = {**os.environ, "CASMOE_DATA": str(REPO / "traces")}
    cmd = [sys.executable, "-m", "casmoe", "leaderboard", "--trace", str(path), "--out", str(tmp_path / "out"), "--jobs", "1",
           "--allow-overcommit",  # 4 x top_k is all 8 experts of a layer: more than 4 RTX 4090s hold beside the rest
           "--plots", "wait",  # the picture is checked below, once the command has ended
           "--no-fit-planner"]  # a planner of 4 prompts would fit nothing worth the seconds (tests/planner/test_planner_fit.py fits them)
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    table = (tmp_path / "out" / "leaderboard.md").read_text()
    for name in POLICIES:
        assert f"\n{name}" in table
    assert "n/a" not in table  # every policy ran on every size
    assert "\nbelady* |" in table and "\nlru |" in table and "moe-infinity[fit=train]" in table
    assert "8 slots/layer (all on the GPU)" in table  # every expert of a layer: all on the GPU, a column of its own
    assert "placements in their engines' terms" in table and "llama.cpp --n-cpu-moe" in table
    assert (tmp_path / "out" / "a.png").exists() and (tmp_path / "out" / "leaderboard.csv").exists()
    drawn = (tmp_path / "out" / "a.png").read_bytes()
    background = {**env, "CASMOE_PLOTS": "background"}  # a user's default, over the suite's none
    again = subprocess.run([a for a in cmd if a not in ("--plots", "wait")], capture_output=True, text=True,
                           env=background, timeout=600)
    assert again.returncode == 0 and "(0 computed now)" in again.stdout
    assert "a.png appear in" in again.stdout  # the picture of the earlier run was removed first
    deadline = time.monotonic() + 120
    while not (tmp_path / "out" / "a.png").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # it appears whole
    assert (tmp_path / "out" / "a.png").read_bytes() == drawn  # the same records, the same picture


def test_a_held_out_request_whose_prompt_the_train_half_holds_is_not_scored(tmp_path):
    # synthetic-qwen3-top8 repeats one prompt across the two halves: scoring it would star every
    # fitted policy (what was fitted on the train half saw that prompt)
    from casmoe.shipped import shipped
    from casmoe.sim.questions.leaderboard import prepare
    from casmoe.trace_io import load_trace

    h = prepare(shipped("synthetic-qwen3-top8.npz"), tmp_path, 0)
    train = {r.prompt for r in load_trace(h.train).requests}
    scored = [r.prompt for r in load_trace(h.scored).requests]
    assert scored and not train.intersection(scored)
    assert "1 held-out request whose prompt the train half also holds left out" in h.split
