"""Model presets: named MoE shapes loaded from `models.toml` into validated `ModelPreset`s.

A preset is data (STYLE principle 5): adding a model is adding a TOML table. Users can point
`load_presets` at their own file.
"""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass
from typing import Any
from functools import cache
from pathlib import Path

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, GeometryError

PRESETS_FILE = Path(__file__).with_name("models.toml")

_GEOMETRY_KEYS = ("layers", "experts", "top_k", "shared_experts", "hidden", "intermediate", "gated")


@dataclass(frozen=True)
class ModelPreset:
    """A model's MoE geometry plus the dense shape the simulator prices per layer."""

    name: str
    source: str
    geometry: Geometry
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dense_layers: int = 0

    @property
    def attention_params(self) -> int:
        """Q, K, V, O projection parameters of one layer."""
        h = self.geometry.hidden
        return h * self.heads * self.head_dim * 2 + h * self.kv_heads * self.head_dim * 2

    @property
    def dense_params_per_layer(self) -> int:
        """Parameters every token touches in an MoE layer besides its routed experts."""
        g = self.geometry
        router = g.hidden * g.experts
        return self.attention_params + router + g.shared_experts * g.expert_params

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes one token adds to one layer."""
        return 2 * self.kv_heads * self.head_dim * bytes_per_value


class PresetError(CasmoeError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@cache
def load_presets(path: Path = PRESETS_FILE) -> dict[str, ModelPreset]:
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    presets = {}
    for name, table in raw.items():
        try:
            geometry = Geometry(**{k: table[k] for k in _GEOMETRY_KEYS if k in table})
            presets[name] = ModelPreset(
                name=name,
                source=table["source"],
                geometry=geometry,
                heads=table["heads"],
                kv_heads=table["kv_heads"],
                head_dim=table["head_dim"],
                vocab=table["vocab"],
                dense_layers=table.get("dense_layers", 0),
            )
        except (KeyError, TypeError, GeometryError) as exc:
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
