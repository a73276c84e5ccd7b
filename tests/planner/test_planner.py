"""Planner pieces that need no sentence model: labels, metrics, split, buffer, EAP training."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casmoe.geometry import Geometry
from casmoe.planner.evaluate import coverage_at, recall_at_k
from casmoe.planner.fitdata import FitData
from casmoe.planner.gate import Buffer, use_matcher
from casmoe.planner.patterns import Phase, expert_patterns, normalise, request_pattern
from casmoe.planner.config import EAPConfig, PlannerConfig, PlannerError
from casmoe.planner.planner import heldout_split
from casmoe.trace import NOT_COMPUTED, Request, Trace

G = Geometry(layers=3, experts=6, top_k=2)


def random_request(rng: np.random.Generator, tokens: int, prefill: int, gaps: bool = True) -> Request:
    topk = np.stack([[rng.choice(G.experts, G.top_k, replace=False) for _ in range(G.layers)] for _ in range(tokens)])
    weights = rng.random((tokens, G.layers, G.top_k)).astype(np.float32)
    if gaps and tokens > 1:
        topk[0, G.layers - 1] = NOT_COMPUTED
        weights[0, G.layers - 1] = 0.0
    return Request(topk.astype(np.int16), weights, prefill, prompt="p")


def brute_pattern(r: Request, phase: Phase, weighted: bool) -> np.ndarray:
    out = np.zeros((G.layers, G.experts))
    span = {Phase.DECODE: range(r.prefill, r.tokens), Phase.PREFILL: range(r.prefill), Phase.ALL: range(r.tokens)}
    for t in span[phase]:
        for layer in range(G.layers):
            for j in range(G.top_k):
                e = int(r.topk[t, layer, j])
                if e != NOT_COMPUTED:
                    out[layer, e] += float(r.weights[t, layer, j]) if weighted else 1.0
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tokens=st.integers(1, 12), data=st.data())
def test_pattern_matches_definition(seed: int, tokens: int, data) -> None:
    prefill = data.draw(st.integers(0, tokens))
    r = random_request(np.random.default_rng(seed), tokens, prefill)
    for phase in Phase:
        for weighted in (True, False):
            got = request_pattern(r, G, phase, weighted)
            assert got.shape == (G.layers, G.experts) and got.dtype == np.float32
            np.testing.assert_allclose(got, brute_pattern(r, phase, weighted), rtol=1e-5, atol=1e-6)


def test_pattern_skips_gap_rows_and_counts_sum_to_k() -> None:
    r = random_request(np.random.default_rng(1), tokens=5, prefill=0)
    counts = request_pattern(r, G, Phase.DECODE, weighted=False)
    computed = int((r.topk[:, :, 0] != NOT_COMPUTED).sum())
    assert counts.sum() == computed * G.top_k == (5 * G.layers - 1) * G.top_k


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=G.experts * 2, max_size=G.experts * 2))
def test_normalise_rows_sum_to_one_or_zero(values: list[float]) -> None:
    p = np.array(values, dtype=np.float32).reshape(2, G.experts)
    sums = normalise(p).sum(-1)
    for s, raw in zip(sums, p.sum(-1)):
        assert s == pytest.approx(1.0, abs=1e-5) if raw > 0 else s == 0


def test_metrics_perfect_random_and_budget() -> None:
    rng = np.random.default_rng(0)
    truth = rng.random((20, G.layers, G.experts)).astype(np.float32)
    counts = rng.integers(0, 5, truth.shape).astype(np.float32)
    assert recall_at_k(truth, truth, G.top_k) == 1.0
    assert recall_at_k(-truth, truth, G.top_k) == 0.0  # the bottom k never meet the top k when E >= 2k
    covs = [coverage_at(rng.random(truth.shape), counts, b) for b in range(G.experts + 1)]
    assert covs[0] == 0.0 and covs[-1] == pytest.approx(1.0)
    same = rng.random(truth.shape)
    assert all(coverage_at(same, counts, b) <= coverage_at(same, counts, b + 1) for b in range(G.experts))


def test_recall_ignores_layers_without_decode() -> None:
    truth = np.zeros((1, G.layers, G.experts))
    truth[0, 0, [1, 2]] = 1.0  # only layer 0 saw decode tokens
    pred = np.zeros_like(truth)
    pred[0, :, [1, 2]] = 1.0
    assert recall_at_k(pred, truth, 2) == 1.0


def test_heldout_split_rule_and_metadata() -> None:
    reqs = [random_request(np.random.default_rng(i), 3, 1) for i in range(12)]
    tr = Trace(G, reqs)
    fit, test = heldout_split(tr, 5)
    assert test == [4, 9] and sorted(fit + test) == list(range(12))
    assert heldout_split(tr, 0) == (list(range(12)), [])
    tr.meta["splits"] = ["heldout" if i in (0, 3) else "train" for i in range(12)]
    fit, test = heldout_split(tr, 5)
    assert test == [0, 3] and 0 not in fit and 4 in fit
    assert heldout_split(tr, 0) == (list(range(12)), [])  # 0: fit on everything, labels or not
    tr.meta["splits"] = ["heldout"] * 3  # labels that do not cover the trace are ignored
    assert heldout_split(tr, 5)[1] == [4, 9]
    with pytest.raises(PlannerError):
        PlannerConfig(holdout_every=1)


def test_config_round_trip() -> None:
    cfg = PlannerConfig(epsilon=0.5, phase=Phase.PREFILL, weighted=False, eap=EAPConfig(alpha=0.0, epochs=3))
    assert PlannerConfig.from_dict(cfg.to_dict()) == cfg


def test_buffer_flushes_when_full() -> None:
    buf = Buffer(3)
    assert buf.add(np.ones(4), np.zeros((2, 2))) is None
    assert buf.add(np.ones(4), np.zeros((2, 2))) is None
    emb, pat = buf.add(np.full(4, 2.0), np.ones((2, 2)))
    assert emb.shape == (3, 4) and pat.shape == (3, 2, 2) and len(buf) == 0
    assert use_matcher(np.array([0.5, 0.81]), 0.8).tolist() == [False, True]


def test_task_popularity_falls_back_to_popularity() -> None:
    rng = np.random.default_rng(3)
    reqs = [random_request(rng, 6, 2) for _ in range(6)]
    for i, r in enumerate(reqs):
        r.task = "a" if i % 2 else "b"
    reqs[5].task = "unseen"
    fit, test = Trace(G, reqs[:4]), Trace(G, reqs[4:])
    pats = normalise(expert_patterns(fit))
    b = FitData.of(fit, fit, pats).baselines(test)
    same_task = [1, 3] if reqs[4].task == "a" else [0, 2]
    np.testing.assert_allclose(b["task_popularity"][0], pats[same_task].mean(0))
    np.testing.assert_allclose(b["task_popularity"][1], b["popularity"][1])


def test_eap_training_is_reproducible_and_round_trips(tmp_path) -> None:
    pytest.importorskip("torch")
    from casmoe.planner.eap import EAP, train

    rng = np.random.default_rng(0)
    prompts = [f"{w} question number {i}" for i, w in enumerate(["cats", "dogs", "tax law", "python code"] * 4)]
    pats = normalise(rng.random((len(prompts), G.layers, G.experts)).astype(np.float32))
    cfg = EAPConfig(layers=2, epochs=2, batch_size=8)
    a = train(prompts, pats, cfg, seed=7)
    b = train(prompts, pats, cfg, seed=7)
    for (name, x), y in zip(a.net.state_dict().items(), b.net.state_dict().values()):
        assert np.array_equal(x.numpy(), y.numpy()), name
    out = a.predict(prompts + ["a prompt with unseen words zebra"])
    assert out.shape == (len(prompts) + 1, G.layers, G.experts)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    a.save(tmp_path / "eap.safetensors")
    c = EAP.load(tmp_path / "eap.safetensors", cfg, G.layers, G.experts)
    np.testing.assert_allclose(c.predict(prompts), out[: len(prompts)], rtol=1e-5, atol=1e-6)
