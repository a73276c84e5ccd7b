"""`casmoe trace synth --like` (casmoe.synthetic_fit): the fit recovers a hand-built trace's
stickiness and popularity, its synthetic matches the real traces' caching statistics, and the
pieces it rests on (stack distances, repelling stickiness, task relabelling) hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from casmoe.cache import Capacity
from casmoe.cli import app
from casmoe.geometry import Geometry
from casmoe.importers import read_route_csv
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.synthetic import SynthConfig, generate, route_request
from casmoe.synthetic_fit import fit, inclusion, profile, sample as generate_like, stack_distances, with_tasks
from casmoe.trace import Request, Trace
from casmoe.trace_io import load_trace, save_trace
from casmoe.workload import SLOT_MULTIPLES, measure
from support.paths import REAL

G = Geometry(layers=4, experts=16, top_k=2)


def hand_built(stickiness: float = 0.4, seed: int = 3) -> Trace:
    return generate(G, SynthConfig(requests=40, tasks=1, zipf=1.2, stickiness=stickiness, task_affinity=0.0,
                                   prefill=(8, 8), decode=(48, 48), seed=seed))


def decode_popularity(tr: Trace) -> np.ndarray:
    counts = sum(inclusion(r.topk[r.prefill :], tr.geometry.experts)[0] for r in tr.requests)
    return counts / counts.sum(axis=1, keepdims=True)


def test_fit_recovers_stickiness_and_popularity_of_a_hand_built_trace():
    src = hand_built()
    model = fit(src, "src")
    assert np.all(np.abs(model.decode.stickiness - 0.4) < 0.08)  # a little goes to the fitted drift
    syn = generate_like(model, 40, seed=1)
    a, b = measure(src).model, measure(syn).model
    assert abs(a["kept_share"] - b["kept_share"]) < 0.03
    assert abs(a["exact_reuse"] - b["exact_reuse"]) < 0.04
    tv = 0.5 * np.abs(decode_popularity(src) - decode_popularity(syn)).sum(axis=1)
    assert tv.max() < 0.08  # per-layer popularity: total variation distance
    hot = decode_popularity(src).argmax(axis=1)
    assert (decode_popularity(syn).argmax(axis=1) == hot).all()
    # shape of the requests: lengths resampled from the source
    assert {(r.prefill, r.decode_tokens) for r in syn.requests} == {(8, 48)}


@pytest.mark.slow  # 12-22 s of fitting: the default suite keeps the fit's other checks
def test_router_weights_are_the_source_s_mean_per_rank_and_phase():
    src = hand_built()
    for r in src.requests:  # prompt tokens weigh 0.9 / 0.1, decode tokens 0.6 / 0.4 or 0.8 / 0.2
        r.weights[: r.prefill] = [0.9, 0.1]
        r.weights[r.prefill :] = np.where(np.arange(r.decode_tokens)[:, None, None] % 2, [0.4, 0.6], [0.8, 0.2])
    syn = generate_like(fit(src, "src"), 5, seed=1)
    for r in syn.requests:
        np.testing.assert_allclose(r.weights[: r.prefill], np.broadcast_to([0.9, 0.1], (r.prefill, 4, 2)), atol=1e-6)
        np.testing.assert_allclose(r.weights[r.prefill :], np.broadcast_to([0.7, 0.3], (r.decode_tokens, 4, 2)), atol=1e-6)


@pytest.mark.slow  # 12-22 s of fitting: the default suite keeps the fit's other checks
def test_fit_tells_a_sticky_trace_from_a_non_sticky_one():
    loose = fit(hand_built(0.0, seed=4), "loose")
    tight = fit(hand_built(0.7, seed=4), "tight")
    assert tight.decode.stickiness.mean() > loose.decode.stickiness.mean() + 0.4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen", "gemma", "gptoss"])
def test_synthetic_matches_the_real_traces_caching_within_003(name):
    real = read_route_csv(REAL / f"{name}.route.csv")
    want = measure(real, name).model
    got = measure(generate_like(fit(real, name), 8, seed=0)).model
    for stat in ("lru@1k", "lru@1.5k", "lru@2k", "lru@4k", "belady@1k", "belady@1.5k", "belady@2k", "belady@4k", "srp16"):
        assert got[stat] == pytest.approx(want[stat], abs=0.03), stat


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), E=st.integers(2, 6), k=st.integers(1, 3), extra=st.integers(0, 3), T=st.integers(1, 30))
def test_stack_distances_give_the_lru_replay_hit_rate(seed, E, k, extra, T):
    E = max(E, k)
    topk = np.argsort(np.random.default_rng(seed).random((T, 2, E)), axis=2)[:, :, :k]  # distinct per token
    C = min(E, k + extra)
    g = Geometry(layers=2, experts=E, top_k=k)
    tr = Trace(g, [Request(topk=topk.astype(np.int16), weights=np.full(topk.shape, 1 / k, np.float32), prefill=0)])
    hits = replay(tr, get_policy("lru").create(g, Capacity(C), trace=tr)).stats.hits
    d = stack_distances(topk)
    assert int(((d >= 0) & (d < C)).sum()) == hits


def test_profile_matches_trace_stats_lru_hit_rates_at_odd_k():
    """The drift fit's profile and `casmoe trace stats` size the caches alike (1.5k = 5 slots at k = 3)."""
    g = Geometry(layers=2, experts=16, top_k=3)
    topk = np.argsort(np.random.default_rng(5).random((80, 2, 16)), axis=2)[:, :, :3]
    tr = Trace(g, [Request(topk=topk.astype(np.int16), weights=np.full(topk.shape, 1 / 3, np.float32), prefill=0)])
    stats = measure(tr).model
    got = profile([topk], g.experts, g.top_k)[: len(SLOT_MULTIPLES)]
    assert got == pytest.approx([stats[f"lru@{m:g}k"] for m in SLOT_MULTIPLES], abs=1e-12)


