"""The routing shape of an MoE model: how many MoE layers, experts and routed experts per token.

Everything in casmoe (traces, caches, the simulator, the backend) is sized by a `Geometry`.
Expert ids are flat ints, `layer * experts + expert`, because the hot loops hash and compare
them millions of times per second and a tuple would cost several times more.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.precision import Precision, load_precisions

ExpertId = int
"""Flat expert id: `layer * geometry.experts + expert`."""
MAX_EXPERTS = 2**15 - 1
"""Experts per layer a trace can name: ids are stored as int16."""


class Quant(enum.Enum):
    """The four precisions casmoe first knew, kept for `--quant` and old call sites; the value is
    the name of its `Precision` (`casmoe/precisions.toml`), which every size now comes from."""

    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return {"fp16": 16, "bf16": 16, "int8": 8, "int4": 4}[self.value]

    @property
    def precision(self) -> Precision:
        """Its `Precision`: the same bits per weight, plus a family, a dequantisation cost and a source."""
        return load_precisions()[self.value]


class GeometryError(CasmoeError, ValueError):
    """A geometry that cannot describe a model (non-positive sizes, k > E, ...)."""


@dataclass(frozen=True)
class Geometry:
    """MoE routing shape plus the sizes needed to price one expert in bytes.

    `layers` counts MoE layers only. `gated` experts (SwiGLU: gate, up, down) hold three
    matrices, plain FFN experts two. `layer_expert_bytes` carries measured bytes per expert per
    layer when a trace importer knows them (quantised GGUF experts differ by layer); it wins
    over the shape-derived figure.
    """

    layers: int
    experts: int
    top_k: int
    shared_experts: int = 0
    hidden: int = 0
    intermediate: int = 0
    gated: bool = True
    layer_expert_bytes: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        import numpy as np  # here, not at module load: the CLI's start-up imports this module

        for name in ("layers", "experts", "top_k", "shared_experts", "hidden", "intermediate"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise GeometryError(f"{name} must be an integer (got {value!r})")
            object.__setattr__(self, name, int(value))
        if not isinstance(self.gated, (bool, np.bool_)):
            raise GeometryError(f"gated must be true or false (got {self.gated!r})")
        try:
            per_layer = tuple(self.layer_expert_bytes)
        except TypeError:
            raise GeometryError("layer_expert_bytes must be a list of integers") from None
        if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 0 for b in per_layer):
            raise GeometryError("layer_expert_bytes must be non-negative integers")
        if self.layers < 1 or self.experts < 1 or self.top_k < 1:
            raise GeometryError(
                f"layers, experts and top_k must be >= 1 (got {self.layers}, {self.experts}, {self.top_k})"
            )
        if self.top_k > self.experts:
            raise GeometryError(f"top_k={self.top_k} exceeds experts={self.experts}")
        if self.experts > MAX_EXPERTS:
            raise GeometryError(f"experts={self.experts} exceeds {MAX_EXPERTS} (traces store expert ids as int16)")
        if self.hidden < 0 or self.intermediate < 0 or self.shared_experts < 0:
            raise GeometryError("hidden, intermediate and shared_experts must be >= 0")
        if self.layer_expert_bytes and len(self.layer_expert_bytes) != self.layers:
            raise GeometryError(
                f"layer_expert_bytes has {len(self.layer_expert_bytes)} entries for {self.layers} layers"
            )
        object.__setattr__(self, "layer_expert_bytes", tuple(int(b) for b in per_layer))

    @property
    def total_experts(self) -> int:
        return self.layers * self.experts

    @property
    def active_experts(self) -> int:
        """Experts one token routes to across all MoE layers (L x k)."""
        return self.layers * self.top_k

    @property
    def expert_params(self) -> int:
        return (3 if self.gated else 2) * self.hidden * self.intermediate

    def expert_bytes(self, layer: int = 0, quant: Quant | Precision = Quant.BF16) -> int:
        """Bytes of one expert of `layer`: measured if known, else from the shape at `quant` (a
        `Quant` or any `Precision`; a llama.cpp mix varies by layer, its rules reading `layer`
        of this geometry's `layers`, i.e. as if every block were an MoE block: a model with dense
        blocks first prices its experts through `ModelPreset.expert_bytes_per_layer`)."""
        if self.layer_expert_bytes:
            return self.layer_expert_bytes[layer]
        precision = quant.precision if isinstance(quant, Quant) else quant
        return precision.expert_bytes(self.hidden, self.intermediate, self.gated, layer, self.layers)

    def bytes_per_layer(self, quant: Quant | Precision = Quant.BF16) -> list[int]:
        return [self.expert_bytes(layer, quant) for layer in range(self.layers)]

    def flat(self, layer: int, expert: int) -> ExpertId:
        return layer * self.experts + expert

    def layer_slice(self, layers: range) -> Geometry:
        """The sub-model of `layers` (a device's share), its layers numbered from 0."""
        per_layer = self.layer_expert_bytes[layers.start : layers.stop] if self.layer_expert_bytes else ()
        return replace(self, layers=len(layers), layer_expert_bytes=per_layer)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_expert_bytes"] = list(self.layer_expert_bytes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Geometry:
        if not isinstance(d, dict):
            raise GeometryError(f"geometry must be a mapping, not {type(d).__name__}")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise GeometryError(f"unknown geometry fields: {sorted(unknown)}")
        missing = {"layers", "experts", "top_k"} - set(d)
        if missing:
            raise GeometryError(f"geometry lacks {sorted(missing)}")
        return cls(**d)

    def describe(self) -> str:
        return f"{self.layers} MoE layers x {self.experts} experts, top-{self.top_k}"


def split_layers(layers: int, devices: int | Sequence[float]) -> list[range]:
    """Contiguous ranges of MoE layers, one per device, each device's count in proportion to its
    weight (`devices` a count: equal weights; or one weight per device, llama.cpp's
    `--tensor-split`, GPU memory), each at least one layer. Counts are apportioned by largest
    remainder with ties to the earlier device, so equal weights give near-equal ranges with the
    earlier devices taking the remainder (16 layers over 3 devices: 6, 5, 5). The simulator, the
    backend and `casmoe plan`'s memory map all place layers with this one function."""
    weights = [1.0] * devices if isinstance(devices, int) else [float(w) for w in devices]
    n = len(weights)
    if not 1 <= n <= layers:
        raise GeometryError(f"devices must be between 1 and the {layers} MoE layers (got {n})")
    if any(not w > 0 for w in weights):
        raise GeometryError(f"device weights must be positive (got {weights})")
    total = sum(weights)
    spare = layers - n  # each device's first layer is given; the rest are apportioned
    quotas = [spare * w / total for w in weights]
    counts = [1 + int(q) for q in quotas]
    order = sorted(range(n), key=lambda d: (-(quotas[d] - int(quotas[d])), d))
    for d in order[: layers - sum(counts)]:
        counts[d] += 1
    out, start = [], 0
    for count in counts:
        out.append(range(start, start + count))
        start += count
    return out
