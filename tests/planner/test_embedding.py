"""Prompt embeddings: the onnxruntime backend equals the torch reference (cosine >= 0.99999); the
int8 one stays close to it; a planner serves with the precision it was fitted with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from casmoe.planner.config import PlannerConfig, PlannerError
from casmoe.planner.embedding import backend_for, default_backend, embed, int8_export, onnx_export
from casmoe.shipped import data_dir

pytest.importorskip("onnxruntime")


def corpus_prompts(n: int) -> list[str]:
    lines = (data_dir() / "corpus" / "corpus.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["text"] for line in lines[:: max(1, len(lines) // n)]][:n]
    # the edges: one word, a prompt longer than the model's 256 tokens (truncated alike),
    # and non-ASCII text
    return prompts + ["hi", "Summarise this report about the harbour. " * 60, "Übersetze: «naïve café» → 東京"]


def test_onnx_embeddings_equal_torch_ones():
    prompts = corpus_prompts(48)
    onnx = embed(prompts, batch_size=16, backend="onnx")  # batches of unequal lengths: padding
    torch = embed(prompts, batch_size=16, backend="torch")
    cos = (onnx * torch).sum(axis=1)
    assert cos.min() >= 0.99999, f"lowest cosine {cos.min()} for {prompts[int(cos.argmin())][:60]!r}"
    np.testing.assert_allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)
    one_by_one = np.concatenate([embed([p], backend="onnx") for p in prompts[:8]])
    np.testing.assert_allclose(one_by_one, onnx[:8], atol=1e-5)  # padding does not change a prompt's vector


def test_export_is_built_once_and_reused(tmp_path, monkeypatch):
    """The real export (tests/planner/test_user_cache.py checks its keying and repair with a fake one)."""
    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path))
    path = onnx_export()
    assert path.parent == tmp_path / "embedder" and path.stat().st_size > 80 * 2**20
    stamp = path.stat().st_mtime_ns
    assert onnx_export() == path and path.stat().st_mtime_ns == stamp
    record = json.loads(path.with_name(path.name + ".json").read_text())
    assert record["bytes"] == path.stat().st_size and len(record["sha256"]) == 64
    left = sorted(p.name for p in path.parent.iterdir())  # no temporary file left behind
    assert left == sorted([path.name, path.name + ".json", path.name + ".lock", "digests.json"]), left


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("CASMOE_EMBEDDER", raising=False)
    assert default_backend() == "onnx"  # installed here (importorskip above)
    monkeypatch.setenv("CASMOE_EMBEDDER", "torch")
    assert default_backend() == "torch"
    assert backend_for("fp32") == "torch" and backend_for("int8") == "onnx-int8"  # the variable picks fp32's backend only
    for bad in ("tensorflow", "onnx-int8"):
        monkeypatch.setenv("CASMOE_EMBEDDER", bad)
        with pytest.raises(PlannerError, match="CASMOE_EMBEDDER"):
            default_backend()


def test_int8_embeddings_stay_close_to_fp32_and_are_cached():
    """bench/bench_embedder.py: cosine 0.992 mean, 0.967 worst over the tiny traces' prompts; a
    planner's recall@k moves by at most 0.006 with them."""
    prompts = corpus_prompts(32)
    fp32 = embed(prompts, batch_size=16, backend="onnx")
    int8 = embed(prompts, batch_size=16, backend="onnx-int8")
    cos = (fp32 * int8).sum(axis=1)
    assert cos.min() >= 0.95 and cos.mean() >= 0.98, (cos.min(), cos.mean())
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    # it is a different model: were it the fp32 one, the test above would say nothing about speed
    assert cos.min() < 0.99999 and int8_export().stat().st_size < 0.7 * onnx_export().stat().st_size
    path = int8_export()  # built from the fp32 export on first use, beside it, then reused
    stamp = path.stat().st_mtime_ns
    assert path.parent == onnx_export().parent and int8_export() == path and path.stat().st_mtime_ns == stamp


def test_planner_config_records_the_embedding_precision():
    assert PlannerConfig().embedding == "int8"
    legacy = PlannerConfig().to_dict()
    del legacy["embedding"]  # a folder from before the field was fitted with fp32 vectors
    assert PlannerConfig.from_dict(legacy).embedding == "fp32"
    assert PlannerConfig.from_dict(PlannerConfig(embedding="fp32").to_dict()).embedding == "fp32"
    with pytest.raises(PlannerError, match="embedding"):
        PlannerConfig(embedding="int4")