def test_negative_stickiness_repels_the_previous_experts():
    logq = np.zeros((3, 8))
    topk, _, _ = route_request(logq, 50, 2, -1.0, np.random.default_rng(0))
    shared = (topk[1:, :, :, None] == topk[:-1, :, None, :]).any(axis=3)
    assert not shared.any()
    keep, _, _ = route_request(logq, 50, 2, 1.0, np.random.default_rng(0))
    assert (np.sort(keep[1:], axis=2) == np.sort(keep[:1], axis=2)).all()  # full stickiness: same set


def test_tasks_relabel_experts_but_keep_each_request_s_statistics():
    model = fit(hand_built(), "src")
    split = with_tasks(model, 3, 0.5, seed=0)
    assert [g.task for g in split.groups] == ["code", "math", "cooking"]
    for w in split.decode.weights:  # a permutation of the fitted log-weights per layer
        np.testing.assert_allclose(np.sort(w, axis=1), np.sort(model.decode.weights[0], axis=1))
    assert not np.allclose(split.decode.weights[0], split.decode.weights[1])
    syn = generate_like(split, 30, seed=2)
    assert {r.task for r in syn.requests} == {"code", "math", "cooking"} and all(r.prompt for r in syn.requests)
    with pytest.raises(Exception, match="own tasks"):
        with_tasks(split, 2, 0.5, seed=0)


def test_cli_synth_like(tmp_path):
    src, out = tmp_path / "src.npz", tmp_path / "out.npz"
    save_trace(hand_built(), src)
    runner = CliRunner()
    r = runner.invoke(app, ["trace", "synth", str(out), "--like", str(src), "--requests", "12", "--tasks", "2"])
    assert r.exit_code == 0, r.output
    tr = load_trace(out)
    assert len(tr.requests) == 12 and tr.geometry == hand_built().geometry
    assert tr.meta["synth_like"]["source"] == "src" and len(tr.meta["synth_like"]["decode"]["stickiness"]) == 4
    r = runner.invoke(app, ["trace", "synth", str(out), "--like", str(src), "--zipf", "2"])
    assert r.exit_code != 0 and "--zipf" in str(r.exception or r.output)


def test_rank_weights_extend_their_log_linear_decay_and_keep_the_total():
    from casmoe.synthetic_fit import extend_rank_weights

    w = np.array([[0.4, 0.2, 0.1], [0.5, 0.3, 0.2]]) / np.array([[0.7], [1.0]])
    out = extend_rank_weights(w, 5)
    np.testing.assert_allclose(out.sum(axis=1), w.sum(axis=1))
    np.testing.assert_allclose(out[0, 1:] / out[0, :-1], 0.5)  # a geometric decay continues
    assert (np.diff(out, axis=1) <= 1e-12).all()
    np.testing.assert_allclose(extend_rank_weights(w, 2), w[:, :2] * (w.sum(1) / w[:, :2].sum(1))[:, None])


@pytest.mark.slow  # 12-22 s of fitting: the default suite keeps the fit's other checks
def test_top_k_extrapolation_draws_more_of_the_same_ranking(tmp_path):
    """Fitted at k = 2, generated at 4: each token routes 4 distinct experts, the hottest expert
    of each layer stays the hottest, and the first 2 ranks' popularity barely moves."""
    from casmoe.synthetic_fit import with_top_k

    model = fit(hand_built(), "src")
    wide = with_top_k(model, 4)
    assert wide.geometry.top_k == 4 and wide.decode.drift == model.decode.drift
    np.testing.assert_array_equal(wide.decode.stickiness, model.decode.stickiness)
    syn = generate_like(wide, 40, seed=1)
    assert syn.geometry.top_k == 4
    for r in syn.requests:
        dec = r.topk[r.prefill :]
        assert (np.sort(dec, axis=2)[:, :, 1:] != np.sort(dec, axis=2)[:, :, :-1]).all()
    narrow = generate_like(model, 40, seed=1)
    assert (decode_popularity(syn).argmax(axis=1) == decode_popularity(narrow).argmax(axis=1)).all()
    r = CliRunner().invoke(app, ["trace", "synth", str(tmp_path / "x.npz"), "--like", str(REAL / "gptoss.route.csv"),
                                 "--top-k", "999"])  # absolute paths: the suite runs from any folder
    assert r.exit_code != 0 and "--top-k" in str(r.exception or r.output)
