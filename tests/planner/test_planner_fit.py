"""The fitted planner end to end: fit, save/load, gate, buffer, geometry check, eval, CLI.

These load the shipped all-MiniLM-L6-v2 once (module-scoped fixtures) and fit one small planner
on a generated trace whose prompts cluster by task and whose tasks prefer distinct experts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from casmoe.geometry import Geometry
from casmoe.planner import EAPConfig, PlannerConfig, PlannerError, fit_planner, load_planner
from casmoe.planner.gate import Source
from casmoe.planner.patterns import request_pattern
from casmoe.trace import Request, Trace
from casmoe.trace_io import save_trace
from support.paths import REPO

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("sentence_transformers")
pytest.importorskip("hnswlib")

G = Geometry(layers=4, experts=8, top_k=2)
TASKS = {
    "cooking": ["Bake a lemon cake with {} eggs", "How long to roast {} potatoes", "A soup recipe with {} carrots"],
    "code": [
        "Write a Python function that sorts {} integers",
        "Fix this segfault in {} lines of C",
        "Explain git rebase for {} commits",
    ],
    "law": [
        "Is a verbal contract for {} dollars binding",
        "Explain tenant rights after {} days notice",
        "Draft an NDA for {} employees",
    ],
}
SMALL_EAP = EAPConfig(layers=2, epochs=8, batch_size=16)


def task_trace(requests: int = 45, seed: int = 0, geometry: Geometry = G) -> Trace:
    """Each task routes (almost) only to its own pair of experts per layer."""
    rng = np.random.default_rng(seed)
    names = list(TASKS)
    prefer = {t: [rng.choice(geometry.experts, 2, replace=False) for _ in range(geometry.layers)] for t in names}
    reqs = []
    for i in range(requests):
        task = names[i % len(names)]
        prompt = TASKS[task][(i // len(names)) % 3].format(i + 2)
        T, prefill = 12, 4
        topk = np.zeros((T, geometry.layers, geometry.top_k), dtype=np.int16)
        for t in range(T):
            for layer in range(geometry.layers):
                pair = prefer[task][layer] if rng.random() < 0.9 else rng.choice(geometry.experts, 2, replace=False)
                topk[t, layer] = pair[: geometry.top_k]
        weights = np.full(topk.shape, 1.0 / geometry.top_k, dtype=np.float32)
        reqs.append(Request(topk, weights, prefill, prompt=prompt, task=task))
    return Trace(geometry, reqs)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return task_trace()


@pytest.fixture(scope="module")
def planner_dir(trace, tmp_path_factory):
    folder = tmp_path_factory.mktemp("planner")
    fit_planner(trace, PlannerConfig(epsilon=0.6, buffer=3, eap=SMALL_EAP)).save(folder)
    return folder


def test_saved_planner_predicts_and_uses_no_pickle(planner_dir, trace) -> None:
    files = sorted(p.name for p in planner_dir.iterdir())
    assert files == ["eam.index", "eam_patterns.npy", "eap_linear.npz", "fit.npz", "manifest.json", "planner.json", "trajectory.npz"]
    for name in ("eap_linear.npz", "trajectory.npz"):
        np.load(planner_dir / name, allow_pickle=False)
    np.load(planner_dir / "fit.npz", allow_pickle=False)
    np.load(planner_dir / "eam_patterns.npy", allow_pickle=False)  # raises if it held objects
    planner = load_planner(planner_dir)
    assert planner.geometry == G
    scores = planner.predict(trace.requests[4].prompt)
    assert scores.shape == (G.layers, G.experts) and scores.dtype == np.float32
    np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-5)
    # a held-out prompt close to its task's prompts: the matcher answers with the task's experts
    held = trace.requests[4]
    ans = planner.explain(held.prompt)
    assert ans.source is Source.BLEND and ans.similarity > 0.6
    truth = request_pattern(held, G)
    top_pred = np.argsort(-ans.scores, -1)[:, :2]
    top_true = np.argsort(-truth, -1)[:, :2]
    assert all(set(p) == set(t) for p, t in zip(top_pred, top_true))


def test_gate_blends_the_stages_by_their_measured_weight(planner_dir) -> None:
    planner = load_planner(planner_dir)
    prompt = "Quantum chromodynamics lattice simulation of gluon fields"
    ans = planner.explain(prompt)
    vec = planner._embed(prompt)[None]
    eam, sim = planner.matcher.query(vec)
    w = float(planner.gate.matcher_weight(sim)[0])
    expect = w * eam[0] + (1 - w) * planner.predictor.predict(vec)[0]
    assert ans.source is Source.BLEND and ans.similarity == pytest.approx(float(sim[0]))
    np.testing.assert_allclose(ans.scores, expect, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(planner.predict(prompt), ans.scores)


def test_seed_gate_and_transformer_predictor_still_fit_and_serve(trace, tmp_path) -> None:
    """`--predictor transformer` keeps the seed's encoder; `--epsilon` in eval keeps its gate."""
    from casmoe.planner.evaluate import evaluate

    cfg = PlannerConfig(epsilon=0.6, eap=EAPConfig(kind="transformer", layers=2, epochs=2, batch_size=16))
    fit_planner(trace, cfg).save(tmp_path)
    assert (tmp_path / "eap.safetensors").exists() and not (tmp_path / "eap_linear.npz").exists()
    planner = load_planner(tmp_path)
    prompt = "Quantum chromodynamics lattice simulation of gluon fields"
    assert planner.predict(prompt).shape == (G.layers, G.experts)
    ev = evaluate(planner, trace, epsilon=0.6)
    assert ev.to_dict()["cascade"]["epsilon"] == 0.6


