"""Storage precisions as data: how many bytes a weight takes, and what dequantising it costs.

A `Precision` is loaded from `precisions.toml`, every number there with the source it was read
from. Three kinds live in one type:

- a plain format (bf16, fp8 with DeepSeek's 128x128 block scales, NF4, MXFP4, HQQ, GPTQ/AWQ
  group-128): one bit width for every weight, scales and zeros included;
- a ggml block type (Q4_K, Q6_K, ...): bits from the block struct of `ggml-common.h`, plus the
  block length a row must be a multiple of and llama.cpp's fallback type when it is not;
- a llama.cpp file type (q4_k_m, q3_k_m, q2_k, ...): a base block type and, per expert tensor
  (gate, up, down), the types llama.cpp's quantiser raises it to at some layers
  (`llama_tensor_get_type_impl` in `src/llama-quant.cpp`: `use_more_bits`, the first sixteenth
  or eighth of the layers). `expert_bytes` follows those rules layer by layer, so a Q4_K_M
  expert of layer 0 is dearer than one of layer 4, exactly as in the GGUF file.

Sizes are computed with exact fractions and rounded down once per expert, so a plain width gives
`params * bits // 8`, the rule `Quant` always used. `parse_precision` turns user text (a name or
`4.5bpw`) into a `Precision` at the edge; nothing downstream re-parses.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.tables import read_table

PRECISIONS_FILE = Path(__file__).with_name("precisions.toml")
EXPERT_PARTS = ("gate", "up", "down")
"""The tensors of a gated (SwiGLU) expert, as llama.cpp's quantiser names their categories."""
_BPW = re.compile(r"\s*(\d+(?:\.\d+)?)\s*bpw\s*", re.IGNORECASE)
MAX_BITS = 32.0


class PrecisionError(CasmoeError, ValueError):
    """An unknown precision name, a malformed bits-per-weight, or an invalid precisions file."""


class Family(enum.Enum):
    """How the weights are stored, and so how a host kernel multiplies them (`INT_DOT`)."""

    FLOAT = "float"
    INT = "int"  # integer formats of PyTorch stacks (GPTQ, AWQ, casmoe's int8/int4) and bare widths
    GGML = "ggml"  # ggml's legacy block types: Q4_0, Q5_0, Q5_1, Q8_0
    KQUANT = "kquant"  # ggml's k-quants (Q2_K..Q6_K) and i-quants (IQ1_S..IQ4_XS, IQ4_NL)
    MX = "mx"
    HQQ = "hqq"
    NF = "nf"
    FP8 = "fp8"


_GGML_CPU = ("llama.cpp ggml/src/ggml-cpu/ggml-cpu.c (commit 0c1e5709, as vendored by llama-cpp-python 0.3.36), "
             "type_traits_cpu")
