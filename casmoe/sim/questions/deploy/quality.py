"""Which precisions a plan compares, and what each costs in quality, as published.

Without `--precision`, `casmoe plan` prices the files users download for a model: for llama.cpp
(and KTransformers' GGUF host experts) the llama-quantize types Q8_0, Q6_K, Q5_K_M, Q4_K_M,
IQ4_XS and Q3_K_M, and the model's own released precision where a GGUF holds it (gpt-oss's MXFP4:
the MXFP4_MOE file type); none larger than the released experts (re-quantising MXFP4 to Q8_0
gains nothing). It picks the fastest that fits among those at or above a quality floor (default
Q4_K_M's).

The quality cost of a precision is a published figure with the model it was measured on
(casmoe/engines/quant_quality.toml): the mean KL divergence from the 16-bit model of llama.cpp's
LLaMA 3 8B scoreboard, the one table that covers every stock type. That model is dense: no
published table covers MoE models across the stock types (quant_quality.toml says what was
found), so each figure says which model it is of instead of being passed off as this model's.
The released precision costs nothing by definition (gpt-oss was trained in MXFP4: its model card).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.precision import Precision, parse_precision
from casmoe.presets import ModelPreset
from casmoe.sim.questions.deploy.engines import ENGINE_DATA
from casmoe.tables import read_table

QUALITY = ENGINE_DATA / "quant_quality.toml"
GGUF_CHOICES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m")
"""The llama-quantize types users download, largest first."""
NATIVE_GGUF = {"mxfp4": "mxfp4_moe", "bf16": "bf16", "fp16": "fp16", "q8_0": "q8_0"}
"""A released precision as the llama.cpp file type that keeps it (gpt-oss's MXFP4 experts: MXFP4_MOE)."""
REFERENCE = "Meta-Llama-3-8B (base)"
"""The model of the one published table across the stock types (llama.cpp tools/perplexity/README.md)."""
DEFAULT_FLOOR = "q4_k_m"


class QualityError(CasmoeError, ValueError):
    """A quality floor that names no precision with a published figure."""


@cache
def _table() -> dict[str, Any]:
    return read_table(QUALITY)


def _reference_kld() -> dict[str, tuple[float, str]]:
    """llama-quantize type (lower case) -> (mean KLD on the reference model, source): without an
    imatrix where the table has such a row, else with the one it has (IQ types)."""
    out: dict[str, tuple[float, str, bool]] = {}
    for row in _table()["quality"]:
        if row.get("model") != REFERENCE or row.get("mean_kld") is None or row.get("size_gib") is None:
            continue
        name = str(row["quant"]).split()[0].lower()
        plain = row.get("imatrix") in (None, "None")
        if name not in out or (plain and not out[name][2]):
            out[name] = (float(row["mean_kld"]), row["source"], plain)
    return {k: (v[0], v[1]) for k, v in out.items()}


@dataclass(frozen=True)
class Quality:
    """What a precision costs in quality for a model: `kld` the published mean KL divergence (None:
    no figure, or the released precision, `native`), in words with the model it was measured on."""

    precision: str
    native: bool
    kld: float | None
    text: str
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "native": self.native, "mean_kld": self.kld, "quality": self.text,
                "source": self.source}


def quality(precision: Precision, preset: ModelPreset, released: Precision | None = None) -> Quality:
    """The quality cost of `precision` for `preset`'s model, whose experts were released at
    `released` (default: the preset's own precision; a GGUF read as a preset states its file's,
    not the model's release: give the release then)."""
    name = precision.name
    if is_native(precision, preset, released):
        return Quality(name, True, None, f"the released precision of {preset.name}: no quality cost",
                       _native_source(preset))
    known = _reference_kld().get(name)
    if known is None:
        return Quality(name, False, None, f"no published quality figure for {name} (casmoe/engines/quant_quality.toml): "
                       "not picked at a quality floor (--precision or --quality-floor none picks it)")
    kld, source = known
    return Quality(name, False, kld, f"KLD {kld:.4f} on {REFERENCE.split(' (')[0]} (a dense model: no published "
                   f"figure for {preset.name} or another MoE across the stock types)", source)


def _native_source(preset: ModelPreset) -> str:
    if preset.name.startswith("gpt-oss"):
        row = next((r for r in _table()["quality"] if str(r.get("quant", "")).startswith("MXFP4")), None)
        return row["source"] if row else ""
    return preset.precision_source or preset.source


def is_native(precision: Precision, preset: ModelPreset, released: Precision | None = None) -> bool:
    """Whether `precision` keeps the released experts as they are (bf16's own, gpt-oss's MXFP4 as MXFP4_MOE)."""
    native = released or preset.expert_precision
    if native is None:
        return precision.name in ("bf16", "fp16")
    return precision.name == native.name or precision.name == NATIVE_GGUF.get(native.name)


def gguf_choices(preset: ModelPreset) -> list[Precision]:
    """The llama.cpp file types a plan compares for `preset` (module docstring), largest first."""
    native = preset.expert_precision
    bits = native.bits if native is not None else 16.0
    out = []
    own = NATIVE_GGUF.get(native.name if native is not None else "bf16")
    if own and own in ("mxfp4_moe", "q8_0"):  # a released quantised precision: its own file type first
        out.append(parse_precision(own))
    out += [parse_precision(n) for n in GGUF_CHOICES if parse_precision(n).bits < bits]
    return list({p.name: p for p in out}.values())


def floor_kld(floor: str) -> float | None:
    """The mean KLD a precision must not exceed (None: `floor` is 'none', every precision passes)."""
    if floor.strip().lower() == "none":
        return None
    name = floor.strip().lower()
    known = _reference_kld()
    if name not in known:
        raise QualityError(f"--quality-floor {floor!r}: no published quality figure for it; give one of "
                           f"{', '.join(sorted(known))} (casmoe/engines/quant_quality.toml), or none")
    return known[name][0]


def above(q: Quality, floor: float | None) -> bool:
    """Whether a precision of quality `q` may be picked under the floor: the released precision
    always; another with a published figure no worse than the floor's; one without a figure only
    when there is no floor."""
    if floor is None or q.native:
        return True
    return q.kld is not None and q.kld <= floor