def test_buffer_flush_makes_novel_prompt_a_close_match(planner_dir, trace) -> None:
    planner = load_planner(planner_dir)
    novel = "Translate the poems of Pablo Neruda into Finnish verse"
    before = planner.explain(novel)
    assert before.similarity < 0.9
    size = len(planner.matcher)
    pattern = request_pattern(trace.requests[0], G)
    assert planner.observe(novel, pattern) is False  # served once: waits in the buffer
    assert planner.explain(novel).similarity == pytest.approx(before.similarity)
    assert planner.observe("Another unrelated prompt about knitting", pattern) is False
    assert planner.observe("A third about medieval architecture", pattern) is True  # C = 3: flush
    assert len(planner.matcher) == size + 3
    after = planner.explain(novel)
    assert after.similarity > before.similarity
    assert after.similarity == pytest.approx(1.0, abs=1e-3)


def test_planner_refuses_other_geometry(planner_dir) -> None:
    planner = load_planner(planner_dir)
    other = task_trace(requests=6, geometry=Geometry(layers=4, experts=16, top_k=2))
    with pytest.raises(PlannerError, match="fitted on 4 MoE layers x 8 experts"):
        planner.check(other)
    from casmoe.planner.evaluate import evaluate

    with pytest.raises(PlannerError):
        evaluate(planner, other)


def test_load_rejects_a_folder_that_is_not_a_planner(tmp_path) -> None:
    with pytest.raises(PlannerError, match="not a planner folder"):
        load_planner(tmp_path)


def test_fit_needs_prompts() -> None:
    tr = task_trace(requests=6)
    tr.requests[2].prompt = None
    with pytest.raises(PlannerError, match="prompt"):
        fit_planner(tr, PlannerConfig(eap=SMALL_EAP))


