"""`casmoe bench`, `casmoe calibrate`, `casmoe validate` end to end on a tiny saved model."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from backend_models import one_thread, tiny  # noqa: E402,F401  (one_thread: autouse)
from typer.testing import CliRunner  # noqa: E402

from casmoe.cli import app  # noqa: E402

TEXTS = ["the cat sat on the mat", "def add(a, b): return a + b", "what is 12 plus 30?", "to be or not to be"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random-init tiny Mixtral saved with a byte-level BPE tokenizer, plus a prompt file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = tiny("mixtral", layers=2)
    model.resize_token_embeddings(tok.get_vocab_size())
    model.save_pretrained(root / "m")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(root / "m")
    (root / "prompts.txt").write_text("\n".join(TEXTS))
    return root


def _run(args):
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout


def test_bench_json_reports_throughput_and_hit_rate(model_dir):
    code, out = _run(["bench", "--model", str(model_dir / "m"), "--policy", "lru", "--capacity", "3", "--prompts",
                      str(model_dir / "prompts.txt"), "--max-new-tokens", "4", "--json"])
    assert code == 0, out
    rec = json.loads(out)
    assert rec["generated_tokens"] == 4 * len(TEXTS)
    assert rec["tokens_per_s"] > 0 and rec["ttft_s"] > 0 and rec["stall_s"] >= 0
    assert 0 <= rec["cache_hit_rate"] <= 1 and rec["cache_loads"] > 0


def test_bench_substitute_reports_perplexities(model_dir):
    code, out = _run(["bench", "--model", str(model_dir / "m"), "--capacity", "2", "--miss-mode", "substitute",
                      "--prompts", str(model_dir / "prompts.txt"), "--max-new-tokens", "3", "--ppl-texts", "4",
                      "--json"])
    assert code == 0, out
    rec = json.loads(out)
    assert rec["perplexity"] > 1 and rec["reference_perplexity"] > 1
    assert rec["cache_substitutions"] > 0


def test_calibrate_writes_a_profile_the_simulator_loads(model_dir, tmp_path):
    from casmoe.sim.hardware import load_profile

    out = tmp_path / "me.toml"
    code, text = _run(["calibrate", "--model", str(model_dir / "m"), "--out", str(out), "--prompts",
                       str(model_dir / "prompts.txt"), "--max-new-tokens", "4", "--link-gbps", "0.05"])
    assert code == 0, text
    prof = load_profile(out)
    assert prof.h2d_pinned_gbs > 0 and prof.dense_tflops > 0
    assert prof.h2d_pinned_gbs < 0.06  # the emulated link, measured through the copier


def test_validate_json_gives_a_median_error_per_policy(model_dir):
    code, out = _run(["validate", "--model", str(model_dir / "m"), "--prompts", str(model_dir / "prompts.txt"),
                      "--max-new-tokens", "4", "--policy", "lru", "--policy", "ondemand", "--json"])
    assert code == 0, out
    recs = json.loads(out)
    assert [r["policy"] for r in recs] == ["lru", "ondemand"]
    assert all(r["median_error"] >= 0 and r["backend_median"] > 0 and r["sim_median"] > 0 for r in recs)


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/dir/model"], "cannot load a model config"),  # a path: no hub lookup
    (["--capacity", "1"], "below the 2 experts"),
])
def test_bench_bad_input_is_one_line(model_dir, args, message):
    base = ["bench", "--model", str(model_dir / "m"), "--prompts", str(model_dir / "prompts.txt")]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code != 0
    assert message in str(result.exception) or message in result.output


def test_bench_refuses_a_dense_model(tmp_path, model_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    dense.save_pretrained(tmp_path / "dense")
    (tmp_path / "dense").joinpath("tokenizer.json").write_bytes((model_dir / "m" / "tokenizer.json").read_bytes())
    (tmp_path / "dense").joinpath("tokenizer_config.json").write_bytes(
        (model_dir / "m" / "tokenizer_config.json").read_bytes())
    result = CliRunner().invoke(app, ["bench", "--model", str(tmp_path / "dense")])
    assert result.exit_code != 0
    assert "not a supported MoE model" in str(result.exception)
