"""Model presets: named MoE models loaded from `models.toml` into validated `ModelPreset`s.

A preset is data (STYLE principle 5): adding a model is adding a TOML table, every number with
the config it was read from. It holds what prices a token: the routed experts (`Geometry`), the
attention (MHA, GQA, or DeepSeek's multi-head latent attention), the dense-only blocks, the
embeddings, sliding windows, and the precision each part of the released checkpoint is stored
in. Its parameter counts are held to the models' published totals by `tests/presets/test_presets.py`:
that is how we know the shapes are right. Users can point `load_presets` at their own file.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, GeometryError, Quant
from casmoe.precision import Precision, PrecisionError, parse_precision
from casmoe.tables import read_table

PRESETS_FILE = Path(__file__).with_name("models.toml")

_GEOMETRY_KEYS = ("layers", "experts", "top_k", "shared_experts", "hidden", "intermediate", "gated")
_INT_FIELDS = ("heads", "kv_heads", "head_dim", "vocab", "dense_layers", "q_lora_rank", "kv_lora_rank",
               "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "dense_intermediate", "sliding_window",
               "sliding_every")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_PRESET_KEYS = {"source", *_GEOMETRY_KEYS, *_INT_FIELDS, "attention", "tie_embeddings", "expert_precision",
                "dense_precision", "precision_source"}


class PresetError(CasmoeError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Attention(enum.Enum):
    """How a layer's keys and values are projected and cached."""

    MHA = "mha"  # one K/V head per query head
    GQA = "gqa"  # kv_heads K/V heads shared by groups of query heads
    MLA = "mla"  # DeepSeek's latent attention: one compressed latent + a RoPE key per token


def _bf16() -> Precision:
    return parse_precision("bf16")