INT_DOT: dict[Family, tuple[bool, str]] = {
    Family.KQUANT: (True, (f"{_GGML_CPU}: Q2_K..Q6_K and the IQ types have vec_dot_type = GGML_TYPE_Q8_K (IQ4_NL: "
                           "Q8_0): the activations are quantised to int8 and ggml_vec_dot_q4_K_q8_K "
                           "(ggml-cpu/arch/x86/quants.c) multiplies the unpacked int8 weights by them with "
                           "_mm256_maddubs_epi16 + _mm256_madd_epi16; ik_llama.cpp's k-quant kernels "
                           "(ggml/src/iqk/iqk_gemm_kquants.cpp compute_block) with _mm512_dpbusd_epi32 where "
                           "HAVE_FANCY_SIMD (AVX512F, VNNI, VL, BW, DQ); KTransformers' llamafile backend runs "
                           "ggml's kernels")),
    Family.GGML: (True, (f"{_GGML_CPU}: Q4_0, Q5_0, Q8_0 have vec_dot_type = GGML_TYPE_Q8_0 (Q5_1: Q8_1); "
                         "ggml_vec_dot_q4_0_q8_0 sums with mul_sum_i8_pairs_float, which is _mm256_dpbusd_epi32 "
                         "under __AVX512VNNI__, _mm256_dpbusd_avx_epi32 under __AVXVNNI__, else "
                         "_mm256_maddubs_epi16 + _mm256_madd_epi16 (ggml-cpu/arch/x86/quants.c)")),
    Family.MX: (True, (f"{_GGML_CPU}: MXFP4 has vec_dot_type = GGML_TYPE_Q8_0; ggml_vec_dot_mxfp4_q8_0 "
                       "(ggml-cpu/arch/x86/quants.c) looks the E2M1 codes up as int8 (kvalues_fp4) and multiplies "
                       "them by the int8 activations with mul_add_epi8 (_mm256_maddubs_epi16) + _mm256_madd_epi16; "
                       "a host computing MXFP4 experts is a ggml runtime (llama.cpp runs gpt-oss's MXFP4 experts so)")),
    Family.FLOAT: (False, ("bf16/fp16/fp32 weights multiply float activations with float FMAs (ggml: vec_dot_type "
                           "F16 for F16, BF16 for BF16, F32 for F32; PyTorch: a float GEMM): cpu_tflops' own rate")),
    Family.INT: (False, ("GPTQ/AWQ group-128 and casmoe's int8/int4 are PyTorch stacks' formats: their host "
                         "path dequantises the weights to bf16/fp32 and runs a float GEMM (no int8 activations); "
                         "a bare width (4.5bpw) names no format, so no integer kernel is assumed")),
    Family.HQQ: (False, ("HQQ (mobiusml/hqq Quantizer.dequantize, as Mixtral-Offloading and HF Accelerate run it) "
                         "dequantises W_q to floats, (W_q - zero) * scale, before a float matmul in PyTorch")),
    Family.NF: (False, ("bitsandbytes NF4 (dequantize_4bit) looks the codes up as floats and multiplies in the "
                        "activations' float type: no int8 activations")),
    Family.FP8: (False, ("FP8 e4m3 weights on a CPU are converted to bf16/fp32 before the matmul (x86 has no FP8 "
                         "arithmetic; DeepSeek's reference dequantises each 128x128 block with its scale)")),
}
"""Whether a host kernel multiplies weights of each family by int8-quantised activations with
integer dot products (x86 `vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`), and where that was read.
Such kernels run at `HardwareProfile.cpu_int8_speedup` times the profile's FP32 FMA rate; the
rest at the FP32 rate (`Machine.compute`). tests/core/test_precision.py holds every family to an entry."""


class LayerRule(enum.Enum):
    """When llama.cpp raises an expert tensor to a dearer type, by layer index `i` of `n` blocks.

    The conditions are `llama_tensor_get_type_impl`'s (src/llama-quant.cpp): `use_more_bits(i, n)
    = i < n/8 || i >= 7*n/8 || (i - n/8) % 3 == 2`, and `i < n/16`, `i < n/8` (C integer division).
    """

    ALWAYS = "always"
    MORE_BITS = "use_more_bits"
    FIRST_SIXTEENTH = "first_sixteenth"
    FIRST_EIGHTH = "first_eighth"

    def holds(self, layer: int, layers: int) -> bool:
        if self is LayerRule.ALWAYS:
            return True
        if self is LayerRule.MORE_BITS:
            eighth = layers // 8
            return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2
        if self is LayerRule.FIRST_SIXTEENTH:
            return layer < layers // 16
        return layer < layers // 8


@dataclass(frozen=True)
class Rule:
    """`type` replaces a mix's base type for one expert tensor where `when` holds."""

    when: LayerRule
    type: Precision


