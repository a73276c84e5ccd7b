"""A `ModelPreset` read from the user's own GGUF file instead of casmoe's table.

A GGUF header states the hyperparameters llama.cpp runs the model with, under key names that
gguf-py defines (`gguf.Keys`: `{arch}.block_count`, `{arch}.expert_count`, ...). Each
architecture reads its own subset, in its `load_arch_hparams` and `load_arch_tensors`
(llama.cpp src/models/<arch>.cpp at commit 0c1e570); `_arches`
says, per architecture casmoe maps, which keys give the routed experts' width, the shared
experts, the dense blocks and the attention, naming the file each rule was read from. The
tensors' shapes are then checked against those numbers, so a mapping that reads the wrong key
fails here rather than pricing the wrong model.

The preset's precisions come from the file (`FileWeights.precision_name` for the experts; the
dense part's one ggml type, or its exact average width), so sizes priced from the preset are
close to the file's; `casmoe.presets.weights.FileWeights` holds the exact bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from casmoe.geometry import Geometry
from casmoe.precision import parse_precision
from casmoe.presets import Attention, ModelPreset, get_preset
from casmoe.presets.gguf_header import SPLIT_NAME, GGUFError, GGUFHeader, read_header
from casmoe.presets.weights import FileWeights, file_weights


@dataclass(frozen=True)
class _Arch:
    """How one llama.cpp architecture states an MoE model's shape in GGUF keys.

    `expert_width`: the gguf.Keys.LLM constant holding a routed expert's FFN width;
    `width_fallback`: llama.cpp falls back to feed_forward_length / expert_used_count without it;
    `leading_dense`: the first LEADING_DENSE_BLOCK_COUNT blocks have a plain FFN of
    FEED_FORWARD_LENGTH; `interleave`: every INTERLEAVE_MOE_LAYER_STEP-th block is MoE, the
    others dense; `shared`: "count" (EXPERT_SHARED_COUNT expert-wide MLPs), "width" (one MLP of
    EXPERT_SHARED_FEED_FORWARD_LENGTH, counted in expert widths) or "one" (one MLP of the expert
    width); `mla`: DeepSeek's latent attention; `swa_pattern`: the default period of
    sliding-window layers when the file has a SLIDING_WINDOW (0: windows not read)."""

    source: str
    expert_width: str
    width_fallback: bool = False
    leading_dense: bool = False
    interleave: bool = False
    shared: str = ""
    mla: bool = False
    swa_pattern: int = 0


@cache
def _arches() -> dict[str, _Arch]:
    """The architectures casmoe maps, by their GGUF name (gguf.MODEL_ARCH_NAMES)."""
    from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, Keys

    name, exp, ff = MODEL_ARCH_NAMES, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.FEED_FORWARD_LENGTH
    return {
        # n_ff_exp from EXPERT_FEED_FORWARD_LENGTH, else n_ff / n_expert_used; no shared experts
        name[MODEL_ARCH.QWEN3MOE]: _Arch("src/models/qwen3moe.cpp", exp, width_fallback=True),
        # as qwen3moe, plus one shared MLP of EXPERT_SHARED_FEED_FORWARD_LENGTH (ffn_*_shexp)
        name[MODEL_ARCH.QWEN2MOE]: _Arch("src/models/qwen2moe.cpp", exp, width_fallback=True, shared="width"),
        # n_ff_exp from EXPERT_FEED_FORWARD_LENGTH; SLIDING_WINDOW, load_swa_pattern(ml, 2)
        name[MODEL_ARCH.GPT_OSS]: _Arch("src/models/openai-moe.cpp", exp, swa_pattern=2),
        # Mixtral: an expert's width is n_ff (FEED_FORWARD_LENGTH); a shared MLP only if n_ff_shexp > 0
        name[MODEL_ARCH.LLAMA]: _Arch("src/models/llama.cpp", ff, shared="width"),
        # MLA; n_layer_dense_lead dense blocks of n_ff; n_expert_shared MLPs of n_ff_exp
        name[MODEL_ARCH.DEEPSEEK2]: _Arch("src/models/deepseek2.cpp", exp, leading_dense=True, shared="count",
                                          mla=True),
        # n_layer_dense_lead dense blocks; n_ff_shexp = n_ff_exp * n_expert_shared; n_ff_exp falls back
        name[MODEL_ARCH.GLM4_MOE]: _Arch("src/models/glm4-moe.cpp", exp, width_fallback=True, leading_dense=True,
                                         shared="count"),
        # block i is MoE when (i + 1) % n_moe_layer_step == 0; each has one shared MLP of n_ff_exp
        name[MODEL_ARCH.LLAMA4]: _Arch("src/models/llama4.cpp", exp, interleave=True, shared="one"),
        # experts of n_ff (FEED_FORWARD_LENGTH), fused attn_qkv
        name[MODEL_ARCH.DBRX]: _Arch("src/models/dbrx.cpp", ff),
        # experts of n_ff
        name[MODEL_ARCH.PHIMOE]: _Arch("src/models/phimoe.cpp", ff),
        # experts of n_ff
        name[MODEL_ARCH.OLMOE]: _Arch("src/models/olmoe.cpp", ff),
    }


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(_arches()))


class _Meta:
    """The header's keys of one architecture, read as llama.cpp's `get_key_or_arr` does: a
    number, or a per-layer array of one value."""

    def __init__(self, header: GGUFHeader, arch: str) -> None:
        self.header, self.arch = header, arch

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def get(self, template: str, default: int | None = None) -> int | None:
        key = self.key(template)
        value = self.header.get(key)
        if value is None:
            return default
        if isinstance(value, tuple):
            distinct = {v for v in value if v}
            if len(distinct) > 1:
                raise GGUFError(f"{self.header.path}: {key} varies by layer ({sorted(distinct)}); casmoe's presets "
                                "hold one value")
            value = distinct.pop() if distinct else 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise GGUFError(f"{self.header.path}: {key} is {value!r}, not an integer")
        return value

    def need(self, template: str) -> int:
        value = self.get(template)
        if value is None:
            raise GGUFError(f"{self.header.path}: no {self.key(template)} in the header ({self.arch} needs it; "
                            "re-convert the model with a current llama.cpp)")
        return value


def preset_name(path: str | Path) -> str:
    """A preset name for a GGUF: its file name without `.gguf` or the split suffix."""
    name = Path(path).name
    m = SPLIT_NAME.match(name)
    return m["prefix"] if m else name.removesuffix(".gguf")


def model_preset(model: str) -> ModelPreset:
    """The preset a `--model` names: a preset's name, or a GGUF file's header (its shapes as
    the file states them)."""
    if str(model).lower().endswith(".gguf"):
        return read_gguf(model)[0]
    return get_preset(model)


def read_gguf(path: str | Path) -> tuple[ModelPreset, FileWeights]:
    """The model of the GGUF at `path` (one file or any part of a split set) and its stored bytes."""
    header = read_header(path)
    weights = file_weights(header)
    return preset_from_header(header, weights), weights


def preset_from_header(header: GGUFHeader, weights: FileWeights | None = None) -> ModelPreset:
    """The `ModelPreset` a GGUF header describes (see the module docstring)."""
    import gguf

    keys, arch = gguf.Keys, header.architecture
    spec = _arches().get(arch)
    if spec is None:
        raise GGUFError(f"{header.path}: architecture {arch!r} is not one casmoe maps; supported MoE "
                        f"architectures: {', '.join(supported_architectures())}")
    meta = _Meta(header, arch)
    experts = meta.get(keys.LLM.EXPERT_COUNT)
    if not experts:
        raise GGUFError(f"{header.path}: {arch} without {meta.key(keys.LLM.EXPERT_COUNT)}: a dense model, not MoE")
    weights = weights or file_weights(header)
    blocks = meta.need(keys.LLM.BLOCK_COUNT) - meta.get(keys.LLM.NEXTN_PREDICT_LAYERS, 0)
    hidden = meta.need(keys.LLM.EMBEDDING_LENGTH)
    top_k = meta.need(keys.LLM.EXPERT_USED_COUNT)
    ff = meta.get(keys.LLM.FEED_FORWARD_LENGTH, 0)
    width = meta.get(spec.expert_width)
    if width is None and spec.width_fallback and ff:
        width = ff // top_k  # llama.cpp: n_ff_exp ? n_ff_exp : n_ff / n_expert_used
    if not width:
        raise GGUFError(f"{header.path}: no {meta.key(spec.expert_width)} in the header ({arch} needs it)")
    moe = _moe_blocks(meta, spec, blocks, weights)
    dense_layers = blocks - len(moe)
    source = f"GGUF header of {Path(header.path).name} ({arch}, read as llama.cpp {spec.source} reads it)"
    if spec.interleave and dense_layers and moe != tuple(range(dense_layers, blocks)):
        source += f"; its {dense_layers} dense blocks interleave with the MoE ones, counted here as if first"
    gated = _check_expert_shape(header, weights, hidden, width)
    embd = header.by_name["token_embd.weight"]
    extra: dict[str, Any] = {}
    if spec.mla:
        extra = _mla(meta)
    else:
        heads = meta.need(keys.Attention.HEAD_COUNT)
        extra["heads"] = heads
        extra["kv_heads"] = meta.get(keys.Attention.HEAD_COUNT_KV, heads)
        extra["head_dim"] = meta.get(keys.Attention.KEY_LENGTH, hidden // heads)
    if spec.swa_pattern:
        extra.update(_windows(meta, spec.swa_pattern, blocks))
    expert_precision, dense_precision, how = _precisions(weights)
    return ModelPreset(
        name=preset_name(header.path), source=source,
        geometry=_geometry(meta, spec, len(moe), experts, top_k, hidden, width, gated, header),
        vocab=embd.shape[1], dense_layers=dense_layers, dense_intermediate=ff if dense_layers else 0,
        tie_embeddings=weights.tied, expert_precision=expert_precision, dense_precision=dense_precision,
        precision_source=how, **extra)


def _geometry(meta: _Meta, spec: _Arch, layers: int, experts: int, top_k: int, hidden: int, width: int,
              gated: bool, header: GGUFHeader) -> Any:
    import gguf

    shared = 0
    if spec.shared == "count":
        shared = meta.need(gguf.Keys.LLM.EXPERT_SHARED_COUNT)
    elif spec.shared == "one":
        shared = 1
    elif spec.shared == "width":
        shexp = next((t for t in header.tensors if t.name.endswith(".ffn_up_shexp.weight")), None)
        shared_width = meta.get(gguf.Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH) or (shexp.shape[1] if shexp else 0)
        if shared_width % width:
            raise GGUFError(f"{header.path}: the shared expert's width {shared_width} is not a whole number of "
                            f"expert widths ({width}); casmoe counts shared experts in expert-sized units")
        shared = shared_width // width
    return Geometry(layers=layers, experts=experts, top_k=top_k, shared_experts=shared, hidden=hidden,
                    intermediate=width, gated=gated)


def _moe_blocks(meta: _Meta, spec: _Arch, blocks: int, weights: FileWeights) -> tuple[int, ...]:
    """The blocks the keys make MoE, checked against the blocks whose tensors hold experts."""
    import gguf

    if spec.leading_dense:
        lead = meta.get(gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)
        moe = tuple(range(lead, blocks))
        how = f"{meta.key(gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT)} = {lead}"
    elif spec.interleave:
        step = meta.need(gguf.Keys.LLM.INTERLEAVE_MOE_LAYER_STEP)
        moe = tuple(b for b in range(blocks) if step and (b + 1) % step == 0)
        how = f"{meta.key(gguf.Keys.LLM.INTERLEAVE_MOE_LAYER_STEP)} = {step}"
    else:
        moe = tuple(range(blocks))
        how = f"{meta.arch} (every block MoE)"
    if moe != weights.moe_blocks:
        raise GGUFError(f"{meta.header.path}: {len(weights.moe_blocks)} blocks hold experts but {how} makes "
                        f"{len(moe)} of {blocks} MoE")
    return moe


def _check_expert_shape(header: GGUFHeader, weights: FileWeights, hidden: int, width: int) -> bool:
    """Whether the experts are gated, after checking the first MoE block's up projection has the
    shape the keys say ([hidden, width, experts] in ggml order)."""
    block = weights.moe_blocks[0]
    prefix = f"blk.{block}."
    mine = {t.name[len(prefix):]: t for t in header.tensors if t.name.startswith(prefix)}
    if weights.split_experts:
        up, want = mine.get("ffn_up.0.weight"), (hidden, width)
        gated = "ffn_gate.0.weight" in mine
    elif "ffn_gate_up_exps.weight" in mine:
        up, want, gated = mine["ffn_gate_up_exps.weight"], (hidden, 2 * width, weights.experts), True
    else:
        up, want = mine.get("ffn_up_exps.weight"), (hidden, width, weights.experts)
        gated = "ffn_gate_exps.weight" in mine
    if up is None or up.shape != want:
        got = f"is {list(up.shape)}" if up is not None else "is missing"
        raise GGUFError(f"{header.path}: the header's widths make block {block}'s up projection {list(want)} (ggml "
                        f"order), but it {got}")
    return gated


def _mla(meta: _Meta) -> dict[str, Any]:
    """DeepSeek's latent attention (src/models/deepseek2.cpp). Files converted since llama.cpp
    split `attn_kv_b` store the per-head widths under KEY_LENGTH_MLA / VALUE_LENGTH_MLA (KEY_LENGTH
    is then the latent plus the RoPE key, the MQA view); older files store them as KEY_LENGTH /
    VALUE_LENGTH. The RoPE part is ROPE_DIMENSION_COUNT; Q_LORA_RANK is absent for V2-Lite."""
    from gguf import Keys

    heads = meta.need(Keys.Attention.HEAD_COUNT)
    if meta.get(Keys.Attention.KEY_LENGTH_MLA) is not None:
        qk, v = meta.need(Keys.Attention.KEY_LENGTH_MLA), meta.need(Keys.Attention.VALUE_LENGTH_MLA)
    else:
        qk, v = meta.need(Keys.Attention.KEY_LENGTH), meta.need(Keys.Attention.VALUE_LENGTH)
    rope = meta.need(Keys.Rope.DIMENSION_COUNT)
    return {"attention": Attention.MLA, "heads": heads, "kv_heads": heads, "head_dim": qk,
            "q_lora_rank": meta.get(Keys.Attention.Q_LORA_RANK, 0), "kv_lora_rank": meta.need(Keys.Attention.KV_LORA_RANK),
            "qk_nope_head_dim": qk - rope, "qk_rope_head_dim": rope, "v_head_dim": v}


def _windows(meta: _Meta, default: int, blocks: int) -> dict[str, int]:
    """Sliding windows: SLIDING_WINDOW tokens, one full-attention block in every
    SLIDING_WINDOW_PATTERN (the last of each group, llama_hparams::set_swa_pattern), or the
    per-block array of that key when it is one."""
    from gguf import Keys

    window = meta.get(Keys.Attention.SLIDING_WINDOW, 0)
    if not window:
        return {}
    key = meta.key(Keys.Attention.SLIDING_WINDOW_PATTERN)
    pattern = meta.header.get(key, default)
    if isinstance(pattern, tuple):  # is_swa per block
        every = next((p for p in range(2, blocks + 1)
                      if all(bool(s) == (i % p < p - 1) for i, s in enumerate(pattern[:blocks]))), 0)
        if not every:
            raise GGUFError(f"{meta.header.path}: {key} is not one full block in every N; casmoe cannot model it")
        pattern = every
    if not isinstance(pattern, int) or pattern < 2:
        raise GGUFError(f"{meta.header.path}: {key} = {pattern!r}: casmoe models one full block in every N >= 2")
    return {"sliding_window": window, "sliding_every": pattern}


def _precisions(weights: FileWeights) -> tuple[Any, Any, str]:
    """The preset's expert and dense precisions, from what the file stores."""
    expert, dense = weights.precision_name(), weights.dense_precision_name()
    how = (f"the file's tensors: experts {expert} ({weights.types['experts']}), the MoE blocks' other weights {dense}; "
           f"file type {weights.file_type or 'not stated'}")
    return parse_precision(expert), parse_precision(dense), how