@dataclass(frozen=True)
class ModelPreset:
    """A model's MoE geometry plus everything else a token's price depends on.

    `dense_layers` are transformer blocks with a plain FFN of width `dense_intermediate` instead of
    experts (0: unknown, not counted); they are taken to come first, as DeepSeek's, GLM's and
    Kimi's `first_k_dense_replace` blocks do. MLA presets carry DeepSeek's dimensions
    (`q_lora_rank` 0 means a full query projection, as in DeepSeek-V2-Lite); `head_dim` is then
    the query/key head width `qk_nope_head_dim + qk_rope_head_dim`. With `sliding_window` > 0, one
    block in every `sliding_every` (the last of each group) attends to the whole context and the
    others to the most recent `sliding_window` tokens (gpt-oss alternates 128-token windows with
    full layers). `expert_precision` and `dense_precision` are the released checkpoint's.
    """

    name: str
    source: str
    geometry: Geometry
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dense_layers: int = 0
    attention: Attention | None = None
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    dense_intermediate: int = 0
    tie_embeddings: bool = False
    sliding_window: int = 0
    sliding_every: int = 0
    expert_precision: Precision | None = None
    dense_precision: Precision | None = None
    precision_source: str = ""

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PresetError(f"preset {self.name!r}: {name} must be an integer >= 0 (got {value!r})")
        if not isinstance(self.tie_embeddings, bool):
            raise PresetError(f"preset {self.name!r}: tie_embeddings must be true or false")
        if self.heads < 1 or self.kv_heads < 1:
            raise PresetError(f"preset {self.name!r}: heads and kv_heads must be >= 1")
        attention = self.attention
        if attention is None:
            attention = Attention.MHA if self.kv_heads == self.heads else Attention.GQA
        if not isinstance(attention, Attention):
            raise PresetError(f"preset {self.name!r}: attention must be an Attention (got {attention!r})")
        object.__setattr__(self, "attention", attention)
        mla = [f for f in _MLA_FIELDS if getattr(self, f)]
        if attention is Attention.MLA:
            missing = [f for f in _MLA_FIELDS[1:] if not getattr(self, f)]
            if missing:
                raise PresetError(f"preset {self.name!r}: MLA needs {', '.join(missing)}")
        elif mla:
            raise PresetError(f"preset {self.name!r}: {', '.join(mla)} are MLA dimensions, but attention is "
                              f"{attention.value}")
        elif attention is Attention.MHA and self.kv_heads != self.heads:
            raise PresetError(f"preset {self.name!r}: MHA has one K/V head per query head ({self.kv_heads} != "
                              f"{self.heads}); use gqa")
        elif attention is Attention.GQA and self.heads % self.kv_heads:
            raise PresetError(f"preset {self.name!r}: {self.heads} query heads do not share {self.kv_heads} K/V "
                              "heads evenly")
        if bool(self.sliding_window) != bool(self.sliding_every) or self.sliding_every == 1:
            raise PresetError(f"preset {self.name!r}: sliding_window and sliding_every (>= 2) go together")
        for name in ("expert_precision", "dense_precision"):
            value = getattr(self, name)
            if value is None:
                value = _bf16()
            elif isinstance(value, Quant):
                value = value.precision
            if not isinstance(value, Precision):
                raise PresetError(f"preset {self.name!r}: {name} must be a Precision (got {value!r})")
            object.__setattr__(self, name, value)

    # ---- shape ---------------------------------------------------------------------------------

    @property
    def blocks(self) -> int:
        """Transformer blocks: MoE layers and dense-only layers."""
        return self.geometry.layers + self.dense_layers

    @property
    def attention_params(self) -> int:
        """Projection parameters of one layer's attention. GQA/MHA: Q and O are heads x head_dim
        wide, K and V kv_heads x head_dim. MLA (DeepSeek-V3 inference/model.py, class MLA): a
        query down/up projection through `q_lora_rank` with its norm (or one full projection when
        it is 0), `wkv_a` to the `kv_lora_rank` latent plus the shared RoPE key, the latent's norm,
        `wkv_b` back up to every head's no-RoPE key and value, and `wo`."""
        h = self.geometry.hidden
        if self.attention is not Attention.MLA:
            return h * self.heads * self.head_dim * 2 + h * self.kv_heads * self.head_dim * 2
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            query = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk
        else:
            query = h * self.heads * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return query + kv + self.heads * self.v_head_dim * h

    @property
    def router_params(self) -> int:
        return self.geometry.hidden * self.geometry.experts

    @property
    def shared_expert_params(self) -> int:
        """Always-active shared experts, counted in expert-sized units (Qwen's 5632-wide shared
        MLP beside 1408-wide experts is 4)."""
        return self.geometry.shared_experts * self.geometry.expert_params

    @property
    def norm_params_per_layer(self) -> int:
        """The block's two RMSNorm weight vectors (before attention, before the FFN). Q/K norms
        (OLMoE, Qwen3) and norm biases are left out: a few thousand parameters a layer."""
        return 2 * self.geometry.hidden

    @property
    def dense_params_per_layer(self) -> int:
        """Weights every token streams in an MoE layer besides its routed experts: attention
        (MLA's projections included), router and shared experts. The layer's norms are kept in
        `norm_params_per_layer` (counted by `total_params`, `active_params`, `sizes`) so that the
        simulator's timings of GQA presets, which read this, stay what they were."""
        return self.attention_params + self.router_params + self.shared_expert_params

    @property
    def dense_mlp_params(self) -> int:
        """The FFN of a dense-only block: gated (three matrices) when the experts are."""
        return (3 if self.geometry.gated else 2) * self.geometry.hidden * self.dense_intermediate

    @property
    def dense_layer_params(self) -> int:
        """One dense-only block: attention, its FFN and its norms."""
        return self.attention_params + self.dense_mlp_params + self.norm_params_per_layer

    @property
    def moe_layer_params(self) -> int:
        """One MoE block: dense part, norms and every routed expert."""
        g = self.geometry
        return self.dense_params_per_layer + self.norm_params_per_layer + g.experts * g.expert_params

    @property
    def head_params(self) -> int:
        """The LM head (vocab x hidden), the same matrix as the embedding table when tied."""
        return self.vocab * self.geometry.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding table plus LM head, counted once when they are tied."""
        return self.head_params * (1 if self.tie_embeddings else 2)

    def total_params(self) -> int:
        """Every weight of the model: MoE blocks, dense blocks, embeddings and the final norm
        (biases, attention sinks and multi-token-prediction modules left out)."""
        g = self.geometry
        return (g.layers * self.moe_layer_params + self.dense_layers * self.dense_layer_params
                + self.embedding_params + g.hidden)

    def active_params(self, embedding: bool = True, head: bool = True) -> int:
        """Weights one token uses: each block's dense part, norms and top_k routed experts, the
        dense blocks, and (as publishers count them differently) the embedding table and the LM
        head when asked. Publishers differ: Qwen's, Mixtral's and DeepSeek-V3's 37B include both,
        gpt-oss's 5.1B, Kimi-K2's 32B and DeepSeek-V2's the head only, GLM-4.5's neither
        (tests/presets/test_presets.py pins each)."""
        g = self.geometry
        count = g.layers * (self.dense_params_per_layer + self.norm_params_per_layer + g.top_k * g.expert_params)
        count += self.dense_layers * self.dense_layer_params + g.hidden
        if self.tie_embeddings:
            return count + (self.head_params if embedding or head else 0)
        return count + self.head_params * (int(embedding) + int(head))

    # ---- precisions and bytes ----------------------------------------------------------------

    def expert_bytes_per_layer(self, precision: Precision | Quant | None = None) -> list[int]:
        """Bytes of one routed expert of each MoE layer at `precision` (default: the checkpoint's
        own). A llama.cpp mix varies by layer: MoE layer l is transformer block dense_layers + l
        of `blocks`, which is how llama.cpp's quantiser counts it."""
        p = self._precision(precision, self.expert_precision)
        g = self.geometry
        return [p.expert_bytes(g.hidden, g.intermediate, g.gated, self.dense_layers + layer, self.blocks)
                for layer in range(g.layers)]

    def dense_params(self) -> int:
        """Every weight outside the routed experts and the embeddings: attention, routers, shared
        experts and norms of the MoE blocks, the dense blocks, the final norm."""
        g = self.geometry
        moe = g.layers * (self.dense_params_per_layer + self.norm_params_per_layer)
        return moe + self.dense_layers * self.dense_layer_params + g.hidden

    def sizes(self, expert_precision: Precision | Quant | None = None,
              dense_precision: Precision | Quant | None = None) -> dict[str, int]:
        """Bytes of the routed experts, the dense part and the embeddings (input table and LM
        head, priced as the dense part), and their total, at these precisions (default: the
        released checkpoint's). Offloading moves the experts; the rest stays resident."""
        experts = sum(self.expert_bytes_per_layer(expert_precision)) * self.geometry.experts
        dense_p = self._precision(dense_precision, self.dense_precision)
        dense = dense_p.param_bytes(self.dense_params())
        embeddings = dense_p.param_bytes(self.embedding_params)
        return {"experts": experts, "dense": dense, "embeddings": embeddings, "total": experts + dense + embeddings}

    @staticmethod
    def _precision(value: Precision | Quant | None, default: Precision | None) -> Precision:
        if value is None:
            assert default is not None  # set in __post_init__
            return default
        return parse_precision(value)

    # ---- attention and its cache -----------------------------------------------------------------

    @property
    def kv_values_per_token(self) -> int:
        """Values one token adds to one layer's cache. GQA/MHA: a key and a value per K/V head.
        MLA: the compressed latent (`kv_lora_rank`) and the shared RoPE key (`qk_rope_head_dim`),
        as FlashMLA, KTransformers and DeepSeek's own absorbed path cache it (DeepSeek-V3
        inference/model.py: `kv_cache` of kv_lora_rank, `pe_cache` of qk_rope_head_dim)."""
        if self.attention is Attention.MLA:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, precision: Precision | Quant | int | None = None) -> int:
        """KV-cache bytes one token adds to one layer, at `precision` (default bf16). An int is
        read as bytes per value, the form this method used to take."""
        if isinstance(precision, int) and not isinstance(precision, bool):
            return self.kv_values_per_token * precision
        return self._precision(precision, _bf16()).param_bytes(self.kv_values_per_token)

    def window(self, block: int) -> int:
        """Tokens transformer block `block` attends to: 0 for the whole context, else its window."""
        if not 0 <= block < self.blocks:
            raise PresetError(f"block {block} is outside {self.name}'s {self.blocks} blocks")
        if not self.sliding_window or block % self.sliding_every == self.sliding_every - 1:
            return 0
        return self.sliding_window

    def attended_tokens(self, block: int, context: int, window_cells: Callable[[int], int] | None = None) -> int:
        """Cached tokens block `block` holds, and a new token of it reads, when the sequence holds
        `context`: all of them, or a windowed block's window. `window_cells` says how many cells
        an engine keeps for a window when that is more than the window itself (llama.cpp keeps
        the window plus a ubatch, padded; `casmoe.sim.questions.deploy.memory`)."""
        window = self.window(block)
        if not window:
            return context
        return min(context, window_cells(window) if window_cells is not None else window)

    def kv_bytes(self, context: int, precision: Precision | Quant | int | None = None,
                 blocks: Iterable[int] | None = None, window_cells: Callable[[int], int] | None = None) -> int:
        """KV-cache bytes of one sequence of `context` tokens over `blocks` (default: every block),
        each block's `attended_tokens` at `precision` (default bf16). The one definition of a KV
        cache's size: the simulator's memory check per device and `casmoe plan`'s memory map
        both call it."""
        per_token = self.kv_bytes_per_token(precision)
        blocks = range(self.blocks) if blocks is None else blocks
        return sum(per_token * self.attended_tokens(block, context, window_cells) for block in blocks)

    @property
    def attention_pair_flops(self) -> int:
        """FLOPs of one (query, key) pair in one layer: the score and the value product. GQA/MHA:
        2 x heads x head_dim each. MLA in its absorbed form (DeepSeek-V3 inference/model.py,
        attn_impl "absorb"), which serves decode from the latent cache: every head scores over the
        latent and the RoPE key (kv_lora_rank + qk_rope_head_dim) and sums values in the latent
        (kv_lora_rank); the up-projections run once per query token and are in `attention_params`."""
        if self.attention is Attention.MLA:
            return 2 * self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 4 * self.heads * self.head_dim

    def attention_flops(self, tokens: int, pairs: int) -> int:
        """One layer's attention for `tokens` new tokens attending over `pairs` (query, key) pairs
        in all: the projections (2 FLOPs per parameter per token) plus the pair products."""
        return 2 * self.attention_params * tokens + self.attention_pair_flops * pairs

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "source": self.source, **self.geometry.to_dict()}
        for key in (*_INT_FIELDS, "tie_embeddings", "precision_source"):
            d[key] = getattr(self, key)
        d["attention"] = self.attention.value
        d["expert_precision"] = self.expert_precision.name
        d["dense_precision"] = self.dense_precision.name
        return d


