"""Presets that price a token: each preset's parameter count is held to the model's published
total (that is how we know the shapes are right), and the attention, dense blocks, windows and
native precisions price what the released checkpoints hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from casmoe.geometry import Geometry, Quant
from casmoe.precision import parse_precision
from casmoe.presets import Attention, ModelPreset, PresetError, get_preset, load_presets, preset_rows

B = 1e9

# (preset, published total, published active, which of embedding table / LM head the publisher's active count
# includes, source). Conventions differ by publisher; each is the one its figure is reproduced with.
PUBLISHED = [
    ("mixtral-8x7b", 46.7 * B, 12.9 * B, (True, True),
     ("ajkdrag.in, '56B or 47B in Mixtral 8x7B MoE': 'total number of params is not 56B but only 46.7B', "
      "'only 12.9B are used during inference' (the Mixtral paper, arXiv 2401.04088, rounds to 47B / 13B)")),
    ("mixtral-8x22b", 141 * B, 39 * B, (True, True),
     ("Prompt Engineering Guide, Mixtral 8x22B (citing Mistral AI's blog): '39B active parameters out of a "
      "total of 141B parameters'")),
    ("qwen1.5-moe-a2.7b", 14.3 * B, 2.7 * B, (True, True),
     "Qwen/Qwen1.5-MoE-A2.7B README: '14.3B parameters in total and 2.7B activated parameters during runtime'"),
    ("qwen2-57b-a14b", 57 * B, 14 * B, (True, True),
     ("Qwen/Qwen2-57B-A14B-Instruct discussion #1 (Qwen maintainer): 'A14B means out of 57B parameters, 14B are "
      "activated each time'")),
    ("qwen3-30b-a3b", 30.5 * B, 3.3 * B, (True, True),
     "Qwen3-30B-A3B model card: 'Number of Parameters: 30.5B in total and 3.3B activated'"),
    ("qwen3-235b-a22b", 235 * B, 22 * B, (True, True),
     "NVIDIA NeMo AutoModel, Qwen3 MoE: 'Qwen3-235B-A22B: 235B total parameters, 22B activated per token'"),
    ("deepseek-v2-lite", 16 * B, None, None,
     ("deepseek-ai/DeepSeek-V2-Lite-Chat README: 'DeepSeek-V2-Lite | 16B | 2.4B' (the 2.4B active is not "
      "reproduced within 2% by any count: 2.45B with the head, 2.24B without)")),
    ("deepseek-v2", 236 * B, 21 * B, (False, True),
     ("deepseek-ai/DeepSeek-V3 README, base-model table: DeepSeek-V2, '# Activated Params 21B', "
      "'# Total Params 236B'")),
    ("deepseek-v2.5", 236 * B, 21 * B, (False, True),
     "deepseek-ai/DeepSeek-V3 README, chat-model table: DeepSeek V2.5-0905, 21B activated, 236B total"),
    ("deepseek-v3", 671 * B, 37 * B, (True, True),
     ("deepseek-ai/DeepSeek-V3 README: '671B total parameters with 37B activated for each token' (README_WEIGHTS "
      "gives 36.7B 'including 0.9B for Embedding and 0.9B for the output Head'; counted so, this preset gives "
      "37.5B, 2.3% more)")),
    ("deepseek-r1", 671 * B, 37 * B, (True, True),
     "openrouter.ai/deepseek/deepseek-r1: \"It's 671B parameters in size, with 37B active in an inference pass\""),
    ("kimi-k2", 1040 * B, 32 * B, (False, True),
     ("agentwiki.org, Moonshot AI Kimi K2 (citing Intuition Labs' technical deep dive): '32 billion of its 1.04 "
      "trillion total parameters'; MoonshotAI/Kimi-K2 README rounds the total to 1T")),
    ("glm-4.5", 355 * B, 32 * B, (False, False),
     "transformers Glm4Moe documentation: 'GLM-4.5 has 355 billion total parameters with 32 billion active'"),
    ("glm-4.5-air", 106 * B, 12 * B, (False, False),
     "transformers Glm4Moe documentation: 'GLM-4.5-Air ... 106 billion total parameters and 12 billion active'"),
    ("dbrx", 132 * B, 36 * B, (True, True),
     ("DBRX model card (quoted in dranger003/dbrx-instruct-iMat.GGUF): '132B total parameters of which 36B "
      "parameters are active on any input'")),
    ("llama-4-scout", 109 * B, 17 * B, (True, True),
     ("transformers Llama4 documentation: 'Llama 4 Scout also has 17B active parameters out of ~109B total' (the "
      "total includes the vision encoder, which the preset leaves out)")),
    ("olmoe-1b-7b", 7 * B, 1.3 * B, (True, True),
     "NVIDIA NeMo Megatron-Bridge, OLMoE: 'approximately 1.3B active parameters per forward pass out of 7B total'"),
    ("phi-3.5-moe", 41.87 * B, 6.6 * B, (True, True),
     ("whatmodel.sh, Phi-3.5-MoE-instruct: '41.87B params (6.6B active)'; transformers PhiMoE documentation: "
      "'a 16 x 3.8B MoE model with 6.6 billion active parameters'")),
    ("gpt-oss-20b", 20.9 * B, 3.6 * B, (False, True),
     "gpt-oss model card as summarised on lephongphu.site: 'gpt-oss-20b: 20.9B total parameters (3.6B active)'"),
    ("gpt-oss-120b", 116.8 * B, 5.1 * B, (False, True),
     ("gpt-oss model card as summarised on lephongphu.site: 'gpt-oss-120b: 116.8B total parameters (5.1B "
      "active)'")),
]


@pytest.mark.parametrize("name, total, active, counted, source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_the_published_ones(name, total, active, counted, source):
    preset = get_preset(name)
    assert preset.total_params() == pytest.approx(total, rel=0.02), source
    if active is not None:
        assert preset.active_params(*counted) == pytest.approx(active, rel=0.02), source


def test_every_preset_but_switch_is_held_to_a_published_count():
    assert set(load_presets()) - {p[0] for p in PUBLISHED} == {"switch-base-8"}  # encoder-decoder: not modelled


def test_gpt_oss_120b_experts_at_native_mxfp4_weigh_what_the_checkpoint_does():
    p = get_preset("gpt-oss-120b")
    assert p.expert_precision.name == "mxfp4" and p.dense_precision.name == "bf16"
    native, bf16 = p.sizes(), p.sizes(parse_precision("bf16"))
    expert_weights = 36 * 128 * 3 * 2880 * 2880
    assert bf16["experts"] == expert_weights * 2  # ~229 GB
    assert native["experts"] == expert_weights * 17 // 32  # 4.25 bits: ~61 GB
    # OpenAI's gpt-oss model card lists a 60.8 GiB checkpoint for gpt-oss-120b (as quoted on
    # fitmygpu.com/models/gpt-oss-120b); experts in MXFP4, the rest in bf16.
    assert native["total"] / 2**30 == pytest.approx(60.8, rel=0.02)


def test_deepseek_r1_at_q4_k_m_weighs_what_ollamas_gguf_does():
    # ollama.com/library/deepseek-r1:671b, blob 439dd1a5e052: general.file_type Q4_K_M, 404GB (ollama counts
    # 1000^3 bytes a GB). The experts follow llama.cpp's per-layer Q6_K/Q4_K rule over 61 blocks.
    q = parse_precision("q4_k_m")
    assert get_preset("deepseek-r1").sizes(q, q)["total"] / 1e9 == pytest.approx(404, rel=0.02)


def test_mla_caches_the_latent_and_gqa_the_heads():
    v3 = get_preset("deepseek-v3")
    assert v3.attention is Attention.MLA
    assert v3.kv_bytes_per_token() == (512 + 64) * 2  # FlashMLA's 576 bf16 values a token
    assert v3.kv_bytes_per_token(parse_precision("fp8")) == 576 + 576 // 1024  # fp8 values (+ block scales)
    mixtral = get_preset("mixtral-8x7b")
    assert mixtral.attention is Attention.GQA
    assert mixtral.kv_bytes_per_token() == mixtral.kv_bytes_per_token(2) == 2 * 8 * 128 * 2
    assert mixtral.kv_bytes_per_token(Quant.INT8) == 2 * 8 * 128
    assert get_preset("olmoe-1b-7b").attention is Attention.MHA


def test_the_simulators_view_of_gqa_presets_is_unchanged():
    # casmoe/sim/cost/compute.py reads dense_params_per_layer, kv_bytes_per_token() and heads x head_dim; the golden
    # simulator results (tests/data/sim_golden.json) depend on them for mixtral-8x7b and olmoe-1b-7b.
    for name in ("mixtral-8x7b", "olmoe-1b-7b"):
        p = get_preset(name)
        g = p.geometry
        attention = g.hidden * p.heads * p.head_dim * 2 + g.hidden * p.kv_heads * p.head_dim * 2
        assert p.attention_params == attention
        assert p.dense_params_per_layer == attention + g.hidden * g.experts + g.shared_experts * g.expert_params
        assert p.attention_pair_flops == 4 * p.heads * p.head_dim


def test_mla_projections_and_absorbed_attention():
    v3 = get_preset("deepseek-v3")
    h, heads = 7168, 128
    assert v3.attention_params == (h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256
                                   + heads * 128 * h)
    lite = get_preset("deepseek-v2-lite")  # q_lora_rank null: one full query projection
    assert lite.attention_params == (2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048)
    assert v3.attention_pair_flops == 2 * heads * (2 * 512 + 64)
    assert v3.attention_flops(3, 10) == 2 * v3.attention_params * 3 + v3.attention_pair_flops * 10


def test_dense_blocks_come_first_and_are_priced():
    v3 = get_preset("deepseek-v3")
    assert v3.blocks == 61 and v3.dense_layers == 3
    assert v3.dense_layer_params == v3.attention_params + 3 * 7168 * 18432 + 2 * 7168
    q = parse_precision("q4_k_m")
    g = v3.geometry
    per_layer = v3.expert_bytes_per_layer(q)
    assert per_layer == [q.expert_bytes(g.hidden, g.intermediate, True, 3 + layer, 61) for layer in range(58)]
    # use_more_bits(block, 61) raises ffn_down to Q6_K in blocks 3-6 (< 61/8) but not in block 7
    assert per_layer[0] == per_layer[3] > per_layer[4]
    assert v3.expert_bytes_per_layer() == [g.expert_params + g.expert_params // 4096] * 58  # native fp8


def test_gpt_oss_alternates_windows_with_full_layers():
    p = get_preset("gpt-oss-120b")
    assert [p.window(b) for b in range(4)] == [128, 0, 128, 0]
    per_token = 2 * 8 * 64 * 2
    assert p.kv_bytes(1000) == 18 * per_token * 1000 + 18 * per_token * 128
    assert p.kv_bytes(100) == 36 * per_token * 100
    assert get_preset("mixtral-8x7b").kv_bytes(1000) == 32 * 1000 * 4096
    with pytest.raises(PresetError):
        p.window(36)


def test_the_old_constructor_still_builds_a_bf16_mha_preset():
    g = Geometry(layers=2, experts=4, top_k=2, hidden=8, intermediate=16)
    p = ModelPreset("test", "tests", g, heads=1, kv_heads=1, head_dim=8, vocab=16)
    assert p.attention is Attention.MHA and p.expert_precision.name == p.dense_precision.name == "bf16"
    assert p.total_params() == 2 * p.moe_layer_params + 2 * 16 * 8 + 8
    assert p.active_params(False, False) == 2 * (p.dense_params_per_layer + 16 + 2 * g.expert_params) + 8
    assert ModelPreset("q", "t", g, heads=1, kv_heads=1, head_dim=8, vocab=16,
                       expert_precision=Quant.INT4).expert_precision.bits == 4


@pytest.mark.parametrize("kwargs, words", [
    ({"attention": Attention.MLA}, "MLA needs"),
    ({"kv_lora_rank": 512}, "MLA dimensions"),
    ({"heads": 4, "kv_heads": 3}, "evenly"),
    ({"heads": 4, "kv_heads": 2, "attention": Attention.MHA}, "one K/V head"),
    ({"sliding_window": 128}, "go together"),
    ({"sliding_window": 128, "sliding_every": 1}, "go together"),
    ({"dense_layers": -1}, "dense_layers"),
    ({"expert_precision": "int4"}, "must be a Precision"),
])
def test_impossible_presets_are_refused_in_one_line(kwargs, words):
    g = Geometry(layers=2, experts=4, top_k=2, hidden=8, intermediate=16)
    base = {"heads": 1, "kv_heads": 1, "head_dim": 8, "vocab": 16}
    with pytest.raises(PresetError) as err:
        ModelPreset("bad", "tests", g, **{**base, **kwargs})
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("extra, words", [
    ('heads_total = 3', "unknown keys"),
    ('attention = "linear"', "unknown attention"),
    ('expert_precision = "q9"', "unknown precision"),
])
def test_a_bad_preset_file_names_the_preset(tmp_path: Path, extra, words):
    path = tmp_path / "m.toml"
    path.write_text(f'[m]\nsource = "s"\nlayers = 2\nexperts = 4\ntop_k = 2\nhidden = 8\nintermediate = 16\n'
                    f'heads = 1\nkv_heads = 1\nhead_dim = 8\nvocab = 16\n{extra}\n')
    with pytest.raises(PresetError) as err:
        load_presets(path)
    assert "[m]" in str(err.value) and words in str(err.value)


def test_preset_rows_show_shape_attention_and_sizes():
    rows = {r["name"]: r for r in preset_rows()}
    assert set(rows) == set(load_presets())
    oss = rows["gpt-oss-120b"]
    assert (oss["attention"], oss["expert_precision"], oss["dense_precision"]) == ("gqa", "mxfp4", "bf16")
    assert oss["experts_bytes"] * 3 < oss["experts_bf16_bytes"]
    v3 = rows["deepseek-v3"]
    assert (v3["layers"], v3["dense_layers"], v3["attention"], v3["expert_precision"]) == (58, 3, "mla", "fp8")
    assert v3["kv_bytes_per_token"] == 1152 * 61
    assert rows["mixtral-8x7b"]["experts_bytes"] == rows["mixtral-8x7b"]["experts_bf16_bytes"]



def test_the_presets_command_prints_the_rows(monkeypatch):
    import json

    from casmoe.cli.app import app
    from typer.testing import CliRunner

    runner = CliRunner()
    table = runner.invoke(app, ["presets"])
    assert table.exit_code == 0, table.output
    assert "deepseek-v3" in table.output and "mla" in table.output and "mxfp4" in table.output
    listed = runner.invoke(app, ["presets", "--json"])
    data = json.loads(listed.output)
    assert data["deepseek-v3"]["attention"] == "mla" and data["deepseek-v3"]["kv_lora_rank"] == 512
    assert data["mixtral-8x7b"]["source"] and data["mixtral-8x7b"]["layers"] == 32  # the old fields stay
    assert data["gpt-oss-120b"]["experts_bytes"] < data["gpt-oss-120b"]["experts_bf16_bytes"]
