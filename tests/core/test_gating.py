"""Adaptive gating (AdapMoE's lossy half, `casmoe.gating`): closed forms of the routing
transform, the policy contract on gated routing, and the command line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity
from casmoe.gating import GatingError, check_threshold, gate_rows, gate_trace
from casmoe.policies import POLICIES, get_policy
from casmoe.replay import replay
from casmoe.sim.testing import check_case
from casmoe.testing import run_contract, traces
from casmoe.trace import NOT_COMPUTED, Trace

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def _weighted(trace: Trace, seed: int) -> Trace:
    """`trace` with random router weights (the generated traces weigh every expert alike)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in trace.requests:
        w = rng.dirichlet(np.ones(r.topk.shape[2]), size=r.topk.shape[:2]).astype(np.float32)
        w = -np.sort(-w, axis=2)  # best first, as routers report them
        w[r.topk[:, :, 0] == NOT_COMPUTED] = 0
        out.append(dataclasses.replace(r, weights=w))
    return Trace(trace.geometry, out, trace.meta)


def _decode_only(trace: Trace) -> Trace:
    return Trace(trace.geometry, [dataclasses.replace(r, prefill=0) for r in trace.requests], trace.meta)


@FAST
@given(trace=traces(), seed=st.integers(0, 99), above=st.floats(1.0, 10.0))
def test_a_threshold_of_one_or_more_changes_nothing(trace, seed, above):
    trace = _weighted(trace, seed)  # weights below 1 wherever k > 1
    gated = gate_trace(trace, above)
    for a, b in zip(trace.requests, gated.requests):
        ok = (a.weights.max(axis=2) < a.weights.sum(axis=2)) | (a.topk.shape[2] == 1)
        assert np.array_equal(a.topk[ok], b.topk[ok]) and np.array_equal(a.weights[ok], b.weights[ok])
    g = trace.geometry
    assert replay(gated, get_policy("lru")(g, Capacity(g.top_k))).stats == replay(trace, get_policy("lru")(g, Capacity(g.top_k))).stats


@FAST
@given(trace=traces(), seed=st.integers(0, 99))
def test_a_threshold_of_zero_keeps_exactly_one_expert_per_computed_token_layer(trace, seed):
    trace = _decode_only(_weighted(trace, seed))
    gated = gate_trace(trace, 0.0)
    g = trace.geometry
    for a, b in zip(trace.requests, gated.requests):
        computed = a.topk[:, :, 0] != NOT_COMPUTED
        kept = (b.topk != NOT_COMPUTED).sum(axis=2)
        assert np.array_equal(kept, computed.astype(int))
        best = np.take_along_axis(a.topk, a.weights.argmax(axis=2)[..., None], axis=2)[..., 0]
        assert np.array_equal(b.topk[..., 0][computed], best[computed])  # the heaviest expert stays
        assert np.allclose(b.weights.sum(axis=2), a.weights.sum(axis=2))  # with the token's whole weight
    stats = replay(gated, get_policy("lru")(g, Capacity(g.top_k))).stats
    assert stats.accesses == sum(int((r.topk[:, :, 0] != NOT_COMPUTED).sum()) for r in trace.requests)


@FAST
@given(trace=traces(), seed=st.integers(0, 99), threshold=st.floats(0.0, 1.0))
def test_counts_drop_by_exactly_the_dropped_experts(trace, seed, threshold):
    trace = _decode_only(_weighted(trace, seed))
    gated = gate_trace(trace, threshold)
    g = trace.geometry
    dropped = 0
    for r in trace.requests:
        share = r.weights.max(axis=2).astype(np.float64) / np.maximum(r.weights.sum(axis=2, dtype=np.float64), 1e-300)
        gate = (share >= threshold) & (r.topk[:, :, 0] != NOT_COMPUTED)
        dropped += int(gate.sum()) * (g.top_k - 1)
    assert trace.popularity().sum() - gated.popularity().sum() == dropped
    for name in ("lru", "belady"):
        full = replay(trace, get_policy(name)(g, Capacity(g.top_k))).stats
        less = replay(gated, get_policy(name)(g, Capacity(g.top_k))).stats
        assert full.accesses - less.accesses == dropped


def test_gate_rows_ties_and_k_one():
    ids = np.array([[3, 1], [2, 0]])
    w = np.array([[0.5, 0.5], [0.4, 0.6]], np.float32)
    out_ids, out_w = gate_rows(ids, w, 0.5)
    assert out_ids.tolist() == [[3, -1], [0, -1]] and out_w.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    one = np.array([[4]])
    assert gate_rows(one, np.ones((1, 1)), 0.0)[0].tolist() == [[4]]
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(GatingError, match="adaptive-gating"):
            check_threshold(bad)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_keeps_the_contract_on_gated_routing(name):
    """check_policy's cases (replay invariants, the simulator's decisions = replay's), gated."""

    def check(case):
        gated = gate_trace(_weighted(case.trace, 0), 0.6)
        check_case(POLICIES[name], dataclasses.replace(case, trace=gated))

    run_contract(check, max_examples=12)


@FAST
@given(trace=traces(), seed=st.integers(0, 99), threshold=st.floats(0.0, 1.0), name=st.sampled_from(["lru", "lfu", "semoe", "belady", "sch"]))
def test_gated_steps_and_arrays_agree_and_the_twin_decides_alike(trace, seed, threshold, name):
    from casmoe.step_arrays import StepArrays
    from casmoe.trace import visit_csr

    gated = gate_trace(_weighted(trace, seed), threshold)
    g = gated.geometry
    arrays = StepArrays.from_trace(gated)
    ptr, experts = visit_csr(gated.steps(), g.layers)
    assert np.array_equal(arrays.visit_ptr, ptr) and np.array_equal(arrays.experts, experts)
    cap = Capacity(g.top_k)
    python = replay(gated, POLICIES[name].create(g, cap, trace=gated), compiled=False).stats
    twin = replay(gated, POLICIES[name].create(g, cap, trace=gated), compiled=True).stats
    assert python == twin


def test_a_run_is_keyed_by_its_threshold():
    from support.builders import one_spec

    exact, gated, other = one_spec(), one_spec(adaptive_gating=0.6), one_spec(adaptive_gating=0.7)
    assert len({exact.key, gated.key, other.key}) == 3
    assert gated.describe()["adaptive_gating"] == 0.6 and "adaptive_gating" not in exact.describe()


def test_the_command_line_gates_replay_and_sweep(tmp_path, monkeypatch, capsys):
    """replay and sweep take --adaptive-gating; a bad one is one line."""
    import json
    import subprocess
    import sys

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "casmoe", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    base = ["replay", "--policy", "lru", "--capacity", "2", "--requests", "3", "--json"]
    assert run(*base, "--adaptive-gating", "0")[0]["accesses"] < run(*base)[0]["accesses"]
    swept = run("sweep", "--policy", "lru", "--capacity", "4", "--requests", "2", "--adaptive-gating", "0", "--jobs", "1",
                "--json", "--out", "w")
    assert {r["adaptive_gating"] for r in swept} == {0.0}

    from casmoe.cli import main

    monkeypatch.setattr(sys, "argv", ["casmoe", "simulate", "--requests", "1", "--adaptive-gating", "nan"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and "finite" in capsys.readouterr().err
