"""Precisions as data: the block sizes, llama.cpp's per-layer rules, parsing at the edge, and the
old `Quant` names still pricing experts exactly as before."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, Quant
from casmoe.precision import (
    EXPERT_PARTS,
    Family,
    LayerRule,
    Precision,
    PrecisionError,
    load_precisions,
    parse_precision,
)

P = load_precisions()


def leaf(name: str) -> Precision:
    """A ggml block type, reached through the file type built on it."""
    return {"Q2_K": P["q2_k"], "Q3_K": P["q3_k_s"], "Q4_K": P["q4_k_s"], "Q5_K": P["q5_k_s"], "Q6_K": P["q6_k"],
            "Q8_0": P["q8_0"], "Q4_0": P["q4_0"]}[name].leaf


def test_every_named_precision_of_the_brief_exists_with_a_source():
    for name in ("bf16", "fp16", "fp8", "int8", "int4", "nf4", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q3_k_m",
                 "q2_k", "mxfp4", "hqq2", "hqq3", "hqq4", "awq4", "gptq4"):
        p = parse_precision(name)
        assert p.name == name and p.source and p.bits > 0 and p.dequant_ops >= 0
        assert isinstance(p.family, Family)
    assert P["bf16"].dequant_ops == P["fp16"].dequant_ops == 0
    assert hash(P["q4_k_m"]) == hash(parse_precision("Q4_K_M"))  # frozen, hashable, one value per name


def test_ggml_block_types_take_the_bytes_of_their_structs():
    # ggml-common.h: "Effectively 2.625 / 3.4375 / 4.5 / 5.5 / 6.5625 bits per weight"; q8_0 34 and q4_0 18
    # bytes per 32 weights; block_mxfp4 17 bytes per 32.
    expected = {"Q2_K": 2.625, "Q3_K": 3.4375, "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "Q8_0": 34 * 8 / 32,
                "Q4_0": 18 * 8 / 32}
    for name, bits in expected.items():
        assert leaf(name).bits == bits
        assert leaf(name).block == (256 if name.endswith("K") else 32)
    assert P["mxfp4"].bits == 17 * 8 / 32


def test_the_plain_formats_add_up_their_scales():
    assert P["fp8"].exact_bits == 8 + Fraction(32, 128 * 128)  # fp32 scale per 128x128 block (DeepSeek-V3)
    assert P["nf4"].exact_bits == 4 + Fraction(8, 64) + Fraction(32, 64 * 256)  # double-quantised absmax
    assert P["hqq2"].exact_bits == 2 + Fraction(8, 16) * 2 + Fraction(32, 16 * 128)  # Mixtral-Offloading experts
    assert P["hqq4"].exact_bits == 4 + Fraction(8, 64) * 2 + Fraction(32, 64 * 256)  # its attention
    assert P["hqq3"].exact_bits == Fraction(7 * 32, 64) + Fraction(16, 64) + Fraction(8, 64)
    assert P["gptq4"].exact_bits == P["awq4"].exact_bits == 4 + Fraction(4 + 16, 128)


def test_quant_keeps_its_members_and_gains_a_precision():
    assert [q.value for q in Quant] == ["fp16", "bf16", "int8", "int4"]
    assert Quant("int8") is Quant.INT8 and Quant.BF16.bits == 16 and Quant.INT4.bits == 4
    for q in Quant:
        assert q.precision.name == q.value and q.precision.bits == q.bits
        assert parse_precision(q) is q.precision
    import casmoe

    assert casmoe.Quant is Quant


@settings(max_examples=60, deadline=None)
@given(hidden=st.integers(0, 9000), intermediate=st.integers(0, 9000), gated=st.booleans(),
       layers=st.integers(1, 64), data=st.data())
def test_geometry_prices_a_quant_as_it_always_did(hidden, intermediate, gated, layers, data):
    g = Geometry(layers=layers, experts=4, top_k=2, hidden=hidden, intermediate=intermediate, gated=gated)
    layer = data.draw(st.integers(0, layers - 1))
    for q in Quant:
        assert g.expert_bytes(layer, q) == g.expert_params * q.bits // 8 == g.expert_bytes(layer, q.precision)
    assert g.bytes_per_layer(P["q4_k_m"]) == [g.expert_bytes(i, P["q4_k_m"]) for i in range(layers)]


def test_use_more_bits_is_llama_cpps_rule():
    # i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, in C integer arithmetic, for Mixtral's 32 blocks
    raised = [i for i in range(32) if LayerRule.MORE_BITS.holds(i, 32)]
    assert raised == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [i for i in range(61) if LayerRule.FIRST_SIXTEENTH.holds(i, 61)] == [0, 1, 2]
    assert [i for i in range(61) if LayerRule.FIRST_EIGHTH.holds(i, 61)] == list(range(7))


def test_q4_k_m_experts_vary_by_layer_as_the_gguf_does():
    q = P["q4_k_m"]
    h, i = 4096, 14336  # Mixtral-8x7B
    gate_up = 2 * h * i * Fraction(9, 2)
    assert q.expert_bytes(h, i, True, 0, 32) == int((gate_up + h * i * Fraction(105, 16)) // 8)  # down Q6_K
    assert q.expert_bytes(h, i, True, 4, 32) == int((gate_up + h * i * Fraction(9, 2)) // 8)  # down Q4_K
    assert [q.tensor_type(part, 4, 32).name for part in EXPERT_PARTS] == ["Q4_K", "Q4_K", "Q4_K"]
    q3 = P["q3_k_m"]
    assert [q3.tensor_type("down", b, 61).name for b in (0, 2, 3, 60)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert q3.tensor_type("gate", 0, 61).name == "Q3_K" and P["q2_k"].tensor_type("down", 7, 61).name == "Q3_K"


def test_rows_that_are_not_whole_blocks_fall_back_as_llama_cpp_does():
    q = P["q4_k_m"]
    # gpt-oss: 2880 = 11.25 x 256 -> tensor_type_fallback: Q4_K -> Q5_0, Q6_K -> Q8_0
    assert [q.tensor_type(p, 0, 36).fitted(2880).name for p in EXPERT_PARTS] == ["Q5_0", "Q5_0", "Q8_0"]
    assert q.tensor_type("gate", 0, 36).fitted(100).name == "F16"  # not a multiple of 32 either
    assert P["fp8"].fitted(100) is P["fp8"]  # formats that pad their last block keep their type
    assert P["q4_k_m"].expert_bytes(2880, 2880, True, 4, 36) == 3 * 2880 * 2880 * 11 // 16  # block 4: all Q5_0


def test_dequant_ops_follow_the_types_an_expert_actually_gets():
    assert P["bf16"].expert_dequant_ops(64, 128) == 0
    assert P["q4_k_m"].expert_dequant_ops(256, 512, True, 0, 32) == 3 * 256 * 512 * 2 + 8 * 256 * 512


def test_parse_precision_refuses_in_one_line_naming_the_known():
    with pytest.raises(PrecisionError) as err:
        parse_precision("q9_k")
    message = str(err.value)
    assert "\n" not in message and "q4_k_m" in message and "4.5bpw" in message
    assert isinstance(err.value, CasmoeError) and isinstance(err.value, ValueError)
    for bad in ("0bpw", "33bpw", "4.5 bits", ""):
        with pytest.raises(PrecisionError):
            parse_precision(bad)
    assert parse_precision(" BF16 ") is P["bf16"] and parse_precision(P["nf4"]) is P["nf4"]


@settings(max_examples=80, deadline=None)
@given(bits=st.decimals(min_value="0.001", max_value=32, places=3))
def test_bits_per_weight_round_trip(bits):
    p = parse_precision(f"{bits}bpw")
    assert p.exact_bits == Fraction(bits) and p.dequant_ops == 0
    assert parse_precision(p.name) == p
    assert parse_precision(f" {bits} BPW ") == p


@settings(max_examples=80, deadline=None)
@given(a=st.floats(0.01, 32), b=st.floats(0.01, 32), params=st.integers(0, 10**12))
def test_bytes_grow_with_bits(a, b, params):
    lo, hi = sorted((a, b))
    low, high = parse_precision(f"{lo!r}bpw"), parse_precision(f"{hi!r}bpw")
    assert low.param_bytes(params) <= high.param_bytes(params)
    assert high.param_bytes(params) <= params * 4


MIXES = [name for name, p in P.items() if p.is_mix]


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(MIXES), hidden=st.integers(1, 40).map(lambda x: 256 * x),
       intermediate=st.integers(1, 40).map(lambda x: 256 * x), gated=st.booleans(), layers=st.integers(1, 96),
       data=st.data())
def test_a_mix_costs_between_its_cheapest_and_dearest_part(name, hidden, intermediate, gated, layers, data):
    mix = P[name]
    layer = data.draw(st.integers(0, layers - 1))
    cost = mix.expert_bytes(hidden, intermediate, gated, layer, layers)
    uniform = sorted(t.expert_bytes(hidden, intermediate, gated) for t in mix.types)
    assert uniform[0] <= cost <= uniform[-1]
    assert mix.expert_bytes(hidden, intermediate, gated, 0, layers) >= uniform[0]


def test_layer_and_part_arguments_are_checked():
    with pytest.raises(PrecisionError):
        P["q4_k_m"].expert_bytes(256, 256, True, 5, 5)
    with pytest.raises(PrecisionError):
        P["q4_k_m"].tensor_type("attn_v")
    with pytest.raises(PrecisionError):
        P["bf16"].param_bytes(-1)


def _load(tmp_path: Path, text: str) -> dict[str, Precision]:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return load_precisions(path)


@pytest.mark.parametrize("text, words", [
    ('[precision.x]\nbits = 4\nfamily = "quantum"\ndequant_ops = 1\nsource = "s"', "unknown family"),
    ('[precision.x]\nbits = 40\nfamily = "int"\ndequant_ops = 1\nsource = "s"', "bits must be"),
    ('[precision.x]\nbits = 4\nfamily = "int"\ndequant_ops = 1', "lacks source"),
    ('[ggml.T]\nbits = 4\nblock = 32\nblock_bytes = 17\nfamily = "int"\ndequant_ops = 1\nsource = "s"', "block_bytes"),
    ('[precision.x]\nbase = "Q9"\nsource = "s"', "not a ggml type"),
    (('[ggml.T]\nbits = 4\nfamily = "int"\ndequant_ops = 1\nsource = "s"\n[precision.x]\nbase = "T"\n'
      'dense = "T"\nhead = "T"\ndown = [["sometimes", "T"]]\nsource = "s"'), "unknown condition"),
    (('[ggml.T]\nbits = 4\nfamily = "int"\ndequant_ops = 1\nsource = "s"\n[precision.x]\nbase = "T"\n'
      'dense = "T"\nsource = "s"'), "type of its head tensors"),
    ('[ggml.T]\nbits = 4\nfamily = "int"\ndequant_ops = 1\nsource = "s"\nfallback = "U"\n', "fallback"),
    ('[stuff.x]\nbits = 4', "unknown top-level"),
])
def test_a_bad_precisions_file_fails_in_one_line(tmp_path, text, words):
    with pytest.raises(PrecisionError) as err:
        _load(tmp_path, text)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("model, quant, dense, head", [
    ("qwen3-30b-a3b", "q4_k_m", "Q4_K", "Q6_K"),  # a GGUF quantises every tensor
    ("gpt-oss-120b", "q4_k_m", "Q5_0", "Q8_0"),  # 2880-wide rows are not whole K blocks: Q4_K -> Q5_0, Q6_K -> Q8_0
    ("qwen3-30b-a3b", "mxfp4_moe", "Q8_0", "Q8_0"),
    ("qwen3-30b-a3b", "iq2_xxs", "IQ2_XXS", "Q5_K"),
    ("mixtral-8x7b", "int4", "bf16", "bf16"),  # a plain format stores the experts only
    ("mixtral-8x7b", "hqq2", "bf16", "bf16"),
])
def test_a_file_type_prices_the_whole_file_and_a_plain_format_the_experts(model, quant, dense, head):
    from casmoe.presets import get_preset
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    preset = get_preset(model)
    machine = Machine(preset, load_profile("rtx4090x4"), quant=parse_precision(quant))
    assert (machine.dense_precision.name, machine.head_precision.name) == (dense, head)
    assert machine.head_bytes() == machine.head_precision.param_bytes(preset.vocab * preset.geometry.hidden)
    forced = Machine(preset, load_profile("rtx4090x4"), quant=parse_precision(quant), dense_quant=parse_precision("bf16"))
    assert (forced.dense_precision.name, forced.head_precision.name) == ("bf16", "bf16")  # --dense-quant wins


def test_a_file_type_named_for_the_dense_part_keeps_the_experts_own_type():
    """gpt-oss in a Q4_K_M GGUF: llama.cpp keeps its MXFP4 experts and quantises the rest to
    Q4_K_M's types (`--quant mxfp4 --dense-quant q4_k_m`)."""
    from casmoe.presets import get_preset
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    machine = Machine(get_preset("gpt-oss-20b"), load_profile("rtx4090x4"), quant=parse_precision("mxfp4"),
                      dense_quant=parse_precision("q4_k_m"))
    assert (machine.quant.name, machine.dense_precision.name, machine.head_precision.name) == ("mxfp4", "Q5_0", "Q8_0")


def test_every_family_says_whether_the_host_multiplies_it_with_integer_dot_products():
    from casmoe.precision import INT_DOT, bits_per_weight

    assert set(INT_DOT) == set(Family) and all(source for _, source in INT_DOT.values())
    # ggml's block types meet int8 activations (vec_dot_type Q8_K / Q8_0); a file type answers for its base
    for name in ("q4_k_m", "q2_k", "q6_k", "q8_0", "q4_0", "iq4_xs", "iq2_xxs", "mxfp4", "mxfp4_moe"):
        assert P[name].int_dot, name
    assert leaf("Q8_0").family is Family.GGML and leaf("Q4_K").family is Family.KQUANT
    # floats, and the formats PyTorch stacks dequantise to floats first
    for name in ("bf16", "fp16", "fp8", "int8", "int4", "gptq4", "awq4", "nf4", "hqq2", "hqq3", "hqq4"):
        assert not P[name].int_dot, name
    assert not bits_per_weight(4.5).int_dot  # a bare width names no kernel
    assert not P["q4_k_m"].head.fitted(2880).fitted(7).int_dot  # a row no block fits is stored F16
