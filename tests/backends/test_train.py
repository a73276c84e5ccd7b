"""Tiny-model training: the tokenizer and a few optimiser steps on the shipped corpus."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from casmoe.backends.corpus import TRAIN, load_corpus  # noqa: E402
from casmoe.backends.train import (  # noqa: E402
    TINY_MODELS, TrainSettings, fit, mean_loss, model_config, pack, train_tokenizer)
from casmoe.errors import CasmoeError  # noqa: E402


def test_tokenizer_round_trips_text() -> None:
    texts = [p.text for p in load_corpus(split=TRAIN)[::20]]
    tok = train_tokenizer(texts, vocab_size=512)
    assert len(tok) <= 512
    sample = "def f(x):\n    return x * 2  # émigré"
    assert tok.decode(tok(sample)["input_ids"]) == sample  # byte level: nothing is unknown


@pytest.mark.slow  # training: about 15 s of CPU
def test_tiny_training_reduces_loss() -> None:
    torch.manual_seed(0)
    prompts = load_corpus(split=TRAIN, task="arithmetic")[:200]
    tok = train_tokenizer([p.text for p in prompts], vocab_size=300)
    rows = pack(tok, prompts, seq_len=32)
    config = transformers.MixtralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
        output_router_logits=True, router_aux_loss_coef=0.02)
    model = transformers.MixtralForCausalLM(config)
    before = mean_loss(model, rows[:16])
    losses = fit(model, rows, TrainSettings(steps=20, batch=8, seq_len=32, lr=1e-2, warmup=4),
                 np.random.default_rng(0))
    after = mean_loss(model, rows[:16])
    assert len(losses) == 20
    assert after < before - 1.0  # well below the random-init loss (about ln(vocab))


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tiny_configs_have_the_target_routing_shape(name: str) -> None:
    config = model_config(name)
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    shape = (config.num_hidden_layers, experts, config.num_experts_per_tok)
    assert shape == {"tiny-mixtral": (32, 8, 2), "tiny-olmoe": (16, 64, 8)}[name]
    assert config.output_router_logits and config.router_aux_loss_coef > 0  # load balancing on
    with pytest.raises(CasmoeError):
        model_config("tiny-gpt")


def test_layer_balance_loss_sees_each_layers_imbalance() -> None:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from casmoe.backends.train import layer_balance_loss

    E, k, N = 4, 2, 64
    uniform = torch.zeros(N, E)  # equal logits: ties, P_i = 1/E
    assert float(layer_balance_loss((uniform,), k)) == pytest.approx(k)
    hot = [torch.full((N, E), -4.0) for _ in range(2)]  # layer 0 always picks experts 0, 1
    hot[0][:, :2] = 4.0
    hot[1][:, 2:] = 4.0  # layer 1 always 2, 3: pooled over layers that looks balanced
    pooled = float(load_balancing_loss_func(tuple(hot), E, k))
    ours = float(layer_balance_loss(tuple(hot), k))
    assert pooled == pytest.approx(k, abs=0.01)
    assert ours == pytest.approx(E, rel=0.01)  # per layer: f = 1 and P ~ 1/2 on two experts


def test_sequence_wise_balance_sees_topic_routing() -> None:
    from casmoe.backends.train import layer_balance_loss

    E, k, T = 4, 2, 32
    z = torch.full((2 * T, E), -4.0)  # two sequences, each routed wholly to its own expert pair
    z[:T, :2] = 4.0
    z[T:, 2:] = 4.0
    assert float(layer_balance_loss((z,), k, sequences=1)) == pytest.approx(k, abs=0.01)
    assert float(layer_balance_loss((z,), k, sequences=2)) == pytest.approx(E, rel=0.01)


def test_global_balance_counts_loads_over_the_window_not_the_batch() -> None:
    """A batch routed wholly to experts 0, 1 pays E under batch balance; counted with loads of
    a global batch that spread evenly it pays k, and with loads that agree with it (a globally
    hot pair) it pays E again."""
    from casmoe.backends.train import expert_counts, layer_balance_loss

    E, k, T = 4, 2, 32
    z = torch.full((T, E), -4.0)
    z[:, :2] = 4.0
    assert float(layer_balance_loss((z,), k)) == pytest.approx(E, rel=0.01)
    even = torch.full((1, E), k / E)
    assert float(layer_balance_loss((z,), k, loads=even)) == pytest.approx(k, rel=0.01)
    hot = k * expert_counts((z,), k) / (k * T)  # this batch's own loads: [1, E], summing to k
    assert hot.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert float(layer_balance_loss((z,), k, loads=hot)) == pytest.approx(E, rel=0.01)


def test_global_balance_trains() -> None:
    from casmoe.backends.train import Balance

    torch.manual_seed(0)
    prompts = load_corpus(split=TRAIN, task="arithmetic")[:60]
    tok = train_tokenizer([p.text for p in prompts], vocab_size=300)
    rows = pack(tok, prompts, seq_len=32)
    config = transformers.OlmoeConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        output_router_logits=True, router_aux_loss_coef=0.0)
    settings = TrainSettings(steps=6, batch=4, seq_len=32, lr=1e-2, warmup=2, balance=Balance.GLOBAL,
                             balance_window=3, balance_coef=0.05)
    losses = fit(transformers.OlmoeForCausalLM(config), rows, settings, np.random.default_rng(0))
    assert len(losses) == 6 and all(np.isfinite(losses))


def test_routing_drift_is_the_moved_probability_mass_within_a_text() -> None:
    """Closed forms: a row routed the same way throughout drifts 0; a row alternating between
    two disjoint one-hot routings drifts 1 per pair; a pair whose earlier token is EOS (a new
    text in the packed stream) is not counted."""
    from casmoe.backends.train import EOS_ID, routing_drift_loss

    E, T = 4, 6
    rows = torch.full((1, T), 7)
    steady = torch.zeros(T, E)
    steady[:, 1] = 30.0
    assert float(routing_drift_loss((steady,), rows)) == pytest.approx(0.0, abs=1e-6)
    flip = torch.zeros(T, E)
    flip[0::2, 0] = 30.0
    flip[1::2, 2] = 30.0
    assert float(routing_drift_loss((flip, steady), rows)) == pytest.approx(0.5, abs=1e-6)  # layer mean
    ends = rows.clone()
    ends[0, [0, 2, 4]] = EOS_ID  # pairs (0,1), (2,3), (4,5) start at an EOS: not counted
    blocks = torch.zeros(T, E)
    blocks[[0, 1, 4, 5], 0] = 30.0
    blocks[[2, 3], 3] = 30.0  # only the counted pairs (1,2), (3,4) change experts
    assert float(routing_drift_loss((blocks,), ends)) == pytest.approx(1.0, abs=1e-6)
    assert float(routing_drift_loss((blocks,), rows)) == pytest.approx(0.4, abs=1e-6)  # 2 of 5


def test_request_concentration_is_each_texts_normalised_entropy() -> None:
    """Closed forms: uniform routing spreads 1; a text routed to one expert throughout spreads
    0; two texts in one row, each on its own expert, spread 0 (the mixture of the row would be
    log 2 / log E); two texts half on each of two experts spread log 2 / log E."""
    from casmoe.backends.train import EOS_ID, request_concentration_loss

    E, T = 4, 6
    rows = torch.full((1, T), 7)
    assert float(request_concentration_loss((torch.zeros(T, E),), rows)) == pytest.approx(1.0, abs=1e-6)
    one = torch.zeros(T, E)
    one[:, 2] = 40.0
    assert float(request_concentration_loss((one,), rows)) == pytest.approx(0.0, abs=1e-6)
    two = torch.zeros(T, E)
    two[:3, 0] = 40.0
    two[3:, 3] = 40.0
    ends = rows.clone()
    ends[0, 2] = EOS_ID  # tokens 0-2 are one text (the EOS ends it), 3-5 the next
    assert float(request_concentration_loss((two,), ends)) == pytest.approx(0.0, abs=1e-6)
    assert float(request_concentration_loss((two,), rows)) == pytest.approx(math.log(2) / math.log(E), abs=1e-6)
    assert float(request_concentration_loss((two, one), rows)) == pytest.approx(math.log(2) / math.log(E) / 2, abs=1e-6)


@pytest.mark.slow  # three short trainings of tiny-olmoe: about 30 s of CPU
def test_train_tiny_is_deterministic_and_says_whether_it_reproduces(tmp_path) -> None:
    from casmoe.backends.train import reproduction, train_tiny

    short = TrainSettings(steps=3)
    for name in ("a", "b"):
        train_tiny("tiny-olmoe", tmp_path / name, short, progress=False)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert "byte for byte" in reproduction("tiny-olmoe", tmp_path / "b", tmp_path / "a")
    train_tiny("tiny-olmoe", tmp_path / "c", TrainSettings(steps=3, seed=1), progress=False)
    assert "other settings" in reproduction("tiny-olmoe", tmp_path / "c", tmp_path / "a")


def _model_folder(path, weights: bytes, environment: dict | None, settings: dict | None = None):
    import json

    path.mkdir()
    (path / "model.safetensors").write_bytes(weights)
    record = {"settings": settings or {"seed": 0}, **({} if environment is None else {"environment": environment})}
    (path / "train.json").write_text(json.dumps(record))
    return path


def test_reproduction_names_what_differs(tmp_path, monkeypatch) -> None:
    """Host-independent: "here" is a fixed fake environment (this host's own CPU kernels, e.g.
    AVX512, would otherwise equal a recorded value and nothing would differ), and the recorded
    one differs in values no host has."""
    from casmoe.backends import train
    from casmoe.backends.train import reproduction

    here = {"torch": "9.9.9", "transformers": "9.9.9", "tokenizers": "9.9.9", "numpy": "9.9.9",
            "cpu_capability": "HOST-KERNELS", "machine": "host-arch"}
    monkeypatch.setattr(train, "training_environment", lambda: dict(here))
    ours = _model_folder(tmp_path / "ours", b"new", here)
    same_env = _model_folder(tmp_path / "same", b"old", here)
    assert "same recorded environment" in reproduction("tiny-olmoe", ours, same_env)
    other = _model_folder(tmp_path / "other", b"old",
                          {**here, "transformers": "0.0.1", "cpu_capability": "NO-SUCH-KERNELS"})
    line = reproduction("tiny-olmoe", ours, other)
    assert "transformers" in line and "0.0.1 recorded" in line and "NO-SUCH-KERNELS recorded" in line
    assert "HOST-KERNELS here" in line
    assert "torch" not in line  # what matches is not named
    unrecorded = _model_folder(tmp_path / "unrecorded", b"old", None)
    assert "records no environment" in reproduction("tiny-olmoe", ours, unrecorded)
    twin = _model_folder(tmp_path / "twin", b"new", None)
    assert "byte for byte" in reproduction("tiny-olmoe", ours, twin)
    assert "no shipped" in reproduction("tiny-olmoe", ours, tmp_path / "missing")