def test_cli_fit_and_eval(trace, tmp_path) -> None:
    from typer.testing import CliRunner

    from casmoe.cli.app import app

    save_trace(trace, tmp_path / "t.npz")
    out, path, csv = str(tmp_path / "pl"), str(tmp_path / "t.npz"), str(tmp_path / "c.csv")
    runner = CliRunner()
    res = runner.invoke(app, ["planner", "fit", "--trace", path, "--out", out, "--epochs", "4", "--epsilon", "0.6"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["planner", "eval", "--planner", out, "--trace", path, "--json", "--curve", csv])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert set(result) == {"eam", "eap", "cascade", "trajectory", "popularity", "task_popularity", "random"}
    for entry in result.values():
        assert 0.0 <= entry["recall_at_k"] <= 1.0 and 0.0 <= entry["coverage_at_2k"] <= 1.0
        assert entry["requests"] == 9  # every 5th of 45
    # the trace's structure is task-level: matching and task popularity find it, random does not
    assert result["eam"]["recall_at_k"] > 0.9 and result["task_popularity"]["recall_at_k"] > 0.9
    assert result["random"]["recall_at_k"] < 0.6
    import pandas as pd

    curve = pd.read_csv(tmp_path / "c.csv")
    assert list(curve.columns) == ["epsilon", "eam_share", "recall_at_k", "coverage_at_2k"]
    assert curve["eam_share"].is_monotonic_decreasing


def test_serve_online_grows_the_index_by_flushed_buffers(planner_dir, trace) -> None:
    from casmoe.planner.evaluate import serve_online

    planner = load_planner(planner_dir)  # buffer C = 3, 9 held-out requests: 3 flushes
    before = len(planner.matcher)
    preds = serve_online(planner, trace)
    assert preds.shape == (9, G.layers, G.experts)
    assert len(planner.matcher) == before + 9 and len(planner.buffer) == 0


def test_eval_refuses_a_planner_fitted_on_everything(planner_dir, trace) -> None:
    from dataclasses import replace

    from casmoe.planner.evaluate import evaluate

    planner = load_planner(planner_dir)
    planner.config = replace(planner.config, holdout_every=0)
    with pytest.raises(PlannerError, match="no held-out requests"):
        evaluate(planner, trace)


def test_casmoe_policy_feeds_served_prompts_to_the_planner_buffer(planner_dir, trace) -> None:
    """Serving held-out requests through the `casmoe` policy fills the planner's online buffer
    with what their routing showed; at C = 3 the third request flushes it into the index."""
    from casmoe.cache import Capacity
    from casmoe.policies import get_policy
    from casmoe.replay import replay

    served = trace.subset(range(3))
    cache = get_policy("casmoe").create(G, Capacity(3), trace=served, planner=str(planner_dir))
    planner = cache.predictor.planner
    size = len(planner.matcher)
    replay(served, cache)
    assert len(planner.matcher) == size + 3
    for r in served.requests:
        assert planner.explain(r.prompt).similarity == pytest.approx(1.0, abs=1e-3)


# ---- evaluation across traces and tasks -------------------------------------------------------


def _least_popular_trace(planner, requests: int = 6) -> Trace:
    """Requests that route every token to each layer's two *least* popular experts of the
    planner's fit data: their own popularity would score recall 1, the fit data's scores 0."""
    cold = np.argsort(planner.fit_data.popularity, axis=-1, kind="stable")[:, :2]  # [L, 2]
    reqs = []
    for i in range(requests):
        topk = np.broadcast_to(cold, (10, G.layers, 2)).astype(np.int16)
        reqs.append(Request(topk, np.full(topk.shape, 0.5, np.float32), 3, prompt=f"cold prompt {i}", task="cold"))
    return Trace(G, reqs)


def test_cross_trace_eval_uses_the_planners_stored_baselines(planner_dir) -> None:
    from casmoe.planner.evaluate import evaluate

    planner = load_planner(planner_dir)
    other = _least_popular_trace(planner)
    ev = evaluate(planner, other)
    assert ev.to_dict()["popularity"]["requests"] == 6  # every request of another trace
    assert "not fitted on" in ev.scope
    assert ev.scores["popularity"]["recall_at_k"] == 0.0  # the fit data's popularity, not this trace's
    assert ev.scores["popularity"]["coverage_at_2k"] < 1.0
    assert ev.scores["task_popularity"] == ev.scores["popularity"]  # task "cold" unseen: no data


def test_eval_on_the_fit_trace_scores_only_requests_not_fitted_on(planner_dir, trace) -> None:
    from casmoe.planner.evaluate import scored_requests

    planner = load_planner(planner_dir)
    idx, scope = scored_requests(planner, trace)
    assert idx == list(range(4, 45, 5)) and "held-out" in scope
    other = trace.subset(range(10))  # another trace (10 requests), even if it shares prompts
    idx, scope = scored_requests(planner, other)
    assert idx == list(range(10)) and "(8 of them with a prompt it was fitted on)" in scope  # 4, 9 held out


@pytest.fixture(scope="module")
def loto_dir(trace, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loto")
    fit_planner(trace, PlannerConfig(exclude_tasks=("law",), eap=SMALL_EAP)).save(folder)
    return folder


def test_leave_one_task_out_scores_every_request_of_the_unseen_task(loto_dir, trace) -> None:
    from casmoe.planner.evaluate import evaluate

    planner = load_planner(loto_dir)
    assert planner.config.exclude_tasks == ("law",) and planner.fit_data.tasks == ("code", "cooking")
    assert planner.fit_data.requests == 24  # 36 train requests less law's 12
    ev = evaluate(planner, trace, holdout_task="law")
    assert len(ev.truth) == 15  # all of law's requests, train split included: none was fitted
    assert ev.scores["task_popularity"] == ev.scores["popularity"]
    with pytest.raises(PlannerError, match="fitted on task 'code'"):
        evaluate(planner, trace, holdout_task="code")
    with pytest.raises(PlannerError, match="no request of task 'gardening'"):
        evaluate(planner, trace, holdout_task="gardening")


@pytest.mark.filterwarnings("error")  # a clear error, not a RuntimeWarning and a nan baseline
def test_empty_fit_or_heldout_split_is_a_clear_error(planner_dir, trace) -> None:
    from casmoe.planner.evaluate import evaluate

    labelled = trace.subset(range(len(trace.requests)))
    labelled.meta["splits"] = ["heldout"] * len(trace.requests)
    with pytest.raises(PlannerError, match="at least 2 requests"):
        fit_planner(labelled, PlannerConfig(eap=SMALL_EAP))
    with pytest.raises(PlannerError, match="at least 2 requests"):
        fit_planner(trace, PlannerConfig(exclude_tasks=("law", "code", "cooking"), eap=SMALL_EAP))
    with pytest.raises(PlannerError, match="excluded task 'gardening' has no request"):
        fit_planner(trace, PlannerConfig(exclude_tasks=("gardening",), eap=SMALL_EAP))
    planner = load_planner(planner_dir)
    with pytest.raises(PlannerError, match="no held-out requests"):
        evaluate(planner, Trace(G, []))


def test_folder_without_stored_baselines_serves_but_refuses_eval(planner_dir, trace, tmp_path) -> None:
    import shutil

    from casmoe.planner.evaluate import evaluate

    old = tmp_path / "old"
    shutil.copytree(planner_dir, old)
    (old / "fit.npz").unlink()
    (old / "manifest.json").unlink()  # as written before manifests
    meta = json.loads((old / "planner.json").read_text())
    del meta["fit"], meta["config"]["exclude_tasks"]  # as written before stored baselines
    (old / "planner.json").write_text(json.dumps(meta))
    planner = load_planner(old)
    assert planner.fit_data is None and planner.predict(trace.requests[0].prompt).shape == (G.layers, G.experts)
    with pytest.raises(PlannerError, match="predates stored fit baselines"):
        evaluate(planner, trace)


def test_cli_leave_one_task_out(trace, tmp_path) -> None:
    import subprocess
    import sys

    from typer.testing import CliRunner

    from casmoe.cli.app import app

    path, out = str(tmp_path / "t.npz"), str(tmp_path / "pl")
    save_trace(trace, path)
    runner = CliRunner()
    fit = ["planner", "fit", "--trace", path, "--out", out, "--epochs", "2", "--exclude-task", "law"]
    res = runner.invoke(app, fit)
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["planner", "eval", "--planner", out, "--trace", path, "--holdout-task", "law", "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert {e["requests"] for e in result.values()} == {15}
    res = runner.invoke(app, ["planner", "eval", "--planner", out, "--trace", path, "--holdout-task", "law"])
    assert res.exit_code == 0 and "task 'law', unseen in the fit data" in res.output
    cmd = [sys.executable, "-m", "casmoe", "planner", "eval", "--planner", out, "--trace", path, "--holdout-task", "code"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr
    assert "fitted on task 'code'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    # a task name the trace lacks: one line, exit 2, for fit and eval alike
    bad = [["fit", "--trace", path, "--out", str(tmp_path / "p2"), "--exclude-task", "nope"],
           ["eval", "--planner", out, "--trace", path, "--holdout-task", "nope"]]
    for args in bad:
        done = subprocess.run([*cmd[:4], *args], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 2, done.stderr
        assert "task 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_prompt_free_trace_is_served_by_the_trajectory_stage(trace, tmp_path) -> None:
    """A trace without prompts (an imported route CSV) fits the trajectory stage alone; the
    planner answers popularity before a request routes, and casmoe follows the routing."""
    from typer.testing import CliRunner

    from casmoe.cli.app import app
    from casmoe.planner.gate import Source

    bare = Trace(G, [Request(r.topk, r.weights, r.prefill, task=r.task) for r in trace.requests])
    save_trace(bare, tmp_path / "bare.npz")
    runner = CliRunner()
    res = runner.invoke(app, ["planner", "fit", "--trace", str(tmp_path / "bare.npz"), "--out", str(tmp_path / "pl")])
    assert res.exit_code == 0, res.output
    assert "trajectory stage alone" in res.output
    planner = load_planner(tmp_path / "pl")
    assert planner.stages == ["trajectory"] and not planner.serves_prompts
    ans = planner.explain(None)
    assert ans.source is Source.POPULARITY
    np.testing.assert_allclose(ans.scores, planner.fit_data.popularity, atol=1e-6)
    res = runner.invoke(app, ["planner", "eval", "--planner", str(tmp_path / "pl"), "--trace", str(tmp_path / "bare.npz"), "--json"])
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)) == {"trajectory", "popularity", "task_popularity", "random"}
    res = runner.invoke(
        app, ["replay", "--trace", str(tmp_path / "bare.npz"), "--policy", "casmoe", "--policy", "lru",
              "--planner", str(tmp_path / "pl"), "--capacity", "3", "--json"],
    )
    assert res.exit_code == 0, res.output
    # a planner with prompt stages serves a prompt-free request from the trajectory stage too
    full = load_planner(tmp_path / "pl")
    assert full.predict(None).shape == (G.layers, G.experts)


@pytest.mark.slow
def test_cli_planner_bench_chooses_on_fit_data_only(trace, tmp_path) -> None:
    from typer.testing import CliRunner

    from casmoe.cli.app import app

    tagged = Trace(trace.geometry, trace.requests, {"splits": ["heldout" if i % 5 == 4 else "train" for i in range(len(trace.requests))]})
    save_trace(tagged, tmp_path / "t.npz")
    out = tmp_path / "bench"
    res = CliRunner().invoke(
        app, ["planner", "bench", "--trace", str(tmp_path / "t.npz"), "--out", str(out), "--setting", "mixed:code",
              "--grid", "2,4", "--slots", "3"],
    )
    assert res.exit_code == 0, res.output
    records = json.loads((out / "results.json").read_text())
    assert [r["setting"] for r in records] == ["mixed:code"]
    rec = records[0]
    assert "code" not in rec["chosen_on"] and rec["horizon"] in (2, 4)
    assert rec["chosen_on"].startswith("2 validation fold(s)")  # VALID_FOLDS, each a planner fitted on the rest
    assert set(rec["validation_hit_rate"]) == {"2", "4", "2+fallback", "4+fallback"}
    assert isinstance(rec["fallback"], bool)
    row = rec["policies"][0]
    assert row["slots_per_layer"] == 3 and all(0 <= row[p] <= 1 for p in ("casmoe", "casmoe_static", "lru", "lfu"))
    assert "horizon" in res.output and "validation fold(s) of the fit data" in res.output


def test_validation_scores_the_folds_least_like_the_rest_first() -> None:
    """`unlike_first`: total variation of a fold's mean pattern from the other folds' (closed
    form on one-layer patterns), the most unlike first, ties in fold order."""
    from casmoe.planner.protocol import unlike_first

    e = np.eye(4, dtype=np.float32)
    # requests 0-1 on expert 0, 2-3 on expert 0 too, 4-5 on expert 3: fold 2 is unlike the rest
    patterns = np.stack([e[0], e[0], e[0], e[0], e[3], e[3]])[:, None, :]
    folds = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    order = unlike_first(folds, patterns)
    assert [f.tolist() for f in order] == [[4, 5], [0, 1], [2, 3]]  # distances 1, 0.5, 0.5
    assert [f.tolist() for f in unlike_first(folds[:1], patterns)] == [[0, 1]]


def test_a_saved_planner_serves_a_replay_without_torch(planner_dir, trace, tmp_path, monkeypatch) -> None:
    """Serving without torch: load, predict a novel prompt and drive a casmoe replay
    in a fresh interpreter, through bench/bench_planner_speed.py's own check (which once broke
    unnoticed: it ran only when the bench ran)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from bench_planner_speed import TORCH_FREE

    save_trace(trace, tmp_path / "t.npz")
    res = subprocess.run([sys.executable, "-c", TORCH_FREE, str(planner_dir), str(tmp_path / "t.npz")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "False"