@dataclass(frozen=True)
class Precision:
    """A storage precision. `bits` is the average per weight, scales, zeros and block headers
    included (for a llama.cpp mix, its base type's: what the un-raised expert tensors take).
    `dequant_ops` is the arithmetic a kernel spends per weight to turn it back into a float (0 for
    bf16/fp16); its `source` says whether it was counted from a reference dequantiser or
    estimated. `block` is the row length a block type needs (0: any), `fallback` the type
    llama.cpp uses for a row that is not a multiple of it. A llama.cpp file type (`is_file_type`)
    has a `base` and per expert tensor `gate`/`up`/`down` rules, the first that holds at a layer
    winning, and the types it gives the rest of the file: `dense` (attention, shared experts:
    every tensor of a GGUF is quantised, not only the experts) and `head` (the output matrix)."""

    name: str
    bits: float
    family: Family
    dequant_ops: float
    source: str
    block: int = 0
    fallback: Precision | None = None
    base: Precision | None = None
    dense: Precision | None = None
    head: Precision | None = None
    gate: tuple[Rule, ...] = ()
    up: tuple[Rule, ...] = ()
    down: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, (int, float)):
            raise PrecisionError(f"precision {self.name!r}: bits must be a number (got {self.bits!r})")
        object.__setattr__(self, "bits", float(self.bits))
        if not 0 < self.bits <= MAX_BITS:
            raise PrecisionError(f"precision {self.name!r}: bits must be in (0, {MAX_BITS:g}] (got {self.bits:g})")
        ops = self.dequant_ops
        if isinstance(ops, bool) or not isinstance(ops, (int, float)) or ops < 0:
            raise PrecisionError(f"precision {self.name!r}: dequant_ops must be a number >= 0 (got {ops!r})")
        if not isinstance(self.family, Family):
            raise PrecisionError(f"precision {self.name!r}: family must be a Family (got {self.family!r})")
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 0:
            raise PrecisionError(f"precision {self.name!r}: block must be an integer >= 0 (got {self.block!r})")
        if (self.gate or self.up or self.down) and self.base is None:
            raise PrecisionError(f"precision {self.name!r}: per-tensor rules need a base type")

    @property
    def exact_bits(self) -> Fraction:
        """`bits` as the exact fraction it was written as (4.3 is 43/10, not the nearest float)."""
        return Fraction(repr(self.bits))

    @property
    def int_dot(self) -> bool:
        """True when a host kernel multiplies these weights by int8-quantised activations with
        integer dot products (ggml's block types), by its family (`INT_DOT`); a llama.cpp file
        type answers for its base type."""
        return INT_DOT[self.family][0]

    @property
    def bf16_dot(self) -> bool:
        """True for BF16 weights, which ggml multiplies with BF16 dot products where the CPU has
        them (`ggml_vec_dot_bf16`, tinyBLAS under `__AVX512BF16__`; `HardwareProfile.cpu_bf16_speedup`)
        and otherwise converts to FP32 first."""
        return self.name.lower() == "bf16"

    @property
    def is_mix(self) -> bool:
        """True for a llama.cpp mix whose expert tensors change type by layer or by tensor."""
        return bool(self.gate or self.up or self.down)

    @property
    def is_file_type(self) -> bool:
        """True for a llama.cpp file type: it quantises the whole file, the dense part and the
        head as well as the experts (a plain format such as int4 or hqq2 says how the experts
        are stored, and the dense part keeps its own precision)."""
        return self.base is not None

    @property
    def leaf(self) -> Precision:
        """The storage type of a tensor no rule raises: the base of a file type, else itself."""
        return self.base or self

    @property
    def types(self) -> tuple[Precision, ...]:
        """Every storage type an expert tensor of this precision can have (before fallbacks)."""
        seen = [self.leaf]
        for rule in (*self.gate, *self.up, *self.down):
            if rule.type not in seen:
                seen.append(rule.type)
        return tuple(seen)

    def rules(self, part: str) -> tuple[Rule, ...]:
        if part not in EXPERT_PARTS:
            raise PrecisionError(f"unknown expert tensor {part!r}; one of {', '.join(EXPERT_PARTS)}")
        return getattr(self, part)

    def tensor_type(self, part: str, layer: int = 0, layers: int = 1) -> Precision:
        """The type llama.cpp gives expert tensor `part` of transformer block `layer` of `layers`
        (all blocks, dense ones included: the quantiser reads the block index from the tensor
        name and counts `n_layer_all` blocks)."""
        for rule in self.rules(part):
            if rule.when.holds(layer, layers):
                return rule.type.leaf
        return self.leaf

    def fitted(self, row: int) -> Precision:
        """The type a row of `row` weights actually gets: itself if the row is a whole number of
        blocks, else llama.cpp's fallback (`tensor_type_fallback`), itself checked the same way;
        a row no block type fits is stored F16 (llama.cpp: 'must use F16 due to unusual shape').
        A format without a fallback (fp8's 128x128 blocks, NF4's 64, GPTQ's groups) pads its last
        block, as DeepSeek and bitsandbytes do; the padding is not counted."""
        if not self.block or row % self.block == 0 or self.fallback is None:
            return self
        return self.fallback.fitted(row)

    def param_bytes(self, params: int) -> int:
        """Bytes of `params` weights stored uniformly at this precision (a mix: at its base type),
        rounded down as `Quant` always did."""
        if params < 0:
            raise PrecisionError(f"params must be >= 0 (got {params})")
        return int(Fraction(int(params)) * self.leaf.exact_bits // 8)

    def expert_bytes(self, hidden: int, intermediate: int, gated: bool = True, layer: int = 0, layers: int = 1) -> int:
        """Bytes of one routed expert of transformer block `layer` of `layers`.

        A gated expert holds gate and up (`intermediate` rows of `hidden` weights) and down
        (`hidden` rows of `intermediate`); a plain FFN expert up and down. Each tensor takes the
        type this precision's rules give it at that layer, moved to its fallback when its rows
        (ggml's `ne[0]`, the input width) are not whole blocks; the exact bit count of the three
        tensors is rounded down to bytes once.
        """
        if not 0 <= layer < layers:
            raise PrecisionError(f"layer {layer} is outside the model's {layers} blocks")
        if hidden < 0 or intermediate < 0:
            raise PrecisionError(f"hidden and intermediate must be >= 0 (got {hidden}, {intermediate})")
        shapes = (("up", intermediate, hidden), ("down", hidden, intermediate))
        if gated:
            shapes = (("gate", intermediate, hidden), *shapes)
        total = Fraction(0)
        for part, rows, cols in shapes:
            if rows and cols:
                total += self.tensor_type(part, layer, layers).fitted(cols).exact_bits * rows * cols
        return int(total // 8)

    def expert_dequant_ops(self, hidden: int, intermediate: int, gated: bool = True, layer: int = 0,
                           layers: int = 1) -> float:
        """Dequantisation operations to turn one expert of `layer` back into floats once: each
        tensor's weights times its (fitted) type's `dequant_ops`."""
        shapes = (("up", intermediate, hidden), ("down", hidden, intermediate))
        if gated:
            shapes = (("gate", intermediate, hidden), *shapes)
        return float(sum(self.tensor_type(p, layer, layers).fitted(c).dequant_ops * r * c for p, r, c in shapes))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "bits": self.bits, "family": self.family.value,
                             "dequant_ops": self.dequant_ops, "source": self.source}
        if self.block:
            d["block"] = self.block
        if self.base is not None:
            d["base"] = self.base.name
        for part in ("dense", "head"):
            if getattr(self, part) is not None:
                d[part] = getattr(self, part).name
        for part in EXPERT_PARTS:
            if self.rules(part):
                d[part] = [[r.when.value, r.type.name] for r in self.rules(part)]
        return d

    def __str__(self) -> str:
        return self.name


def _number(table: dict[str, Any], key: str, where: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PrecisionError(f"{where}: {key} must be a number (got {value!r})")
    return value


def _family(text: Any, where: str) -> Family:
    try:
        return Family(text)
    except ValueError:
        raise PrecisionError(f"{where}: unknown family {text!r}; one of {', '.join(f.value for f in Family)}") from None


def _block_type(name: str, table: dict[str, Any], types: dict[str, Precision], raw: dict[str, Any], path: Path,
                stack: tuple[str, ...] = ()) -> Precision:
    """A ggml block type, its fallback resolved first (block types only refer to each other)."""
    if name in types:
        return types[name]
    where = f"[ggml.{name}] in {path}"
    if name in stack:
        raise PrecisionError(f"{where}: fallback cycle {' -> '.join((*stack, name))}")
    bits = _number(table, "bits", where)
    block = int(table.get("block", 0))
    block_bits = Fraction(int(table["block_bytes"]) * 8, block) if "block_bytes" in table and block > 0 else None
    if "block_bytes" in table and block_bits != Fraction(repr(float(bits))):
        raise PrecisionError(f"{where}: bits {bits} is not block_bytes*8/block ({table['block_bytes']}*8/{block})")
    fallback = None
    if "fallback" in table:
        target = table["fallback"]
        if target not in raw:
            raise PrecisionError(f"{where}: fallback {target!r} is not a ggml type of the file")
        fallback = _block_type(target, raw[target], types, raw, path, (*stack, name))
    try:
        types[name] = Precision(name=name, bits=bits, family=_family(table.get("family"), where),
                                dequant_ops=_number(table, "dequant_ops", where), source=str(table["source"]),
                                block=block, fallback=fallback)
    except KeyError as exc:
        raise PrecisionError(f"{where}: lacks {exc.args[0]}") from None
    return types[name]


def _precision(name: str, table: dict[str, Any], types: dict[str, Precision], path: Path) -> Precision:
    where = f"[precision.{name}] in {path}"
    if "source" not in table:
        raise PrecisionError(f"{where}: lacks source")
    if "base" not in table:
        return Precision(name=name, bits=_number(table, "bits", where), family=_family(table.get("family"), where),
                         dequant_ops=_number(table, "dequant_ops", where), source=str(table["source"]),
                         block=int(table.get("block", 0)))
    base_name = table["base"]
    if base_name not in types:
        raise PrecisionError(f"{where}: base {base_name!r} is not a ggml type of the file")
    base = types[base_name]
    parts: dict[str, Precision] = {}
    for part in ("dense", "head"):
        name_ = table.get(part)
        if name_ is None:
            raise PrecisionError(f"{where}: a file type says the type of its {part} tensors ({part} = \"Q6_K\", ...)")
        if name_ not in types:
            raise PrecisionError(f"{where}: {part} type {name_!r} is not a ggml type of the file")
        parts[part] = types[name_]
    rules: dict[str, tuple[Rule, ...]] = {}
    for part in EXPERT_PARTS:
        parsed = []
        for entry in table.get(part, []):
            if not (isinstance(entry, list) and len(entry) == 2):
                raise PrecisionError(f"{where}: a {part} rule is [condition, type], got {entry!r}")
            when, target = entry
            try:
                condition = LayerRule(when)
            except ValueError:
                raise PrecisionError(
                    f"{where}: unknown condition {when!r}; one of {', '.join(r.value for r in LayerRule)}"
                ) from None
            if target not in types:
                raise PrecisionError(f"{where}: rule type {target!r} is not a ggml type of the file")
            parsed.append(Rule(condition, types[target]))
        rules[part] = tuple(parsed)
    return Precision(name=name, bits=base.bits, family=base.family, dequant_ops=base.dequant_ops,
                     source=str(table["source"]), block=base.block, fallback=base.fallback, base=base, **parts, **rules)


def load_precisions(path: Path = PRECISIONS_FILE) -> dict[str, Precision]:
    """The named precisions of `path` (`[precision.NAME]` tables); `[ggml.TYPE]` tables are the
    block types they are built from, not selectable by name."""
    return _tables(path)[1]


def ggml_types(path: Path = PRECISIONS_FILE) -> dict[str, Precision]:
    """The ggml block types of `path` by ggml's own names (`Q4_K`, `Q5_0`, `BF16`): what a GGUF
    file's tensors are stored as, where its mix has no casmoe name (`Machine.compute` reads
    their kernels)."""
    return _tables(path)[0]


@cache
def _tables(path: Path) -> tuple[dict[str, Precision], dict[str, Precision]]:
    raw = read_table(path)
    unknown = set(raw) - {"ggml", "precision"}
    if unknown:
        raise PrecisionError(f"{path}: unknown top-level tables {sorted(unknown)}; use [ggml.*] and [precision.*]")
    ggml = raw.get("ggml", {})
    types: dict[str, Precision] = {}
    for name, table in ggml.items():
        _block_type(name, table, types, ggml, path)
    precisions = {}
    for name, table in raw.get("precision", {}).items():
        if name != name.lower():
            raise PrecisionError(f"[precision.{name}] in {path}: names are lower case (they are matched so)")
        precisions[name] = _precision(name, table, types, path)
    return types, precisions


def bits_per_weight(bits: float) -> Precision:
    """A bare average width (`4.5bpw`): no format, so no dequantisation cost is assumed."""
    bits = float(bits)
    return Precision(name=f"{format(Decimal(repr(bits)), 'f')}bpw", bits=bits, family=Family.INT, dequant_ops=0.0,
                     source="bits per weight as written by the user: no storage format, no dequantisation cost")


def parse_precision(text: Any) -> Precision:
    """A `Precision` from a name (`q4_k_m`, `BF16`), a width (`4.5bpw`), a `Quant` or a
    `Precision`; anything else fails in one line listing the known names."""
    if isinstance(text, Precision):
        return text
    precision = getattr(text, "precision", None)  # a Quant (not imported: geometry imports this module)
    if isinstance(precision, Precision):
        return precision
    known = load_precisions()
    key = str(text).strip().lower()
    if key in known:
        return known[key]
    m = _BPW.fullmatch(str(text))
    if m:
        bits = float(m.group(1))
        if not 0 < bits <= MAX_BITS:
            raise PrecisionError(f"bits per weight must be in (0, {MAX_BITS:g}], got {text!r}")
        return bits_per_weight(bits)
    raise PrecisionError(f"unknown precision {text!r}; one of {', '.join(sorted(known))}, or a width such as 4.5bpw")
