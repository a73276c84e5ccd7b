"""What a GGUF file stores, part by part, in bytes: the sizes casmoe prices instead of estimates.

A preset prices a model from its shape and a bits-per-weight model of a precision
(casmoe/precision.py). A GGUF file states each tensor's ggml type, so its bytes are known
exactly: which layer's `ffn_down_exps` llama.cpp's quantiser raised to Q6_K, which row widths
fell back to another type, the head kept at Q6_K, the router left at F32. `FileWeights` sums
them into the parts an offloading runtime moves or keeps: one routed expert per MoE layer (what
one copy moves), the rest of each MoE block, the dense-only blocks, the embedding and the head.

Tensor names are llama.cpp's (gguf-py `TENSOR_NAMES`): `token_embd` (MODEL_TENSOR.TOKEN_EMBD),
`output` (OUTPUT), `blk.N.*` for block N, and the routed experts merged into one tensor per
projection, `blk.N.ffn_{gate,up,down}_exps` (FFN_GATE_EXP, FFN_UP_EXP, FFN_DOWN_EXP) or
`blk.N.ffn_gate_up_exps` (FFN_GATE_UP_EXP), the expert the last dimension. Files converted
before llama.cpp merged experts (spring 2024) hold one tensor per expert, `blk.N.ffn_gate.E`
(LLM_TENSOR_FFN_GATE_EXP in src/llama-arch.cpp, "split experts for backward compatibility");
they are read and flagged, because current llama.cpp's loaders ask for the merged tensors
(src/models/llama.cpp: `ffn_down_exps` is required) and refuse such a file.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casmoe.precision import load_precisions
from casmoe.presets.gguf_header import GGUFError, GGUFHeader, TensorInfo, read_header

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_ROUTED = re.compile(r"^ffn_(?:gate|up|down|gate_up)_exps\.")
"""A merged routed-expert tensor: its weight and, where the model has them (gpt-oss), its bias."""
_SPLIT_EXPERT = re.compile(r"^ffn_(gate|up|down)\.(\d+)\.weight$")
"""A per-expert tensor of an old GGUF (llama-arch.cpp: "blk.%d.ffn_gate.%d")."""
EMBEDDING = "token_embd.weight"
HEAD = ("output.weight", "output.bias")
_GGML_PRECISION = {"BF16": "bf16", "F16": "fp16", "Q8_0": "q8_0", "Q4_0": "q4_0", "MXFP4": "mxfp4", "Q6_K": "q6_k",
                   "Q5_K": "q5_k_s", "Q3_K": "q3_k_s"}
"""casmoe precisions (casmoe/precisions.toml) that store every expert tensor in one ggml type."""
_FILE_TYPE_ALIAS = {"MOSTLY_F16": "fp16", "MOSTLY_BF16": "bf16"}


@dataclass(frozen=True)
class FileWeights:
    """The bytes a GGUF model stores, by the part an offloading runtime treats alike.

    `expert[l]` is ONE routed expert of MoE layer l (gate, up and down, their biases too: the
    merged tensors' bytes divided by `experts`), `expert_params[l]` its weights. `dense[l]` is the
    rest of that block: attention, norms, the router and any shared experts. `dense_blocks` are
    the blocks without experts (DeepSeek's and GLM's first blocks). `embedding` is the token
    table, `head` the output matrix and its bias if any (the embedding table itself when `tied`). `other` holds the
    top-level tensors besides those (the final norm, RoPE factors) and `mtp` the blocks of
    multi-token prediction, which llama.cpp skips unless asked to draft with them. So
    `total_bytes == experts * sum(expert) + sum(dense) + sum(dense_blocks) + embedding +
    (0 if tied else head) + other + mtp`: every tensor counted once, headers and padding not.

    `expert_types` and `dense_types` are the ggml types of the experts' and the MoE blocks' other
    matrices (vectors and biases left out, and the router, which llama-quantize never quantises:
    src/llama-quant.cpp skips `ffn_gate_inp.weight`), `dense_params` the weights of each `dense` part.
    `types` says in words which ggml types each part uses (the type holding most bytes, then
    the tensors and layers that differ), `file_type` the file's `general.file_type`
    (`gguf.LlamaFileType` name) and `split_experts` whether the experts are the old per-expert
    tensors, which current llama.cpp does not load.
    """

    path: str
    expert: tuple[int, ...]
    dense: tuple[int, ...]
    dense_blocks: tuple[int, ...]
    embedding: int
    head: int
    types: dict[str, str] = field(hash=False)  # words about the rest: a RunSpec holding the file is hashed
    file_type: str
    total_bytes: int
    experts: int
    expert_params: tuple[int, ...] = ()
    expert_types: tuple[str, ...] = ()
    dense_params: tuple[int, ...] = ()
    dense_types: tuple[str, ...] = ()
    moe_blocks: tuple[int, ...] = ()
    tied: bool = False
    other: int = 0
    mtp: int = 0
    split_experts: bool = False
    parts: tuple[str, ...] = field(default=())

    @property
    def layers(self) -> int:
        return len(self.expert)

    @property
    def expert_bits(self) -> float:
        """Average bits per routed-expert weight, block scales included."""
        params = sum(self.expert_params)
        return 8 * sum(self.expert) / params if params else 0.0

    def precision_name(self) -> str:
        """The precision casmoe should print for this file's experts, a name `parse_precision`
        reads: the file type's (`q4_k_m`) when every expert tensor has one of the types casmoe's
        rules for it give (fallbacks included), else the one type all expert tensors share
        (`mxfp4`, `bf16`), else their exact average width (`4.8125bpw`)."""
        known = load_precisions()
        name = _FILE_TYPE_ALIAS.get(self.file_type, self.file_type.removeprefix("MOSTLY_").lower())
        precision = known.get(name)
        if precision is not None and precision.base is not None and set(self.expert_types) <= _allowed(precision):
            return name
        if len(self.expert_types) == 1 and self.expert_types[0] in _GGML_PRECISION:
            return _GGML_PRECISION[self.expert_types[0]]
        return f"{round(self.expert_bits, 4):g}bpw"

    def dense_precision_name(self) -> str:
        """The same for the MoE blocks' dense part: the one ggml type of its matrices when casmoe
        names it, else its exact average width, norms included (what a preset's dense part counts)."""
        if len(self.dense_types) == 1 and self.dense_types[0] in _GGML_PRECISION:
            return _GGML_PRECISION[self.dense_types[0]]
        params = sum(self.dense_params)
        return f"{round(8 * sum(self.dense) / params, 4):g}bpw" if params else "bf16"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "parts": list(self.parts), "file_type": self.file_type,
                "precision": self.precision_name(), "split_experts": self.split_experts, "experts": self.experts,
                "moe_blocks": list(self.moe_blocks), "expert": list(self.expert),
                "expert_params": list(self.expert_params), "expert_types": list(self.expert_types),
                "dense": list(self.dense), "dense_params": list(self.dense_params),
                "dense_types": list(self.dense_types), "dense_blocks": list(self.dense_blocks), "embedding": self.embedding,
                "head": self.head, "tied": self.tied, "other": self.other, "mtp": self.mtp,
                "total_bytes": self.total_bytes, "types": dict(self.types)}


def _allowed(precision: Any) -> set[str]:
    """ggml types a llama.cpp file type may give an expert tensor: its types and their fallbacks."""
    names = set()
    for t in precision.types:
        while t is not None:
            names.add(t.name)
            t = t.fallback
    return names


def _file_type(value: Any) -> str:
    if value is None:
        return ""
    import gguf

    try:
        return gguf.LlamaFileType(value).name
    except ValueError:
        return f"file type {value}"


def _trunk_blocks(header: GGUFHeader) -> int:
    """Blocks the model runs: `block_count` less the multi-token-prediction blocks after them
    (gguf.Keys.LLM.BLOCK_COUNT, NEXTN_PREDICT_LAYERS; llama_hparams::n_layer() in src/llama-hparams.cpp)."""
    import gguf

    arch = header.architecture
    blocks = header.get(gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    if not isinstance(blocks, int) or blocks < 1:
        raise GGUFError(f"{header.path}: no {gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)} in the header")
    nextn = header.get(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch), 0)
    return blocks - (nextn if isinstance(nextn, int) else 0)


def file_weights(source: GGUFHeader | str | Path) -> FileWeights:
    """The stored bytes of the GGUF model at `source` (a path, or a header already read)."""
    header = source if isinstance(source, GGUFHeader) else read_header(source)
    trunk = _trunk_blocks(header)
    blocks: dict[int, list[tuple[str, TensorInfo]]] = defaultdict(list)
    embedding = head = other = mtp = 0
    tied = "output.weight" not in header.by_name
    for t in header.tensors:
        m = _BLOCK.match(t.name)
        if m is None:
            if t.name == EMBEDDING:
                embedding += t.n_bytes
            elif t.name in HEAD:
                head += t.n_bytes
            else:
                other += t.n_bytes
        elif int(m[1]) >= trunk:
            mtp += t.n_bytes
        else:
            blocks[int(m[1])].append((m[2], t))
    if tied:
        head = embedding
    if embedding == 0:
        raise GGUFError(f"{header.path}: no {EMBEDDING} tensor: not a language model casmoe can read")
    split = any(_SPLIT_EXPERT.match(role) for ts in blocks.values() for role, _ in ts)
    routed = _SPLIT_EXPERT if split else _ROUTED
    moe = tuple(b for b in range(trunk) if any(routed.match(role) for role, _ in blocks[b]))
    if not moe:
        raise GGUFError(f"{header.path}: no routed-expert tensors (blk.N.ffn_*_exps): a dense model, not an MoE one")
    n_experts = _expert_count(header, blocks, moe, split)
    expert, params, dense, dense_params, types, dense_types = [], [], [], [], set(), set()
    for b in moe:
        mine = [t for role, t in blocks[b] if routed.match(role)]
        total = sum(t.n_bytes for t in mine)
        if total % n_experts:
            raise GGUFError(f"{header.path}: block {b}'s expert tensors ({total} bytes) do not split into "
                            f"{n_experts} equal experts")
        expert.append(total // n_experts)
        params.append(sum(t.elements for t in mine) // n_experts)
        types |= {t.type for role, t in blocks[b] if routed.match(role) and not role.endswith(".bias")}
        rest = [(role, t) for role, t in blocks[b] if not routed.match(role)]
        dense.append(sum(t.n_bytes for _, t in rest))
        dense_params.append(sum(t.elements for _, t in rest))
        dense_types |= {t.type for role, t in rest
                        if len(t.shape) > 1 and not role.endswith(".bias") and not role.startswith("ffn_gate_inp")}
    dense_blocks = tuple(sum(t.n_bytes for _, t in blocks[b]) for b in range(trunk) if b not in moe)
    return FileWeights(
        path=header.path, expert=tuple(expert), dense=tuple(dense), dense_blocks=dense_blocks,
        embedding=embedding, head=head, types=_summaries(header, blocks, set(moe), routed, tied),
        file_type=_file_type(header.get("general.file_type")),  # gguf.Keys.General.FILE_TYPE
        total_bytes=sum(t.n_bytes for t in header.tensors), experts=n_experts, expert_params=tuple(params),
        expert_types=tuple(sorted(types)), dense_params=tuple(dense_params), dense_types=tuple(sorted(dense_types)),
        moe_blocks=moe, tied=tied, other=other, mtp=mtp, split_experts=split,
        parts=header.parts)


def _expert_count(header: GGUFHeader, blocks: dict[int, list[tuple[str, TensorInfo]]], moe: tuple[int, ...],
                  split: bool) -> int:
    """Routed experts per layer: the merged tensors' last dimension, or the per-expert tensors'
    distinct indices, checked against `expert_count` (gguf.Keys.LLM.EXPERT_COUNT) where present."""
    import gguf

    counts = set()
    for b in moe:
        if split:
            counts.add(len({m[2] for role, _ in blocks[b] if (m := _SPLIT_EXPERT.match(role))}))
        else:
            counts |= {t.shape[-1] for role, t in blocks[b] if _ROUTED.match(role)}
    key = gguf.Keys.LLM.EXPERT_COUNT.format(arch=header.architecture)
    stated = header.get(key)
    if len(counts) != 1 or (stated is not None and counts != {stated}):
        raise GGUFError(f"{header.path}: the expert tensors hold {sorted(counts)} experts per layer, {key} says "
                        f"{stated}")
    return counts.pop()


def _category(role: str, t: TensorInfo, moe: bool, routed: re.Pattern[str]) -> str:
    """Which part of `types` a block tensor is summarised under."""
    if len(t.shape) == 1 or role.endswith(".bias"):
        return "norms and biases"
    if moe and routed.match(role):
        return "experts"
    if "_shexp" in role:
        return "shared experts"
    if role.startswith("ffn_gate_inp"):
        return "router"
    if role.startswith("attn_"):
        return "attention"
    if role.startswith("ffn_"):
        return "dense FFN" if not moe else "other"
    return "other"


def _summaries(header: GGUFHeader, blocks: dict[int, list[tuple[str, TensorInfo]]], moe: set[int],
               routed: re.Pattern[str], tied: bool) -> dict[str, str]:
    parts: dict[str, list[tuple[str, int, TensorInfo]]] = defaultdict(list)
    for b in sorted(blocks):
        for role, t in blocks[b]:
            category = _category(role, t, b in moe, routed)
            if category == "experts" and (m := _SPLIT_EXPERT.match(role)):
                role = f"ffn_{m[1]}.E"  # the per-expert tensors of one projection summarised together
            parts[category].append((role.removesuffix(".weight"), b, t))
    order = ("experts", "attention", "router", "shared experts", "dense FFN", "other", "norms and biases")
    out = {name: _summary(parts[name]) for name in order if parts.get(name)}
    embd = header.by_name[EMBEDDING]
    out["embedding"] = embd.type
    out["head"] = f"{embd.type} (tied to the embedding)" if tied else header.by_name["output.weight"].type
    return out


def _summary(rows: Iterable[tuple[str, int, TensorInfo]]) -> str:
    """'Q4_K; ffn_down_exps Q6_K in 24 of 48 layers': the type holding most bytes, then each
    tensor that differs and in how many of the layers that have it."""
    rows = list(rows)
    weight: dict[str, int] = defaultdict(int)
    for _, _, t in rows:
        weight[t.type] += t.n_bytes
    base = max(weight, key=lambda k: (weight[k], k))
    layers: dict[str, set[int]] = defaultdict(set)
    differ: dict[tuple[str, str], set[int]] = defaultdict(set)
    for role, b, t in rows:
        layers[role].add(b)
        if t.type != base:
            differ[(role, t.type)].add(b)
    notes = []
    for (role, kind), where in differ.items():
        n, of = len(where), len(layers[role])
        notes.append(f"{role} {kind}" + (f" in {n} of {of} layers" if n < of else ""))
    return base + ("; " + ", ".join(notes) if notes else "")
