"""The recorder captures the routing the model applies, for every supported MoE class, and
an interrupted recording resumes where it stopped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from casmoe.backends import record as rec  # noqa: E402
from casmoe.backends.corpus import CorpusEntry  # noqa: E402
from casmoe.errors import CasmoeError  # noqa: E402
from casmoe.trace import NOT_COMPUTED, Trace  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=128)
CONFIGS = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=24, num_local_experts=6, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=16, num_experts=8, num_experts_per_tok=3)),
    # a dense layer in the middle: MoE layer j+1 is not decoder layer j+1
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=48, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=16, num_experts=6,
                                         num_experts_per_tok=2, mlp_only_layers=[1])),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=48, moe_intermediate_size=16, head_dim=16,
                                         num_experts=6, num_experts_per_tok=2, norm_topk_prob=True)),
}


def tiny_model(kind: str):
    cls_name, extra = CONFIGS[kind]
    torch.manual_seed(0)
    config = getattr(transformers, cls_name)(**COMMON, **extra)
    model_cls = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))
    model = model_cls(config).double().eval()  # float64: cached decode == full forward, no ties
    model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model


def reference_routing(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """topk ids, weights and logits from `output_router_logits` of one full forward."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    logits = torch.stack(list(out.router_logits), dim=1)  # [T, L, E]
    probs = torch.softmax(logits, dim=-1)
    k = model.config.num_experts_per_tok
    w, idx = torch.topk(probs, k, dim=-1)
    if model.config.model_type == "mixtral" or getattr(model.config, "norm_topk_prob", False):
        w = w / w.sum(dim=-1, keepdim=True)
    return idx.numpy(), w.numpy(), logits.numpy()


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_recorded_routing_equals_output_router_logits(kind: str) -> None:
    model = tiny_model(kind)
    prompts = [[5, 17, 33, 2, 60, 41, 7], [8, 1], [90, 4, 4, 12]]  # batched, left-padded
    with rec.RoutingRecorder(model, logits=True, spec=True) as recorder:
        results = rec.generate_and_record(model, recorder, prompts, max_new_tokens=5, pad_id=0)
    for prompt, (rows, generated) in zip(prompts, results):
        fed = prompt + generated[:-1]  # the last token is produced, never fed
        idx, w, logits = reference_routing(model, fed)
        k = model.config.num_experts_per_tok
        assert rows["topk"].shape == idx.shape == (len(fed), len(recorder.blocks), k)
        np.testing.assert_array_equal(rows["topk"], idx)
        np.testing.assert_allclose(rows["weights"], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rows["logits"], logits, rtol=1e-5, atol=1e-5)
        assert (rows["spec"][:, -1] == NOT_COMPUTED).all()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_spec_applies_next_router_to_this_layers_output(kind: str) -> None:
    model = tiny_model(kind)
    prompt = [3, 9, 27, 81, 50]
    with rec.RoutingRecorder(model, spec=True) as recorder:
        [(rows, _)] = rec.generate_and_record(model, recorder, [prompt], max_new_tokens=1)
        blocks = recorder.blocks
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    for j in range(len(blocks) - 1):
        nxt = blocks[j + 1]
        h = hidden[blocks[j].decoder_index + 1][0]  # output of MoE layer j's decoder layer
        norm = model.model.layers[nxt.decoder_index].post_attention_layernorm
        want = torch.topk(torch.softmax(nxt.gate.weight @ norm(h).T, dim=0).T, nxt.gate.top_k).indices
        np.testing.assert_array_equal(rows["spec"][:, j], want.numpy())