@cache
def load_presets(path: Path = PRESETS_FILE) -> dict[str, ModelPreset]:
    raw = read_table(path)
    presets = {}
    for name, table in raw.items():
        try:
            unknown = set(table) - _PRESET_KEYS
            if unknown:
                raise PresetError(f"unknown keys {sorted(unknown)}")
            geometry = Geometry(**{k: table[k] for k in _GEOMETRY_KEYS if k in table})
            extra: dict[str, Any] = {k: table[k] for k in (*_INT_FIELDS, "tie_embeddings", "precision_source")
                                     if k in table}
            if "attention" in table:
                try:
                    extra["attention"] = Attention(table["attention"])
                except ValueError:
                    raise PresetError(f"unknown attention {table['attention']!r}; one of "
                                      f"{', '.join(a.value for a in Attention)}") from None
            for key in ("expert_precision", "dense_precision"):
                if key in table:
                    extra[key] = parse_precision(table[key])
            presets[name] = ModelPreset(name=name, source=table["source"], geometry=geometry, **extra)
        except (KeyError, TypeError, GeometryError, PrecisionError) as exc:
            raise PresetError(f"preset [{name}] in {path} is invalid: {exc}") from exc
    return presets


def get_preset(name: str) -> ModelPreset:
    presets = load_presets()
    if name not in presets:
        raise PresetError(f"unknown model preset {name!r}; known: {', '.join(sorted(presets))}")
    return presets[name]


