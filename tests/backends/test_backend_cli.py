"""`casmoe bench`, `casmoe calibrate`, `casmoe validate` end to end on a tiny saved model."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import one_thread, tiny  # noqa: E402,F401  (one_thread: autouse)
from typer.testing import CliRunner  # noqa: E402

from casmoe.backends.validate import NOISE_LIMIT, baseline_spread, relative_error  # noqa: E402
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
    assert rec["tokens_per_s"] == pytest.approx(rec["generated_tokens"] / rec["wall_s"])
    assert 0 < rec["ttft_s"] < rec["wall_s"] and 0 <= rec["stall_s"] < rec["wall_s"]
    hits = rec["cache_hits"] + rec["cache_late_hits"]
    assert rec["cache_hit_rate"] == pytest.approx(hits / rec["cache_accesses"])
    assert rec["cache_loads"] == rec["cache_demand_loads"] + rec["cache_prefetch_loads"] > 0
    assert rec["cache_misses"] == rec["cache_demand_loads"]  # lru in load mode: every miss loads


def test_bench_substitute_reports_perplexities(model_dir):
    code, out = _run(["bench", "--model", str(model_dir / "m"), "--capacity", "2", "--miss-mode", "substitute",
                      "--prompts", str(model_dir / "prompts.txt"), "--max-new-tokens", "3", "--ppl-texts", "4",
                      "--json"])
    assert code == 0, out
    rec = json.loads(out)
    assert rec["perplexity"] > 1 and rec["reference_perplexity"] > 1
    assert rec["cache_substitutions"] > 0


def test_calibrate_writes_a_profile_the_simulator_loads(model_dir, tmp_path):
    from casmoe.sim.box.hardware import load_profile

    out = tmp_path / "me.toml"
    code, text = _run(["calibrate", "backend", "--model", str(model_dir / "m"), "--out", str(out), "--prompts",
                       str(model_dir / "prompts.txt"), "--max-new-tokens", "4", "--link-gbps", "0.05"])
    assert code == 0, text
    prof = load_profile(out)
    assert prof.dense_tflops > 0
    # the emulated 0.05 GB/s link, measured through the copier: never faster than the cap; slower
    # by as much as the host is busy, so the lower bound only says it measured this link at all
    assert 0.005 < prof.h2d_pinned_gbs < 0.06
    code, text = _run(["calibrate", "backend", "--model", str(model_dir / "m"), "--out", str(tmp_path / "again.toml"), "--prompts",
                       str(model_dir / "prompts.txt"), "--max-new-tokens", "3", "--json"])
    cal = json.loads(text)
    expert_bytes = 3 * 32 * 48 * 4  # tiny mixtral, float32: the profile prices a host expert at the measured time
    assert cal["host_expert_s"] > 0
    assert expert_bytes / (load_profile(tmp_path / "again.toml").cpu_mem_bw_gbs * 1e9) == pytest.approx(
        cal["host_expert_s"], rel=1e-6)


def test_validate_json_gives_a_median_error_per_policy(model_dir):
    code, out = _run(["validate", "backend", "--model", str(model_dir / "m"), "--prompts", str(model_dir / "prompts.txt"),
                      "--max-new-tokens", "4", "--policy", "lru", "--policy", "ondemand", "--miss-mode", "load",
                      "--miss-mode", "cpu", "--json"])
    assert code == 0, out
    recs = json.loads(out)
    assert [(r["policy"], r["miss_mode"]) for r in recs] == [("lru", "load"), ("lru", "cpu"), ("ondemand", "load"),
                                                            ("ondemand", "cpu")]
    for r in recs:  # the simulator replays the run's own decisions: same hit rate; time splits into stall + compute
        assert r["median_error"] == pytest.approx(abs(r["sim_median"] - r["backend_median"]) / r["backend_median"])
        assert r["mean_error"] == pytest.approx(abs(r["sim_mean"] - r["backend_mean"]) / r["backend_mean"])
        assert r["token_error"] >= 0 and r["backend_mean"] > 0 and r["sim_mean"] > 0
        assert r["sim_hit_rate"] == pytest.approx(r["hit_rate"]) and r["wake"] >= 0 and r["ttft_error"] >= 0
        assert r["backend_compute"] > 0 and r["sim_compute"] > 0 and r["calibrated_load_issue"] > 0
        assert r["noise_floor"] == max(r["repeat_error"], r["baseline_spread"]) and r["baseline_spread"] >= 0
        assert r["too_noisy"] == (r["noise_floor"] > NOISE_LIMIT)
    by = {(r["policy"], r["miss_mode"]): r for r in recs}
    assert by["ondemand", "load"]["hit_rate"] == 0.0 < by["lru", "load"]["hit_rate"]  # ondemand keeps nothing
    assert by["ondemand", "load"]["sim_stall"] > 0 and by["ondemand", "cpu"]["sim_stall"] == 0  # cpu mode never waits
    # lru in the cpu mode never loads either: the same work as on-demand's, simulated on the same machine
    assert by["lru", "cpu"]["hit_rate"] == 0.0
    assert len({r["repeat_error"] for r in recs}) == 1 and recs[0]["repeat_error"] >= 0  # lru load, run twice
    # ... except for the policies' own decisions, which the simulator charges per layer visit
    layers = 2
    lru_cpu, od_cpu = by["lru", "cpu"], by["ondemand", "cpu"]
    assert lru_cpu["sim_median_pooled"] - od_cpu["sim_median_pooled"] == pytest.approx(
        layers * (lru_cpu["decide_visit"] - od_cpu["decide_visit"]), abs=1e-9)
    for r in recs:  # the decisions as the backend timed them and as a replay of its routing timed them
        assert r["backend_decide"] > 0 and r["sim_decide"] > 0 and r["decide_visit"] >= 0 and r["decide_load"] >= 0


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/dir/model"], "unknown model"),  # a path: the local cache only, no hub lookup
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


def _bench_json(model_dir, *args):
    code, out = _run(["bench", "--model", str(model_dir / "m"), "--prompts", str(model_dir / "prompts.txt"),
                      "--max-new-tokens", "3", "--json", *args])
    assert code == 0, out
    return json.loads(out)


def test_bench_verify_proves_an_exact_run_and_catches_a_lossy_one(model_dir):
    """--verify reruns the un-offloaded model: 0.0 and full agreement in load mode (also when
    prefills stream through 2 slots, through a small RAM tier, two requests at a time); a
    non-zero delta when substitute mode computes other experts."""
    rec = _bench_json(model_dir, "--capacity", "2", "--host-cache", "5", "--batch", "2", "--verify")
    assert rec["verify_max_abs_delta"] == 0.0 and rec["verify_token_agreement"] == 1.0
    assert len(rec["verify"]) == len(TEXTS) and rec["ram_accesses"] == rec["cache_loads"] and rec["ram_misses"] > 0
    assert rec["batch"] == 2 and rec["dtype"] == "float32"
    lossy = _bench_json(model_dir, "--capacity", "2", "--miss-mode", "substitute", "--verify", "--ppl-texts", "2")
    assert lossy["cache_substitutions"] > 0 and lossy["verify_max_abs_delta"] > 0


def test_bench_and_calibrate_run_in_the_checkpoint_dtype(model_dir, tmp_path):
    import transformers

    half = tmp_path / "half"
    transformers.AutoModelForCausalLM.from_pretrained(model_dir / "m").to(torch.bfloat16).save_pretrained(half)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (half / name).write_bytes((model_dir / "m" / name).read_bytes())
    code, out = _run(["bench", "--model", str(half), "--prompts", str(model_dir / "prompts.txt"), "--max-new-tokens",
                      "2", "--json"])
    assert code == 0, out
    assert json.loads(out)["dtype"] == "bfloat16"
    code, out = _run(["bench", "--model", str(half), "--prompts", str(model_dir / "prompts.txt"), "--max-new-tokens",
                      "2", "--dtype", "float32", "--json"])
    assert json.loads(out)["dtype"] == "float32"


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda:3"], "--device cuda:3: torch sees"),
    (["--host-cache", "100TB"], "exceeds the"),
    (["--capacity", "100TB"], "lower --capacity"),
    (["--host-cache", "1"], "fewer than the 2"),
    (["--dtype", "int8"], "--dtype must be one of"),
])
def test_settings_that_cannot_fit_fail_before_any_weight_loads(model_dir, monkeypatch, args, message):
    import casmoe.backends.checkpoint as checkpoint

    def never(*a, **k):
        raise AssertionError("weights were read")

    monkeypatch.setattr(checkpoint, "load_dense", never)
    result = CliRunner().invoke(app, ["bench", "--model", str(model_dir / "m"), *args])
    assert result.exit_code != 0
    assert message in str(result.exception), result.exception


def test_validate_above_its_noise_floor_says_so_in_one_line(model_dir, monkeypatch, capsys):
    """A machine whose own latency moves more than the limit judges nothing: one line, no table."""
    import casmoe.backends.validate as validate
    from casmoe.cli import main

    monkeypatch.setattr(validate, "NOISE_LIMIT", -1.0)  # any spread at all is too much
    monkeypatch.setattr(sys, "argv", ["casmoe", "validate", "backend", "--model", str(model_dir / "m"), "--prompts",
                                      str(model_dir / "prompts.txt"), "--num-prompts", "2", "--max-new-tokens", "3",
                                      "--policy", "lru"])
    with pytest.raises(SystemExit) as done:
        main()
    out = capsys.readouterr().out.strip().splitlines()
    assert done.value.code == 0 and out[-1].startswith("too noisy to judge the simulator") and "error" not in out[-1]


def test_baseline_spread_is_the_median_step_between_neighbours():
    # two rounds of three identical baseline requests: steps 10%, 0% and 50%, 0% apart
    assert baseline_spread([1.0, 1.1, 1.1, 2.0, 3.0, 3.0], 3) == pytest.approx(np.median([0.1, 0.0, 0.5, 0.0]))
    assert baseline_spread([1.0], 1) == 0.0
    assert relative_error(1.05, 1.0) == pytest.approx(0.05)
