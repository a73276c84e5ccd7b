"""`casmoe.metrics.lrc.measure`, the bootstrap, baselines against replay, real traces, `casmoe lrc`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from casmoe.cli import app
from casmoe.geometry import Geometry
from casmoe.metrics.bootstrap import basic_interval, bootstrap_weights
from casmoe.metrics.lrc import measure
from casmoe.metrics.tokens import TokenSelection
from casmoe.trace import NOT_COMPUTED, Request, Trace
from casmoe.trace_io import save_trace
from support.paths import REPO

REAL = REPO / "traces" / "real"
CASES = REAL / "moe_lrc_case_traces.json"


def small_trace(seed: int = 0, S: int = 4, T: int = 30, L: int = 3, E: int = 8, k: int = 2) -> Trace:
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(S):
        topk = np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(T)])
        reqs.append(Request(topk=topk.astype(np.int16), weights=np.full(topk.shape, 1 / k, np.float32), prefill=5))
    return Trace(Geometry(L, E, k), reqs)


def test_bootstrap_weights_resample_sequences():
    w = bootstrap_weights(5, 200, np.random.default_rng(1))
    assert w.shape == (200, 5)
    assert np.all(w.sum(axis=1) == 5)
    assert np.array_equal(w, bootstrap_weights(5, 200, np.random.default_rng(1)))


def test_basic_interval_uses_moe_lrc_order_statistics():
    # B = 1000, 95 %: lp = 25, up = 975 of the sorted replicates; basic = 2 * est - q.
    reps = np.arange(1000, dtype=float)
    lo, hi = basic_interval(np.array(500.0), reps, 0.95)
    assert lo == 2 * 500 - 975 and hi == 2 * 500 - 25


def test_measure_is_deterministic_and_intervals_bracket():
    tr = small_trace()
    a = measure(tr, [2, 4], replicates=200, rng=np.random.default_rng(7))
    b = measure(tr, [2, 4], replicates=200, rng=np.random.default_rng(7))
    assert a.to_dict() == b.to_dict()
    for m in (2, 4):
        s = a.srp[m].model
        assert np.isfinite([s.value, s.lower, s.upper]).all()
        assert s.lower < s.upper  # four different random sequences: the resamples differ
        curve = a.sch[m].model.value
        assert curve[-1] == pytest.approx(1.0)
        assert np.all(np.diff(curve) >= -1e-12)


def test_decode_selection_and_gaps():
    tr = small_trace(S=2)
    tr.requests[0].topk[3, 1] = NOT_COMPUTED
    tr.requests[0].weights[3, 1] = 0
    all_tokens = measure(tr, [2], replicates=10)
    decode = measure(tr, [2], replicates=10, tokens=TokenSelection.DECODE)
    assert all_tokens.tokens == 60 and decode.tokens == 50
    assert all_tokens.sch[2].model.value[-1] == pytest.approx(1.0)


def test_baselines_equal_replaying_the_policies():
    """The baseline numbers are the replayed policies' warm hit rates (fresh cache per request,
    every token a step); check one against a hand-driven replay."""
    from casmoe.cache import Capacity
    from casmoe.policies import get_policy
    from casmoe.replay import replay

    tr = small_trace(S=2, T=12)
    res = measure(tr, [4], replicates=10, baselines=("lru",), rhos=(2.0,))
    hits = acc = 0
    for r in tr.requests:
        sub = Trace(tr.geometry, [Request(topk=r.topk, weights=r.weights, prefill=0)])
        st = replay(sub, get_policy("lru").create(sub.geometry, Capacity(2 * tr.geometry.top_k), trace=sub)).stats
        hits += st.hits + st.cold_misses
        acc += st.accesses
    assert res.baselines["lru"]["layer"][2.0] == pytest.approx(hits / acc)


def test_case_traces_grin_beats_jamba_at_m16():
    from casmoe.importers import read_json

    out = {}
    for key in ("grin", "jamba"):
        tr = read_json(CASES, key=key)
        assert tr.geometry.experts == 16 and tr.geometry.top_k == 2 and tr.tokens == 64
        out[key] = measure(tr, [16], replicates=50)
    g, j = out["grin"], out["jamba"]
    assert g.srp[16].model.value > j.srp[16].model.value
    for rho in (1, 2, 4):
        assert g.sch_at(16, rho, "model")["value"] > j.sch_at(16, rho, "model")["value"]


@pytest.mark.parametrize("name", ["qwen", "gemma", "gptoss"])
def test_real_route_traces_give_finite_metrics(name):
    from casmoe.importers import read_route_csv

    tr = read_route_csv(REAL / f"{name}.route.csv")
    head = Trace(tr.geometry, [Request(topk=r.topk[:40], weights=r.weights[:40], prefill=min(r.prefill, 40)) for r in tr.requests])
    res = measure(head, [4], replicates=20)
    d = res.to_dict()
    assert np.isfinite(d["srp"]["4"]["model"]["value"]) and 0 < d["srp"]["4"]["model"]["value"] <= 1
    curve = np.array(d["sch"]["4"]["model"]["value"])
    assert np.isfinite(curve).all() and curve[-1] == pytest.approx(1.0)


def test_cli_writes_table_json_csv_and_plots(tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    save_trace(small_trace(0, S=2, T=16), a)
    save_trace(small_trace(1, S=2, T=16), b)
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        ["lrc", "-t", str(a), "-t", str(b), "--m", "2,4", "--replicates", "20", "--baselines", "lru",
         "--out", str(out / "lrc.json"), "--csv", str(out / "lrc.csv"), "--plots", str(out)],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "lrc.json").read_text())
    assert [d["trace"] for d in doc] == ["a", "b"]
    df = pd.read_csv(out / "lrc.csv")
    assert set(df["level"]) == {"model", "layer 0", "layer 1", "layer 2"}
    assert len(df) == 2 * 2 * 4
    assert len(pd.read_csv(out / "lrc-baselines.csv")) > 0
    for png in ("sch.png", "srp.png", "layers.png"):
        assert (out / png).stat().st_size > 1000


def test_cli_bad_input_is_one_line_error(tmp_path):
    a = tmp_path / "a.npz"
    save_trace(small_trace(S=1, T=8), a)
    for args in (["--m", "0"], ["--m", "x"], ["--baselines", "nosuch"], ["--tokens", "some"]):
        r = subprocess.run([sys.executable, "-m", "casmoe", "lrc", "-t", str(a), *args], capture_output=True, text=True)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("casmoe: error:"), r.stderr


def test_segments_longer_than_every_request_are_undefined_not_zero():
    res = measure(small_trace(S=2, T=10), [4, 64], replicates=10)
    d = res.to_dict()
    assert d["srp"]["64"]["model"]["value"] is None
    assert d["srp"]["4"]["model"]["value"] > 0
    row = next(r for r in res.records() if r["m"] == 64 and r["level"] == "model")
    assert row["srp"] is None
    # SCH needs no window: the lookahead just reaches past the end of the request.
    assert d["sch"]["64"]["model"]["value"][-1] == pytest.approx(1.0)