def preset_for(trace: Any, wanted: str | None = None) -> str | None:
    """The preset a trace is priced as: `wanted`, else the one it was recorded from
    (`meta["model_preset"]`), else the only preset of its shape; None when none fits."""
    if wanted:
        return wanted
    presets = load_presets()
    recorded = trace.meta.get("model_preset")
    if recorded in presets:
        return recorded
    g = trace.geometry
    fits = [n for n, p in presets.items() if (p.geometry.layers, p.geometry.experts) == (g.layers, g.experts)]
    return fits[0] if len(fits) == 1 else None


def shape_preset(geometry: Geometry, name: str = "trace's own shape") -> ModelPreset:
    """A preset of exactly `geometry` with a token-sized dense part: what a count-only replay
    prices a trace of no known model with (its measured expert bytes, else its own shape's)."""
    return ModelPreset(name, "the trace's geometry", geometry, heads=1, kv_heads=1, head_dim=geometry.hidden or 8,
                       vocab=16)


def preset_rows(presets: Mapping[str, ModelPreset] | None = None) -> list[dict[str, Any]]:
    """What `casmoe presets` shows, one row per preset: the routing shape, the attention, the
    checkpoint's precision per part, the experts' bytes at that precision and at bf16, and the
    KV-cache bytes one token adds over all blocks at bf16 (before any window)."""
    rows = []
    for name, p in (load_presets() if presets is None else presets).items():
        g = p.geometry
        rows.append({
            "name": name,
            "layers": g.layers,
            "dense_layers": p.dense_layers,
            "experts": g.experts,
            "top_k": g.top_k,
            "shared": g.shared_experts,
            "attention": p.attention.value,
            "expert_precision": p.expert_precision.name,
            "dense_precision": p.dense_precision.name,
            "experts_bytes": sum(p.expert_bytes_per_layer()) * g.experts,
            "experts_bf16_bytes": sum(p.expert_bytes_per_layer(_bf16())) * g.experts,
            "kv_bytes_per_token": p.kv_bytes_per_token() * p.blocks,
        })
    return rows
