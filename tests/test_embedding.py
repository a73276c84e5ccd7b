"""Prompt embeddings: the onnxruntime backend equals the torch reference (cosine >= 0.99999)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from casmoe.planner.config import PlannerError
from casmoe.planner.embedding import default_backend, embed, onnx_export
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
    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path))
    path = onnx_export()
    assert path.parent == tmp_path and path.stat().st_size > 80 * 2**20
    stamp = path.stat().st_mtime_ns
    assert onnx_export() == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("CASMOE_EMBEDDER", raising=False)
    assert default_backend() == "onnx"  # installed here (importorskip above)
    monkeypatch.setenv("CASMOE_EMBEDDER", "torch")
    assert default_backend() == "torch"
    monkeypatch.setenv("CASMOE_EMBEDDER", "tensorflow")
    with pytest.raises(PlannerError, match="CASMOE_EMBEDDER"):
        default_backend()