def _save_tiny(tmp_path: Path, kind: str = "olmoe") -> Path:
    from casmoe.backends.train import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat", "def f(x): return x + 1"] * 4, vocab_size=96)
    cls_name, extra = CONFIGS[kind]
    config = getattr(transformers, cls_name)(**{**COMMON, "vocab_size": len(tok)}, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(config)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_record_resumes_after_interruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save_tiny(tmp_path)
    prompts = [CorpusEntry(f"the cat sat {i} times", "t", "train" if i % 3 else "heldout") for i in range(7)]
    settings = rec.RecordSettings(max_new_tokens=4, spec=True)
    run = dict(checkpoint_every=2, batch_size=2, progress=False)
    full = rec.record(str(path), prompts, tmp_path / "full.npz", settings, **run)

    real = rec.generate_and_record
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(rec, "generate_and_record", flaky)
    out = tmp_path / "resumed.npz"
    with pytest.raises(KeyboardInterrupt):
        rec.record(str(path), prompts, out, settings, **run)
    assert not out.exists()
    assert len(Trace.load(rec.partial_path(out)).requests) == 4  # checkpoints at 2 and 4
    calls["n"] = 0
    resumed = rec.record(str(path), prompts, out, settings, **run)
    assert calls["n"] == 2  # only the batches not yet checkpointed: [4, 5] and [6]
    assert not rec.partial_path(out).exists()
    loaded = Trace.load(out)
    assert loaded.meta["splits"] == [p.split for p in prompts]
    assert [r.task for r in loaded.requests] == ["t"] * 7
    for a, b in zip(full.requests, resumed.requests):
        np.testing.assert_array_equal(a.topk, b.topk)
        np.testing.assert_array_equal(a.spec, b.spec)


def test_partial_from_other_settings_is_refused(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path)
    prompts = [CorpusEntry(f"the mat {i}", "t", "train") for i in range(3)]
    out = tmp_path / "t.npz"
    rec.record(str(path), prompts[:2], rec.partial_path(out), rec.RecordSettings(max_new_tokens=2),
               progress=False)
    with pytest.raises(CasmoeError, match="delete it"):
        rec.record(str(path), prompts, out, rec.RecordSettings(max_new_tokens=3), progress=False)


def test_bad_models_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CasmoeError, match="not a model directory"):
        rec.record(str(tmp_path), [CorpusEntry("x", "t", "train")], tmp_path / "t.npz", progress=False)
    dense = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2)
    transformers.LlamaForCausalLM(dense).save_pretrained(tmp_path / "llama")
    with pytest.raises(CasmoeError, match="not a supported MoE model"):
        rec.record(str(tmp_path / "llama"), [CorpusEntry("x", "t", "train")], tmp_path / "t.npz",
                   progress=False)


def test_cli_record_writes_a_trace(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from casmoe.cli import app

    path = _save_tiny(tmp_path, "mixtral")
    (tmp_path / "p.txt").write_text("the cat sat\ndef f(x): return x\n")
    out = tmp_path / "t.npz"
    result = CliRunner().invoke(app, ["record", "-m", str(path), "-p", str(tmp_path / "p.txt"),
                                      "-o", str(out), "-n", "3", "--fp16-weights", "--logits"])
    assert result.exit_code == 0, result.output
    trace = Trace.load(out)
    assert len(trace.requests) == 2 and trace.geometry.layers == COMMON["num_hidden_layers"]
    r = trace.requests[0]
    assert r.decode_tokens == 2 and r.logits is not None and r.spec is not None
    assert np.array_equal(r.weights, r.weights.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name, shape", [("tiny-mixtral", (32, 8, 2)), ("tiny-olmoe", (16, 64, 8))])
def test_shipped_traces_and_models(name: str, shape: tuple[int, int, int]) -> None:
    from casmoe.backends.models import load_config
    from casmoe.shipped import data_dir

    config = load_config(name)  # the shipped model is found by name and is a supported class
    assert config.num_hidden_layers == shape[0]
    trace = Trace.load(data_dir() / f"{name}.npz")
    g = trace.geometry
    assert (g.layers, g.experts, g.top_k) == shape
    assert len(trace.requests) >= 500 and trace.has_prompts
    assert len({r.task for r in trace.requests}) >= 6
    assert set(trace.meta["splits"]) == {"train", "heldout"}
    assert all(r.spec is not None and (r.spec[:, -1] == NOT_COMPUTED).all() for r in trace.requests)
    assert all(r.decode_tokens == trace.meta["max_new_tokens"] - 1 for r in trace.requests)
