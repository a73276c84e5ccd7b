"""A model read from the user's own GGUF: its header, its preset and the bytes it stores.

The files are written here with gguf-py's own writer (`gguf.GGUFWriter`, its `add_*` helpers
naming every key), with tiny shapes, llama.cpp's tensor names, and raw bytes of the right size
per ggml type; every byte count asserted is worked out by hand from the block sizes of
ggml-common.h (Q4_K 144 bytes per 256 weights, Q6_K 210, Q8_0 34 per 32, Q4_0 18 per 32,
MXFP4 17 per 32, F32 4 per weight, BF16 2).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from casmoe.precision import LayerRule, parse_precision
from casmoe.presets import Attention, get_preset
from casmoe.presets.gguf import preset_from_header, read_gguf, supported_architectures
from casmoe.presets.gguf_header import GGUFError, GGUFHeader, SkippedArray, TensorInfo, read_header
from casmoe.presets.weights import file_weights
from support.gguf_files import (
    F32, Q8_0, H, V, deepseek2, glm4moe, gpt_oss, mixtral_split, nbytes, qwen3moe, write,
)


def total(w) -> int:
    """Every tensor counted once, by the parts FileWeights promises."""
    return (w.experts * sum(w.expert) + sum(w.dense) + sum(w.dense_blocks) + w.embedding
            + (0 if w.tied else w.head) + w.other + w.mtp)


# ---- the header --------------------------------------------------------------------------------

def test_the_header_reader_agrees_with_gguf_py_and_skips_the_vocabulary(tmp_path):
    path = qwen3moe(tmp_path / "q.gguf", tokens=2000)
    header, reference = read_header(path), gguf.GGUFReader(path)
    assert [(t.name, t.type, t.shape, t.n_bytes, t.offset) for t in header.tensors] == [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes), int(t.data_offset))
        for t in reference.tensors]
    for key, field in reference.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")):
            continue
        assert header.fields[key] == field.contents(), key
    assert header.fields["tokenizer.ggml.tokens"] == SkippedArray("STRING", 2000)
    assert header.fields["tokenizer.ggml.scores"] == SkippedArray("FLOAT32", 2000)
    assert header.architecture == "qwen3moe" and header.version == 3


def test_a_split_set_is_read_whole_from_any_part(tmp_path):
    one = file_weights(qwen3moe(tmp_path / "one.gguf"))
    qwen3moe(tmp_path / "m.gguf", split=20)
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) == 3 and parts[0].name == "m-00001-of-00003.gguf"
    for part in parts:
        preset, w = read_gguf(part)
        assert w.parts == tuple(str(p) for p in parts) and w.path == str(parts[0])
        assert replace(w, path=one.path, parts=one.parts) == one
        assert preset.name == "m" and preset.geometry.layers == 4
    parts[1].unlink()
    with pytest.raises(GGUFError, match="m-00002-of-00003.gguf is missing"):
        read_header(parts[2])


# ---- presets, one architecture at a time ---------------------------------------------------------

def test_qwen3moe_q4_k_m_bytes_match_llama_quantize_and_casmoes_rules(tmp_path):
    preset, w = read_gguf(qwen3moe(tmp_path / "Qwen3-tiny-Q4_K_M.gguf"))
    g = preset.geometry
    assert (g.layers, g.experts, g.top_k, g.shared_experts, g.hidden, g.intermediate, g.gated) == (
        4, 4, 2, 0, 256, 256, True)
    assert (preset.heads, preset.kv_heads, preset.head_dim, preset.vocab, preset.attention) == (
        4, 2, 64, 512, Attention.GQA)
    assert preset.name == "Qwen3-tiny-Q4_K_M" and preset.dense_layers == 0 and not preset.tie_embeddings
    # one expert: gate and up Q4_K (256 rows of 256 = 256 blocks of 144 bytes), down Q4_K or Q6_K (210)
    q4, q6 = 256 * 144, 256 * 210
    assert w.expert == (3 * q4, 3 * q4, 2 * q4 + q6, 2 * q4 + q6)
    assert w.expert_params == (3 * 256 * 256,) * 4 and w.experts == 4
    # attention q 256 rows, k and v 128, output 256 (Q4_K; v Q6_K where raised), q/k norms 64 F32,
    # two norms 256 F32, router 4 rows of 256 F32
    base = (256 + 128 + 256) * 144 + 2 * 64 * 4 + 2 * 256 * 4 + 4 * 256 * 4
    assert w.dense == (base + 128 * 144, base + 128 * 144, base + 128 * 210, base + 128 * 210)
    assert w.embedding == 512 * 144 and w.head == 512 * 210 and w.other == 256 * 4 and w.dense_blocks == ()
    assert w.total_bytes == total(w) == sum(t.n_bytes for t in read_header(w.path).tensors)
    assert w.file_type == "MOSTLY_Q4_K_M" and w.precision_name() == "q4_k_m" and not w.split_experts
    assert w.types == {"experts": "Q4_K; ffn_down_exps Q6_K in 2 of 4 layers",
                       "attention": "Q4_K; attn_v Q6_K in 2 of 4 layers", "router": "F32",
                       "norms and biases": "F32", "embedding": "Q4_K", "head": "Q6_K"}
    # casmoe's Q4_K_M rules give these very bytes
    assert parse_precision("q4_k_m").down[0].when is LayerRule.MORE_BITS
    assert preset.expert_bytes_per_layer(parse_precision("q4_k_m")) == list(w.expert)
    assert preset.expert_bytes_per_layer() == list(w.expert)  # the preset carries the file's precision


def test_deepseek2_mla_dense_lead_shared_and_tied(tmp_path):
    preset, w = read_gguf(deepseek2(tmp_path / "dsv2.gguf"))
    g = preset.geometry
    assert (g.layers, g.experts, g.top_k, g.shared_experts, g.intermediate) == (2, 4, 2, 2, 128)
    assert (preset.dense_layers, preset.dense_intermediate, preset.attention) == (1, 512, Attention.MLA)
    assert (preset.heads, preset.kv_heads, preset.head_dim, preset.q_lora_rank, preset.kv_lora_rank,
            preset.qk_nope_head_dim, preset.qk_rope_head_dim, preset.v_head_dim) == (2, 2, 96, 0, 64, 64, 32, 64)
    assert preset.tie_embeddings and w.tied and w.head == w.embedding == nbytes(Q8_0, H, V) == 512 * 8 * 34
    # Q8_0: 34 bytes per 32 weights. One expert: gate, up 128 rows of 256; down 256 rows of 128
    assert w.expert == (3 * 128 * 256 // 32 * 34,) * 2
    attention = (256 * 192 + 256 * 96 + 64 * 64 * 2 * 2 + 128 * 256) // 32 * 34 + 64 * 4
    norms = 2 * 256 * 4
    shared = 3 * 256 * 256 // 32 * 34
    assert w.dense == (attention + norms + 4 * 256 * 4 + shared,) * 2
    assert w.dense_blocks == (attention + norms + 3 * 256 * 512 // 32 * 34,)
    assert w.total_bytes == total(w) and w.precision_name() == "q8_0"
    # the file's weights are the ones casmoe's MLA preset counts, exactly
    assert w.dense_params == (preset.dense_params_per_layer + preset.norm_params_per_layer,) * 2
    assert w.expert_params == (g.expert_params,) * 2


def test_gpt_oss_mxfp4_experts_with_biases_merged_gate_up_and_windows(tmp_path):
    preset, w = read_gguf(gpt_oss(tmp_path / "gpt-oss-tiny.gguf"))
    g = preset.geometry
    assert (g.layers, g.experts, g.top_k, g.intermediate, g.gated) == (2, 4, 2, 256, True)
    assert (preset.sliding_window, preset.sliding_every) == (128, 2)
    assert [preset.window(b) for b in range(2)] == [128, 0]
    # MXFP4: 17 bytes per 32 weights; gate_up 512 rows of 256, down 256 rows of 256; biases F32
    assert w.expert == ((512 * 256 + 256 * 256) // 32 * 17 + (512 + 256) * 4,) * 2
    assert w.precision_name() == "mxfp4_moe" and w.file_type == "MOSTLY_MXFP4_MOE"  # the file type (casmoe/precisions.toml)
    assert preset.expert_precision.name == "mxfp4_moe"
    assert w.types["experts"] == "MXFP4" and w.types["attention"] == "BF16" and w.types["head"] == "BF16"
    attention = (256 + 128 + 128 + 256) * 256 * 2 + (256 + 128 + 128 + 256) * 4 + 4 * 4
    assert w.dense == (attention + 2 * 256 * 4 + 4 * 256 * 4 + 4 * 4,) * 2
    assert w.total_bytes == total(w)


def test_old_split_expert_files_are_read_and_flagged(tmp_path):
    preset, w = read_gguf(mixtral_split(tmp_path / "mixtral-old.gguf"))
    assert w.split_experts and w.experts == 4 and preset.geometry.gated
    assert (preset.geometry.layers, preset.geometry.intermediate, preset.head_dim) == (2, 256, 64)
    assert w.expert == (3 * 256 * 256 // 32 * 18,) * 2  # Q4_0: 18 bytes per 32 weights
    assert w.types["experts"] == "Q4_0" and w.precision_name() == "q4_0" and w.total_bytes == total(w)
    from casmoe.sim.questions.deploy.model import resolve_model

    assert "which current llama.cpp does not load" in resolve_model(w.path, need_preset=False).note


def test_glm4moe_counts_the_mtp_block_apart(tmp_path):
    preset, w = read_gguf(glm4moe(tmp_path / "glm.gguf"))
    assert (preset.geometry.layers, preset.dense_layers, preset.geometry.shared_experts) == (2, 1, 1)
    assert w.moe_blocks == (1, 2) and len(w.dense_blocks) == 1
    assert w.mtp == sum(t.n_bytes for t in read_header(w.path).tensors if t.name.startswith("blk.3."))
    assert w.expert == (3 * 128 * 256 * 2,) * 2 and w.precision_name() == "bf16"
    assert preset.dense_precision.name == "bf16" and w.total_bytes == total(w)


# ---- every mapping against casmoe's shipped preset of the same model -----------------------------

# The keys llama.cpp's converter (convert_hf_to_gguf.py and conversion/<family>.py at commit 0c1e570)
# writes from each model's config.json, as gguf.GGUFWriter helper names, and the preset they must give.
CONVERTED = {
    "qwen3-30b-a3b": ("qwen3moe", {"block_count": 48, "embedding_length": 2048, "feed_forward_length": 6144,
                                   "expert_feed_forward_length": 768, "expert_count": 128, "expert_used_count": 8,
                                   "head_count": 32, "head_count_kv": 4, "key_length": 128, "value_length": 128}),
    "qwen1.5-moe-a2.7b": ("qwen2moe", {"block_count": 24, "embedding_length": 2048, "feed_forward_length": 5632,
                                       "expert_feed_forward_length": 1408, "expert_shared_feed_forward_length": 5632,
                                       "expert_count": 60, "expert_used_count": 4, "head_count": 16,
                                       "head_count_kv": 16}),
    "gpt-oss-20b": ("gpt-oss", {"block_count": 24, "embedding_length": 2880, "feed_forward_length": 2880,
                                "expert_feed_forward_length": 2880, "expert_count": 32, "expert_used_count": 4,
                                "head_count": 64, "head_count_kv": 8, "key_length": 64, "value_length": 64,
                                "sliding_window": 128}),
    "mixtral-8x7b": ("llama", {"block_count": 32, "embedding_length": 4096, "feed_forward_length": 14336,
                               "expert_count": 8, "expert_used_count": 2, "head_count": 32, "head_count_kv": 8}),
    "deepseek-v2-lite": ("deepseek2", {"block_count": 27, "leading_dense_block_count": 1, "embedding_length": 2048,
                                       "feed_forward_length": 10944, "expert_feed_forward_length": 1408,
                                       "expert_count": 64, "expert_used_count": 6, "expert_shared_count": 2,
                                       "head_count": 16, "head_count_kv": 1, "key_length": 576, "value_length": 512,
                                       "key_length_mla": 192, "value_length_mla": 128, "kv_lora_rank": 512,
                                       "rope_dimension_count": 64}),
    "deepseek-v3": ("deepseek2", {"block_count": 61, "leading_dense_block_count": 3, "embedding_length": 7168,
                                  "feed_forward_length": 18432, "expert_feed_forward_length": 2048,
                                  "expert_count": 256, "expert_used_count": 8, "expert_shared_count": 1,
                                  "head_count": 128, "head_count_kv": 1, "key_length": 576, "value_length": 512,
                                  "key_length_mla": 192, "value_length_mla": 128, "q_lora_rank": 1536,
                                  "kv_lora_rank": 512, "rope_dimension_count": 64}),
    "glm-4.5-air": ("glm4moe", {"block_count": 47, "nextn_predict_layers": 1, "leading_dense_block_count": 1,
                                "embedding_length": 4096, "feed_forward_length": 10944,
                                "expert_feed_forward_length": 1408, "expert_count": 128, "expert_used_count": 8,
                                "expert_shared_count": 1, "head_count": 96, "head_count_kv": 8, "key_length": 128,
                                "value_length": 128}),
    "llama-4-scout": ("llama4", {"block_count": 48, "embedding_length": 5120, "feed_forward_length": 16384,
                                 "expert_feed_forward_length": 8192, "interleave_moe_layer_step": 1,
                                 "expert_count": 16, "expert_used_count": 1, "head_count": 40, "head_count_kv": 8,
                                 "key_length": 128, "value_length": 128}),
    "dbrx": ("dbrx", {"block_count": 40, "embedding_length": 6144, "feed_forward_length": 10752, "expert_count": 16,
                      "expert_used_count": 4, "head_count": 48, "head_count_kv": 8}),
    "phi-3.5-moe": ("phimoe", {"block_count": 32, "embedding_length": 4096, "feed_forward_length": 6400,
                               "expert_count": 16, "expert_used_count": 2, "head_count": 32, "head_count_kv": 8}),
    "olmoe-1b-7b": ("olmoe", {"block_count": 16, "embedding_length": 2048, "feed_forward_length": 1024,
                              "expert_count": 64, "expert_used_count": 8, "head_count": 16, "head_count_kv": 16}),
}


def converted_header(arch: str, meta: dict, vocab: int, tied: bool) -> GGUFHeader:
    """The header such a conversion writes, held in memory (a real-width file would take gigabytes):
    its keys, the embedding and head, and per block the FFN tensors the loader of `arch` asks for."""
    keys = gguf.Keys
    names = {k: v for group in (keys.LLM, keys.Attention, keys.Rope) for k, v in vars(group).items() if k.isupper()}
    alias = {"kv_lora_rank": "KV_LORA_RANK", "q_lora_rank": "Q_LORA_RANK", "rope_dimension_count": "DIMENSION_COUNT",
             "key_length_mla": "KEY_LENGTH_MLA", "value_length_mla": "VALUE_LENGTH_MLA"}
    fields = {"general.architecture": arch}
    for helper, value in meta.items():
        const = alias.get(helper, helper.upper())
        fields[names[const].format(arch=arch)] = value
    h, n_exp, blocks = meta["embedding_length"], meta["expert_count"], meta["block_count"]
    width = meta.get("expert_feed_forward_length", meta["feed_forward_length"])
    lead, step = meta.get("leading_dense_block_count", 0), meta.get("interleave_moe_layer_step", 1)
    shared = meta.get("expert_shared_feed_forward_length", 0) or meta.get("expert_shared_count", 0) * width
    shapes = [("token_embd.weight", (h, vocab))] + ([] if tied else [("output.weight", (h, vocab))])
    for b in range(blocks):
        if b >= blocks - meta.get("nextn_predict_layers", 0):
            shapes.append((f"blk.{b}.nextn.eh_proj.weight", (2 * h, h)))
        elif b < lead or (b + 1) % step:
            shapes += [(f"blk.{b}.ffn_{p}.weight", (h, meta["feed_forward_length"])) for p in ("gate", "up")]
        else:
            shapes += [(f"blk.{b}.ffn_{p}_exps.weight", (h, width, n_exp)) for p in ("gate", "up", "down")]
            shapes += [(f"blk.{b}.ffn_up_shexp.weight", (h, shared))] if shared else []
    tensors = tuple(TensorInfo(name, "BF16", shape, 2 * math.prod(shape)) for name, shape in shapes)
    return GGUFHeader("converted.gguf", ("converted.gguf",), 3, fields, tensors)


@pytest.mark.parametrize("model", sorted(CONVERTED))
def test_each_mapping_reads_a_converted_model_as_casmoes_shipped_preset(model):
    shipped = get_preset(model)
    arch, meta = CONVERTED[model]
    preset = preset_from_header(converted_header(arch, meta, shipped.vocab, shipped.tie_embeddings))
    ignore = {"name", "source", "precision_source", "expert_precision", "dense_precision"}
    assert {k: v for k, v in preset.to_dict().items() if k not in ignore} == {
        k: v for k, v in shipped.to_dict().items() if k not in ignore}
    assert preset.total_params() == shipped.total_params()


def test_llama4_interleaved_dense_blocks_are_counted_and_said():
    """Llama-4-Maverick's layout: every second block MoE (interleave_moe_layer_step 2, llama4.cpp:
    block i is MoE when (i + 1) % 2 == 0), the others dense of feed_forward_length."""
    meta = dict(CONVERTED["llama-4-scout"][1], block_count=4, interleave_moe_layer_step=2)
    header = converted_header("llama4", meta, 202048, False)
    preset, w = preset_from_header(header), file_weights(header)
    assert w.moe_blocks == (1, 3) and len(w.dense_blocks) == 2
    assert (preset.geometry.layers, preset.dense_layers, preset.dense_intermediate) == (2, 2, 16384)
    assert preset.geometry.shared_experts == 1 and "dense blocks interleave with the MoE ones" in preset.source


def test_every_architecture_casmoe_maps_is_checked_against_a_shipped_preset():
    assert supported_architectures() == ("dbrx", "deepseek2", "glm4moe", "gpt-oss", "llama", "llama4", "olmoe",
                                          "phimoe", "qwen2moe", "qwen3moe")
    assert {arch for arch, _ in CONVERTED.values()} == set(supported_architectures())


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    (b"", "empty file"),
    (b"PK\x03\x04 not a gguf at all", "not a GGUF file"),
    (b"GGUF\x01\x00\x00\x00" + b"\x00" * 16, "GGUF version 1"),
])
def test_files_that_are_not_gguf_fail_in_one_line(tmp_path, content, words):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=words):
        read_header(path)


def test_a_truncated_file_is_named_as_such(tmp_path):
    path = qwen3moe(tmp_path / "q.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    with pytest.raises(GGUFError, match="truncated: tensor blk.3.ffn_down_exps.weight ends at byte"):
        read_header(path)
    path.write_bytes(data[:300])
    with pytest.raises(GGUFError, match="truncated: the header ends"):
        read_header(path)
    with pytest.raises(GGUFError, match="no such file"):
        read_header(tmp_path / "absent.gguf")


def test_unknown_architectures_missing_keys_and_dense_models_are_refused(tmp_path):
    path = write(tmp_path / "mamba.gguf", "mamba", {"block_count": 1},
                 [("token_embd.weight", F32, (32, 8)), ("blk.0.ffn_gate_exps.weight", F32, (32, 32, 2))])
    with pytest.raises(GGUFError, match=re.escape("architecture 'mamba' is not one casmoe maps; supported MoE "
                                                  "architectures: dbrx, deepseek2")):
        preset_from_header(read_header(path))
    with pytest.raises(GGUFError, match="no qwen3moe.expert_used_count in the header"):
        read_gguf(qwen3moe(tmp_path / "nokey.gguf", drop="expert_used_count"))
    dense = write(tmp_path / "llama.gguf", "llama", {"block_count": 1, "embedding_length": 32},
                  [("token_embd.weight", F32, (32, 8)), ("blk.0.ffn_up.weight", F32, (32, 64))])
    with pytest.raises(GGUFError, match="a dense model, not an MoE one"):
        read_gguf(dense)


def test_a_header_that_contradicts_its_tensors_is_refused(tmp_path):
    path = qwen3moe(tmp_path / "q.gguf")
    header = read_header(path)
    fields = dict(header.fields)
    fields["qwen3moe.expert_feed_forward_length"] = 512
    with pytest.raises(GGUFError, match=r"up projection \[256, 512, 4\].*but it is \[256, 256, 4\]"):
        preset_from_header(replace(header, fields=fields))


# ---- --model -----------------------------------------------------------------------------------

def test_model_takes_a_gguf_and_returns_its_preset_and_bytes(tmp_path):
    from casmoe.sim.questions.deploy.model import ModelError, resolve_model

    path = qwen3moe(tmp_path / "tiny.gguf")
    with pytest.raises(ModelError, match="no shipped preset has its shape"):
        resolve_model(str(path))
    choice = resolve_model(str(path), need_preset=False)
    assert choice.preset == "" and choice.weights == str(path) and choice.file is not None
    assert choice.model is not None and choice.model.geometry.layers == 4 and choice.file.expert[0] == 3 * 256 * 144
    shipped = resolve_model("qwen3-30b-a3b")
    assert shipped.model is get_preset("qwen3-30b-a3b") and shipped.file is None


def test_a_gguf_of_a_shipped_shape_is_priced_as_that_preset(tmp_path, monkeypatch):
    from casmoe.sim.questions.deploy import model as model_module

    real = get_preset("olmoe-1b-7b")
    path = qwen3moe(tmp_path / "OLMoE-1B-7B-Q4_K_M.gguf")
    _preset, weights = read_gguf(path)
    monkeypatch.setattr(model_module, "read_gguf", lambda p: (replace(real, vocab=50280, name="file"), weights))
    choice = model_module.resolve_model(str(path))
    assert choice.preset == "olmoe-1b-7b" and choice.weights == str(path) and choice.file is weights
    assert "priced as olmoe-1b-7b; the file differs in vocab 50280 (preset 50304)" in choice.note


def test_model_takes_a_hub_repo_id_and_says_what_to_pass_offline(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from casmoe.sim.questions.deploy.model import ModelError, resolve_model

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
                                  "hidden_size": 2048, "moe_intermediate_size": 768}))
    asked = []

    def download(repo_id: str, filename: str, **kw) -> str:
        asked.append((repo_id, filename))
        return str(config)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    choice = resolve_model("Qwen/Qwen3-30B-A3B")
    assert asked == [("Qwen/Qwen3-30B-A3B", "config.json")]
    assert choice.preset == "qwen3-30b-a3b" and choice.weights == "Qwen/Qwen3-30B-A3B"

    def offline(repo_id: str, filename: str, **kw) -> str:
        raise LocalEntryNotFoundError("offline mode is enabled and the file is not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ModelError, match=r"cannot fetch config.json of 'someone/no-such-model' from the Hugging Face "
                                         r"Hub \(offline, or no such repo\); pass a preset \(.*\), a GGUF file, a "
                                         r"config.json"):
        resolve_model("someone/no-such-model")


# ---- real-width files made by llama.cpp's own tools ------------------------------------------------

REAL = Path("/work/llama/gguf")
MANIFEST = Path("/work/llama/gguf-manifest.json")
SAME = ("heads", "kv_heads", "head_dim", "vocab", "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
        "qk_rope_head_dim", "v_head_dim", "dense_intermediate", "sliding_window", "sliding_every", "tie_embeddings")


def _real_files() -> list[tuple[Path, str]]:
    if not MANIFEST.is_file():
        return []
    manifest = json.loads(MANIFEST.read_text())
    return [(REAL / name, entry["model"]) for name, entry in sorted(manifest.items()) if (REAL / name).is_file()]


@pytest.mark.slow
@pytest.mark.parametrize("path, model", _real_files() or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="no GGUF files under /work/llama/gguf"))])
def test_real_gguf_files_have_their_shipped_presets_shape(path, model):
    preset, w = read_gguf(path)
    shipped = get_preset(model)
    g, s = preset.geometry, shipped.geometry
    assert (g.experts, g.top_k, g.shared_experts, g.hidden, g.intermediate, g.gated) == (
        s.experts, s.top_k, s.shared_experts, s.hidden, s.intermediate, s.gated)
    assert preset.dense_layers == min(shipped.dense_layers, preset.blocks - g.layers)
    assert {k: getattr(preset, k) for k in SAME} == {k: getattr(shipped, k) for k in SAME}
    assert w.total_bytes == total(w) and len(w.expert) == g.layers and not w.split_experts
    biases = 2 * g.intermediate + g.hidden  # gpt-oss's experts carry gate, up and down biases
    assert all(p in (g.expert_params, g.expert_params + biases) for p in w.expert_params)
