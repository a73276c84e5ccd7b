"""Tiny GGUF files written with gguf-py's own writer (`gguf.GGUFWriter`, its `add_*` helpers
naming every key), with llama.cpp's tensor names and raw bytes of the right size per ggml type:
the models of the GGUF reader's tests and of the plans made from a user's GGUF.

Every byte count is worked out by hand from the block sizes of ggml-common.h (Q4_K 144 bytes per
256 weights, Q6_K 210, Q8_0 34 per 32, Q4_0 18 per 32, MXFP4 17 per 32, F32 4 per weight, BF16 2).
Importing this module needs gguf (`pytest.importorskip("gguf")` first).
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
F32, BF16, Q4_K, Q6_K, Q8_0, Q4_0, MXFP4 = Q.F32, Q.BF16, Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.MXFP4


def nbytes(qtype: Q, *shape: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


def write(path: Path, arch: str, meta: dict, tensors: list[tuple[str, Q, tuple[int, ...]]], split: int = 0,
          file_type: int | None = None, tokens: int = 0) -> Path:
    """A GGUF at `path`: `meta` calls the writer's add_* helper of each key, `tensors` are
    (name, ggml type, shape in ggml order) filled with zero bytes of the right size."""
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split)
    for helper, value in meta.items():
        getattr(w, f"add_{helper}")(value)
    if file_type is not None:
        w.add_file_type(file_type)
    if tokens:
        w.add_token_list([f"t{i}" for i in range(tokens)])
        w.add_token_scores([0.0] * tokens)
    for name, qtype, shape in tensors:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = (*reversed(shape[1:]), shape[0] // block * size)  # numpy order, the row as bytes
        w.add_tensor(name, np.zeros(raw, np.uint8), raw_shape=raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the models --------------------------------------------------------------------------------

H, V = 256, 512  # hidden width, vocabulary
MORE_BITS = {2, 3}  # use_more_bits(i, 4) in llama-quant.cpp: i >= 7*4/8 = 3, or (i - 0) % 3 == 2


def qwen3moe(path: Path, split: int = 0, drop: str = "", tokens: int = 0) -> Path:
    """Qwen3-MoE at Q4_K_M as llama-quantize makes it: Q4_K, with ffn_down_exps and attn_v raised
    to Q6_K where use_more_bits holds, the router and norms F32, the head Q6_K. 4 blocks, 4
    experts of width 256, top-2, 4 heads of 64 sharing 2 K/V heads."""
    meta = {"block_count": 4, "embedding_length": H, "feed_forward_length": 1024, "expert_feed_forward_length": 256,
            "expert_count": 4, "expert_used_count": 2, "head_count": 4, "head_count_kv": 2, "key_length": 64,
            "value_length": 64, "context_length": 4096}
    meta.pop(drop, None)
    tensors = [("token_embd.weight", Q4_K, (H, V)), ("output_norm.weight", F32, (H,)), ("output.weight", Q6_K, (H, V))]
    for i in range(4):
        more = Q6_K if i in MORE_BITS else Q4_K
        tensors += [(f"blk.{i}.attn_norm.weight", F32, (H,)), (f"blk.{i}.attn_q.weight", Q4_K, (H, 256)),
                    (f"blk.{i}.attn_k.weight", Q4_K, (H, 128)), (f"blk.{i}.attn_v.weight", more, (H, 128)),
                    (f"blk.{i}.attn_output.weight", Q4_K, (256, H)), (f"blk.{i}.attn_q_norm.weight", F32, (64,)),
                    (f"blk.{i}.attn_k_norm.weight", F32, (64,)), (f"blk.{i}.ffn_norm.weight", F32, (H,)),
                    (f"blk.{i}.ffn_gate_inp.weight", F32, (H, 4)), (f"blk.{i}.ffn_gate_exps.weight", Q4_K, (H, 256, 4)),
                    (f"blk.{i}.ffn_up_exps.weight", Q4_K, (H, 256, 4)),
                    (f"blk.{i}.ffn_down_exps.weight", more, (256, H, 4))]
    return write(path, "qwen3moe", meta, tensors, split, file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M, tokens=tokens)


def deepseek2(path: Path) -> Path:
    """DeepSeek-V2-Lite's layout at Q8_0: MLA without a query LoRA (2 heads, no-RoPE key 64, RoPE
    key 32, value 64, latent 64; the key/value up-projection split into attn_k_b and attn_v_b as
    current llama.cpp converts it), one leading dense block of width 512, then 2 MoE blocks of 4
    experts of width 128 plus 2 shared ones; the embeddings tied (no output.weight)."""
    meta = {"block_count": 3, "embedding_length": H, "feed_forward_length": 512, "expert_feed_forward_length": 128,
            "expert_count": 4, "expert_used_count": 2, "expert_shared_count": 2, "leading_dense_block_count": 1,
            "head_count": 2, "head_count_kv": 1, "key_length": 96, "value_length": 64, "key_length_mla": 96,
            "value_length_mla": 64, "kv_lora_rank": 64, "rope_dimension_count": 32, "vocab_size": V}
    tensors = [("token_embd.weight", Q8_0, (H, V)), ("output_norm.weight", F32, (H,))]
    for i in range(3):
        tensors += [(f"blk.{i}.attn_norm.weight", F32, (H,)), (f"blk.{i}.attn_q.weight", Q8_0, (H, 2 * 96)),
                    (f"blk.{i}.attn_kv_a_mqa.weight", Q8_0, (H, 64 + 32)),
                    (f"blk.{i}.attn_kv_a_norm.weight", F32, (64,)), (f"blk.{i}.attn_k_b.weight", Q8_0, (64, 64, 2)),
                    (f"blk.{i}.attn_v_b.weight", Q8_0, (64, 64, 2)), (f"blk.{i}.attn_output.weight", Q8_0, (128, H)),
                    (f"blk.{i}.ffn_norm.weight", F32, (H,))]
        if i == 0:
            tensors += [(f"blk.0.ffn_{p}.weight", Q8_0, (H, 512) if p != "down" else (512, H))
                        for p in ("gate", "up", "down")]
        else:
            tensors += [(f"blk.{i}.ffn_gate_inp.weight", F32, (H, 4)),
                        (f"blk.{i}.ffn_gate_exps.weight", Q8_0, (H, 128, 4)),
                        (f"blk.{i}.ffn_up_exps.weight", Q8_0, (H, 128, 4)),
                        (f"blk.{i}.ffn_down_exps.weight", Q8_0, (128, H, 4)),
                        (f"blk.{i}.ffn_gate_shexp.weight", Q8_0, (H, 256)),
                        (f"blk.{i}.ffn_up_shexp.weight", Q8_0, (H, 256)),
                        (f"blk.{i}.ffn_down_shexp.weight", Q8_0, (256, H))]
    return write(path, "deepseek2", meta, tensors, file_type=gguf.LlamaFileType.MOSTLY_Q8_0)


def gpt_oss(path: Path) -> Path:
    """gpt-oss at MXFP4_MOE: MXFP4 experts with F32 biases, gate and up merged into one tensor
    (ffn_gate_up_exps, which llama.cpp loads before the separate pair), BF16 attention with
    biases and sinks, 128-token windows (the pattern left to openai-moe.cpp's default of 2)."""
    meta = {"block_count": 2, "embedding_length": H, "feed_forward_length": 256, "expert_feed_forward_length": 256,
            "expert_count": 4, "expert_used_count": 2, "head_count": 4, "head_count_kv": 2, "key_length": 64,
            "value_length": 64, "sliding_window": 128}
    tensors = [("token_embd.weight", Q8_0, (H, V)), ("output_norm.weight", F32, (H,)), ("output.weight", BF16, (H, V))]
    for i in range(2):
        tensors += [(f"blk.{i}.attn_norm.weight", F32, (H,)), (f"blk.{i}.post_attention_norm.weight", F32, (H,)),
                    (f"blk.{i}.attn_sinks.weight", F32, (4,))]
        tensors += [(f"blk.{i}.attn_{p}.{k}", BF16 if k == "weight" else F32, s if k == "weight" else s[1:])
                    for p, s in (("q", (H, 256)), ("k", (H, 128)), ("v", (H, 128)), ("output", (256, H)))
                    for k in ("weight", "bias")]
        tensors += [(f"blk.{i}.ffn_gate_inp.weight", F32, (H, 4)), (f"blk.{i}.ffn_gate_inp.bias", F32, (4,)),
                    (f"blk.{i}.ffn_gate_up_exps.weight", MXFP4, (H, 512, 4)),
                    (f"blk.{i}.ffn_gate_up_exps.bias", F32, (512, 4)),
                    (f"blk.{i}.ffn_down_exps.weight", MXFP4, (256, H, 4)),
                    (f"blk.{i}.ffn_down_exps.bias", F32, (H, 4))]
    return write(path, "gpt-oss", meta, tensors, file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE)


def mixtral_split(path: Path) -> Path:
    """A Mixtral GGUF from before llama.cpp merged experts: `blk.N.ffn_gate.E.weight` per expert, Q4_0."""
    meta = {"block_count": 2, "embedding_length": H, "feed_forward_length": 256, "expert_count": 4,
            "expert_used_count": 2, "head_count": 4, "head_count_kv": 2}
    tensors = [("token_embd.weight", Q4_0, (H, V)), ("output_norm.weight", F32, (H,)), ("output.weight", Q8_0, (H, V))]
    for i in range(2):
        tensors += [(f"blk.{i}.attn_norm.weight", F32, (H,)), (f"blk.{i}.attn_q.weight", Q4_0, (H, H)),
                    (f"blk.{i}.attn_k.weight", Q4_0, (H, 128)), (f"blk.{i}.attn_v.weight", Q4_0, (H, 128)),
                    (f"blk.{i}.attn_output.weight", Q4_0, (H, H)), (f"blk.{i}.ffn_norm.weight", F32, (H,)),
                    (f"blk.{i}.ffn_gate_inp.weight", F32, (H, 4))]
        tensors += [(f"blk.{i}.ffn_{p}.{e}.weight", Q4_0, (256, H) if p == "down" else (H, 256))
                    for e in range(4) for p in ("gate", "up", "down")]
    return write(path, "llama", meta, tensors, file_type=gguf.LlamaFileType.MOSTLY_Q4_0)


def glm4moe(path: Path) -> Path:
    """GLM-4.5's layout at BF16: one leading dense block, 2 MoE blocks with one shared expert,
    and one multi-token-prediction block after them (nextn_predict_layers 1, counted in block_count)."""
    meta = {"block_count": 4, "nextn_predict_layers": 1, "embedding_length": H, "feed_forward_length": 512,
            "expert_feed_forward_length": 128, "expert_count": 4, "expert_used_count": 2, "expert_shared_count": 1,
            "leading_dense_block_count": 1, "head_count": 4, "head_count_kv": 2, "key_length": 64, "value_length": 64}
    tensors = [("token_embd.weight", BF16, (H, V)), ("output_norm.weight", F32, (H,)), ("output.weight", BF16, (H, V))]
    for i in range(4):
        tensors += [(f"blk.{i}.attn_norm.weight", F32, (H,)), (f"blk.{i}.attn_q.weight", BF16, (H, 256)),
                    (f"blk.{i}.attn_k.weight", BF16, (H, 128)), (f"blk.{i}.attn_v.weight", BF16, (H, 128)),
                    (f"blk.{i}.attn_output.weight", BF16, (256, H)), (f"blk.{i}.post_attention_norm.weight", F32, (H,))]
        if i == 0:
            tensors += [(f"blk.0.ffn_{p}.weight", BF16, (H, 512) if p != "down" else (512, H))
                        for p in ("gate", "up", "down")]
        else:
            tensors += [(f"blk.{i}.ffn_gate_inp.weight", F32, (H, 4)), (f"blk.{i}.exp_probs_b.bias", F32, (4,)),
                        (f"blk.{i}.ffn_gate_exps.weight", BF16, (H, 128, 4)),
                        (f"blk.{i}.ffn_up_exps.weight", BF16, (H, 128, 4)),
                        (f"blk.{i}.ffn_down_exps.weight", BF16, (128, H, 4)),
                        (f"blk.{i}.ffn_gate_shexp.weight", BF16, (H, 128)),
                        (f"blk.{i}.ffn_up_shexp.weight", BF16, (H, 128)),
                        (f"blk.{i}.ffn_down_shexp.weight", BF16, (128, H))]
        if i == 3:
            tensors += [("blk.3.nextn.eh_proj.weight", BF16, (2 * H, H)), ("blk.3.nextn.enorm.weight", F32, (H,))]
    return write(path, "glm4moe", meta, tensors, file_type=gguf.LlamaFileType.MOSTLY_BF16)
