"""The recorder captures the routing the model applies, for every supported MoE class; teacher
forcing routes exactly as decoding the same tokens step by step; sampling is seeded per request
and every mode stops at end-of-text; an interrupted recording resumes where it stopped, and only
under the settings it started with."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from casmoe.backends import record as rec  # noqa: E402
from casmoe.backends.corpus import CorpusEntry  # noqa: E402
from casmoe.backends.generate import forced  # noqa: E402
from casmoe.errors import CasmoeError  # noqa: E402
from casmoe.trace import NOT_COMPUTED  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

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
    prompts = [[5, 17, 33, 2, 60, 41, 7], [8, 1], [90, 4, 4, 12]]  # decoded together
    with rec.RoutingRecorder(model, logits=True, spec=True) as recorder:
        results = rec.generate_and_record(model, recorder, prompts, max_new_tokens=5)
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
    special = dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    config = getattr(transformers, cls_name)(**{**COMMON, "vocab_size": len(tok)}, **special, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(config)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path



def test_recording_and_serving_capture_routing_through_the_same_hooks() -> None:
    """One set of router hooks (`forward_pass.RouterHooks`): a recording and an offloaded run of
    the same prompt, greedy, route alike token for token; a router call outside an open pass, or
    paused (a speculative guess), leaves nothing in it."""
    from support.backend_models import tiny

    from casmoe.backends.experts import find_moe_blocks
    from casmoe.backends.forward_pass import ForwardPass, RouterHooks
    from casmoe.backends.runtime import OffloadedModel, Prompt
    from casmoe.policies import get_policy

    prompt = [5, 17, 33, 2, 60, 41, 7]
    model = tiny("mixtral", layers=3)
    with rec.RoutingRecorder(model) as recorder:
        [(rows, generated)] = rec.generate_and_record(model, recorder, [prompt], max_new_tokens=5)
    run = OffloadedModel(tiny("mixtral", layers=3)).run([Prompt(prompt)], get_policy("lru"), 2, max_new_tokens=5)
    [served] = run.trace.requests
    assert run.requests[0].new_tokens == generated
    np.testing.assert_array_equal(served.topk, rows["topk"])
    np.testing.assert_array_equal(served.weights, rows["weights"])

    blocks = find_moe_blocks(model)
    hooks = RouterHooks(model, blocks)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        model(input_ids=ids)  # no pass open
        p = hooks.open(ForwardPass(len(blocks)))
        with hooks.paused():
            model(input_ids=ids)
        assert p.router_calls == 0 and p.topk == [None] * len(blocks)
        model(input_ids=ids)
    hooks.remove()
    assert hooks.close() is p and p.router_calls == len(blocks)
    np.testing.assert_array_equal(p.routing()[0], rows["topk"][: len(prompt)])


@pytest.mark.parametrize("kind", ["mixtral", "olmoe", "qwen2_moe"])
def test_teacher_pass_equals_step_by_step_decoding(kind: str) -> None:
    model = tiny_model(kind)
    rng = np.random.default_rng(1)
    prompts = [[5, 17, 33, 2, 60, 41, 7], [8, 1], [90, 4, 4, 12]]
    outputs = [rng.integers(1, 96, n).tolist() for n in (6, 1, 4)]  # ragged, as real continuations
    with rec.RoutingRecorder(model, logits=True, spec=True) as recorder:
        teacher = rec.teacher_record(model, recorder, prompts, outputs)  # one batched pass
        for prompt, output, (rows, ids) in zip(prompts, outputs, teacher):
            [(steps, fed)] = rec.generate_and_record(model, recorder, [prompt], len(output),
                                                     pick=forced([output]))
            assert ids == fed == output
            assert rows["topk"].shape[0] == len(prompt) + len(output) - 1
            for name in ("topk", "spec"):
                np.testing.assert_array_equal(rows[name], steps[name], err_msg=name)
            for name in ("weights", "logits"):
                np.testing.assert_allclose(rows[name], steps[name], rtol=1e-9, atol=1e-10, err_msg=name)


def test_end_of_text_stops_only_its_request() -> None:
    model = tiny_model("mixtral")
    prompts = [[5, 17, 33, 2], [8, 1], [90, 4, 4, 12, 3]]
    with rec.RoutingRecorder(model) as recorder:
        free = rec.generate_and_record(model, recorder, prompts, max_new_tokens=8)
        eos = free[0][1][2]  # the third token request 0 produces
        stopped = rec.generate_and_record(model, recorder, prompts, max_new_tokens=8, eos_ids=[eos])
    for prompt, (rows, gen), (free_rows, free_gen) in zip(prompts, stopped, free):
        end = free_gen.index(eos) + 1 if eos in free_gen else len(free_gen)
        assert gen == free_gen[:end]  # a request stops right after end-of-text, others run on
        assert rows["topk"].shape[0] == len(prompt) + len(gen) - 1
        np.testing.assert_array_equal(rows["topk"], free_rows["topk"][: len(prompt) + len(gen) - 1])
    assert len(stopped[0][1]) <= 3 and stopped[0][1][-1] == eos


@pytest.mark.slow  # five generations with the tiny OLMoE: 10-30 s; the sampler's own rules stay fast below
def test_sampling_is_seeded_per_request_not_per_batch() -> None:
    model = tiny_model("olmoe")
    prompts = [[5, 17, 33, 2], [8, 1], [90, 4, 4, 12, 3]]
    settings = rec.RecordSettings(decode=rec.DecodeMode.SAMPLE, temperature=1.5, top_p=0.95, seed=3)
    with rec.RoutingRecorder(model) as recorder:
        def run(s: rec.RecordSettings, batch: list[int]) -> list[list[int]]:
            out = rec.generate_and_record(model, recorder, [prompts[i] for i in batch], 12,
                                          pick=rec.Sampler(s, batch))
            return [gen for _, gen in out]

        together = run(settings, [0, 1, 2])
        alone = [run(settings, [i])[0] for i in range(3)]
        again = run(settings, [0, 1, 2])
        other = run(rec.RecordSettings(decode=rec.DecodeMode.SAMPLE, temperature=1.5, top_p=0.95,
                                       seed=4), [0, 1, 2])
        greedy = [gen for _, gen in rec.generate_and_record(model, recorder, prompts, 12)]
    assert together == alone == again
    assert other != together and greedy != together


def test_sampler_keeps_the_top_k_and_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = lambda **kw: {int(rec.Sampler(rec.RecordSettings(seed=s, **kw), [0])(logits, (0,), 0)[0])  # noqa: E731
                          for s in range(200)}
    assert draws(top_p=1.0) == {0, 1, 2, 3}
    assert draws(top_p=0.75) == {0, 1}  # 0.5 + 0.3 reaches 0.75: the head stops there
    assert draws(top_p=0.5) == {0}
    assert draws(top_p=0.85) == {0, 1, 2}
    assert draws(top_p=1.0, top_k=1) == {0}
    assert draws(top_p=1.0, temperature=0.05) == {0}


def test_record_resumes_after_interruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save_tiny(tmp_path)
    prompts = [CorpusEntry(f"the cat sat {i} times", "t", "train" if i % 3 else "heldout") for i in range(7)]
    settings = rec.RecordSettings(max_new_tokens=4, decode=rec.DecodeMode.SAMPLE, spec=True, batch=2)
    run = dict(checkpoint_every=2, progress=False)
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
    assert len(load_trace(rec.partial_path(out)).requests) == 4  # checkpoints at 2 and 4
    calls["n"] = 0
    resumed = rec.record(str(path), prompts, out, settings, **run)
    assert calls["n"] == 2  # only the batches not yet checkpointed: [4, 5] and [6]
    assert not rec.partial_path(out).exists()
    loaded = load_trace(out)
    assert loaded.meta["splits"] == [p.split for p in prompts]
    assert [r.task for r in loaded.requests] == ["t"] * 7
    for a, b in zip(full.requests, resumed.requests):  # sampled, the same: seeded per request
        np.testing.assert_array_equal(a.topk, b.topk)
        np.testing.assert_array_equal(a.spec, b.spec)
        np.testing.assert_array_equal(a.output_ids, b.output_ids)
        assert a.output == b.output


@pytest.mark.parametrize("change, named", [
    (dict(max_new_tokens=3), "--max-new-tokens 2 (now 3)"),
    (dict(batch=1), "--batch 8 (now 1)"),
    (dict(max_prompt_tokens=2), "--max-prompt-tokens 256 (now 2)"),
    (dict(seed=1), "--seed 0 (now 1)"),
    (dict(top_p=0.5), "--top-p 0.9 (now 0.5)"),
    (dict(decode=rec.DecodeMode.GREEDY), "--decode sample (now greedy)"),
    (dict(dtype="float64"), "--dtype float32 (now float64)"),
    (dict(fp16_weights=True), "--fp16-weights False (now True)"),
])
def test_partial_from_other_settings_is_refused(tmp_path: Path, change: dict, named: str) -> None:
    path = _save_tiny(tmp_path)
    prompts = [CorpusEntry(f"the mat {i}", "t", "train") for i in range(3)]
    out = tmp_path / "t.npz"
    first = rec.RecordSettings(max_new_tokens=2, decode=rec.DecodeMode.SAMPLE)
    rec.record(str(path), prompts, rec.partial_path(out), first, progress=False)  # as if interrupted
    with pytest.raises(CasmoeError, match="delete it") as err:
        rec.record(str(path), prompts, out, replace(first, **change), progress=False)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_greedy_resume_ignores_sampling_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save_tiny(tmp_path)
    prompts = [CorpusEntry(f"the mat {i}", "t", "train") for i in range(3)]
    out = tmp_path / "t.npz"
    greedy = rec.RecordSettings(max_new_tokens=2, decode=rec.DecodeMode.GREEDY)
    done = rec.record(str(path), prompts, rec.partial_path(out), greedy, progress=False)
    monkeypatch.setattr(rec, "generate_and_record", None)  # everything must come from the partial
    trace = rec.record(str(path), prompts, out, replace(greedy, seed=7, top_p=0.2), progress=False)
    assert [r.output for r in trace.requests] == [r.output for r in done.requests]


def test_cli_refuses_a_changed_resume_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = _save_tiny(tmp_path)
    (tmp_path / "p.txt").write_text("the cat sat\ndef f(x): return x\n")
    out = tmp_path / "t.npz"
    rec.record(str(path), [CorpusEntry("the cat sat", "text", "train")], rec.partial_path(out),
               rec.RecordSettings(max_new_tokens=2, max_prompt_tokens=3, decode=rec.DecodeMode.SAMPLE),
               progress=False)
    run = subprocess.run([sys.executable, "-m", "casmoe", "record", "-m", str(path), "-p",
                          str(tmp_path / "p.txt"), "-o", str(out), "-n", "2", "--decode", "sample"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.startswith("casmoe: error:") and run.stderr.count("\n") == 1, run.stderr
    assert "--max-prompt-tokens 3 (now 256)" in run.stderr  # and refused before the model loads


def test_bad_models_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CasmoeError, match="not a model directory"):
        rec.record(str(tmp_path), [CorpusEntry("x", "t", "train", " y")], tmp_path / "t.npz", progress=False)
    dense = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2)
    transformers.LlamaForCausalLM(dense).save_pretrained(tmp_path / "llama")
    with pytest.raises(CasmoeError, match="not a supported MoE model"):
        rec.record(str(tmp_path / "llama"), [CorpusEntry("x", "t", "train", " y")], tmp_path / "t.npz",
                   progress=False)


def test_cli_record_writes_a_trace(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from casmoe.cli import app

    path = _save_tiny(tmp_path, "mixtral")
    (tmp_path / "p.txt").write_text("the cat sat\ndef f(x): return x\n")
    out = tmp_path / "t.npz"
    result = CliRunner().invoke(app, ["record", "-m", str(path), "-p", str(tmp_path / "p.txt"),
                                      "-o", str(out), "-n", "3", "--fp16-weights", "--logits", "--decode", "sample"])
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    assert len(trace.requests) == 2 and trace.geometry.layers == COMMON["num_hidden_layers"]
    r = trace.requests[0]
    assert r.decode_tokens == len(r.output_ids) - 1 <= 2 and r.logits is not None and r.spec is not None
    assert np.array_equal(r.weights, r.weights.astype(np.float16).astype(np.float32))
    assert trace.meta["decode"] == "sample" and trace.meta["dtype"] == "float32"  # the checkpoint's

    shown = CliRunner().invoke(app, ["trace", "show", str(out), "--text", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["requests"]
    assert [row["output"] for row in rows] == [r.output for r in trace.requests]
    assert [row["prompt"] for row in rows] == ["the cat sat", "def f(x): return x"]
    text = CliRunner().invoke(app, ["trace", "show", str(out), "--text", "-r", "1"]).output
    assert "#1" in text and "#0" not in text and repr(trace.requests[1].output) in text
    assert "distinct-4-gram ratio" in text


def test_cli_teacher_mode_outputs_the_continuation(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from casmoe.backends.corpus import save_corpus
    from casmoe.cli import app

    path = _save_tiny(tmp_path, "mixtral")
    save_corpus([CorpusEntry("the cat", "t", "train", " sat on the mat"), CorpusEntry("def f(x):", "c", "heldout", " return x + 1")],
                tmp_path / "c.jsonl")
    out = tmp_path / "t.npz"
    result = CliRunner().invoke(app, ["record", "-m", str(path), "-p", str(tmp_path / "c.jsonl"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    assert [r.output for r in trace.requests] == [" sat on the mat<|endoftext|>", " return x + 1<|endoftext|>"]
    assert trace.meta["decode"] == "teacher"  # the default
    assert trace.meta["splits"] == ["train", "heldout"] and "seed" not in trace.meta
    plain = tmp_path / "p.txt"
    plain.write_text("the cat\n")
    with pytest.raises(CasmoeError, match="needs continuation text.*--decode sample"):
        CliRunner().invoke(app, ["record", "-m", str(path), "-p", str(plain), "-o", str(out)], catch_exceptions=False)


@pytest.mark.parametrize("name, shape", [("tiny-mixtral", (32, 8, 2)), ("tiny-olmoe", (16, 64, 8))])
def test_shipped_traces_and_models(name: str, shape: tuple[int, int, int]) -> None:
    from casmoe.backends.corpus import load_corpus
    from casmoe.backends.models import load_config
    from casmoe.metrics.diversity import distinct_ngram_ratio
    from casmoe.shipped import data_dir

    config = load_config(name)  # the shipped model is found by name and is a supported class
    assert config.num_hidden_layers == shape[0]
    path = data_dir() / f"{name}.npz"
    trace = load_trace(path)
    g = trace.geometry
    assert (g.layers, g.experts, g.top_k) == shape
    assert len(trace.requests) >= 600 and trace.has_prompts
    assert {r.task for r in trace.requests} == {p.task for p in load_corpus()}  # every corpus task
    assert set(trace.meta["splits"]) == {"train", "heldout"} and len(trace.meta["splits"]) == len(trace.requests)
    assert trace.meta["decode"] == "teacher"
    assert all(r.spec is not None and (r.spec[:, -1] == NOT_COMPUTED).all() for r in trace.requests)
    assert all(r.decode_tokens == len(r.output_ids) - 1 for r in trace.requests)  # the last token is never fed
    assert all(r.output_ids[-1] == config.eos_token_id for r in trace.requests if len(r.output_ids) < 64)
    assert distinct_ngram_ratio([r.output_ids for r in trace.requests], 4) >= 0.8
    both = sum((data_dir() / f"{n}.npz").stat().st_size for n in ("tiny-mixtral", "tiny-olmoe"))
    assert both <= 30e6
