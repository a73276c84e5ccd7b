"""Vendor facts of a part the detector found: the shipped catalogs (`catalog/gpus.toml`,
`catalog/cpus.toml`) and the host-link rates (`links.toml`), looked up by the names the
machine's tools print.

A tool names the part; the catalog says what the vendor rates it at. A part that is not in the
catalog, or whose figure the catalog could not source, gets the nearest entry's figure, and the
answer says which entry and that it was assumed: a profile never silently prices a part it does
not know.
"""

from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Any


from casmoe.sim.box.hardware import link_generations
from casmoe.tables import read_table

CATALOG_DIR = Path(__file__).with_name("catalog")

INT8_DOT = {
    "vpdpbusd": (4.0, ("4: AVX512-VNNI / AVX-VNNI vpdpbusd (Intel intrinsics guide, _mm512_dpbusd_epi32, "
                       "_mm256_dpbusd_avx_epi32: 'Multiply groups of 4 adjacent pairs of unsigned 8-bit integers ... Sum "
                       "these 4 results with the corresponding 32-bit integer') does 4 int8 multiply-adds per 32-bit lane "
                       "in one instruction, where an FP32 FMA does 1; ggml takes it for Q4_0/Q8_0/IQ4_NL "
                       "(mul_sum_us8_pairs_float under __AVX512VNNI__ or __AVXVNNI__, ggml-cpu/arch/x86/quants.c, "
                       "llama.cpp 0c1e5709) and ik_llama.cpp for the k-quants (iqk_gemm_kquants.cpp compute_block, "
                       "HAVE_FANCY_SIMD); mainline ggml's k-quant dot products keep vpmaddubsw + vpmaddwd even here "
                       "(ggml_vec_dot_q4_K_q8_K): a peak, which the stack's host efficiency scales")),
    "vpmaddubsw": (2.0, ("2: without VNNI ggml multiplies int8 with _mm256_maddubs_epi16 (vpmaddubsw: u8 x s8 products "
                         "summed in pairs to int16) then _mm256_madd_epi16 (vpmaddwd: pairs to int32; "
                         "ggml_vec_dot_q4_K_q8_K applies the sub-block scale in it), ggml-cpu/arch/x86/quants.c, "
                         "llama.cpp 0c1e5709: two instructions for the 4 multiply-adds of a 32-bit lane, where an FP32 "
                         "FMA does 1; Intel counts the vpaddd accumulate as a third ('Multiplying two 8-bit values and "
                         "accumulating the result to 32 bits requires three instructions', intel.com 'Accelerate Lower "
                         "Numerical Precision Inference with Intel Deep Learning Boost'), 4/3 where it takes a multiply "
                         "port: 2 is the upper figure")),
}
"""What each int8 dot product of the catalog (`cpus.toml` `int8_dot`) or of a CPU's flags gives a
profile's `cpu_int8_speedup`, and why (`casmoe hardware detect`, `bench/published_profiles.py`)."""


@cache
def gpu_catalog() -> dict[str, dict[str, Any]]:
    return read_table(CATALOG_DIR / "gpus.toml")


@cache
def cpu_catalog() -> dict[str, dict[str, Any]]:
    return read_table(CATALOG_DIR / "cpus.toml")


def gpu_entry(name: str) -> str | None:
    """The catalog key of the GPU a tool names (nvidia-smi's name; rocm-smi's series with
    'AMD ' before it), case aside; None when the catalog lacks it."""
    keys = {k.lower(): k for k in gpu_catalog()}
    return keys.get(name.lower())


def nearest_gpu(name: str) -> str:
    """The catalog entry whose name is closest to `name` among its vendor's (the first word:
    'NVIDIA', 'AMD'; every entry when the vendor has none)."""
    vendor = name.split()[0].lower() if name.split() else ""
    same = [k for k in gpu_catalog() if k.split()[0].lower() == vendor] or list(gpu_catalog())
    return max(same, key=lambda k: difflib.SequenceMatcher(None, name.lower(), k.lower()).ratio())


def nearest_with(key: str, figure: str) -> str:
    """The catalog entry nearest to entry `key` in memory bandwidth that has `figure` (nonzero):
    for a part whose own figure the catalog could not source (decode is bound by bandwidth, so a
    part of like bandwidth is the least wrong stand-in)."""
    bw = gpu_catalog()[key]["mem_bw_gbs"]
    have = [k for k, e in gpu_catalog().items() if e.get(figure)]
    return min(have, key=lambda k: abs(gpu_catalog()[k]["mem_bw_gbs"] - bw))


def cpu_key(model: str) -> str:
    """A CPU model as lscpu prints it, in the catalog's naming: 'Intel(R) Xeon(R) Gold 6330 CPU @
    2.00GHz' -> 'Intel Xeon Gold 6330', 'AMD EPYC 7453 28-Core Processor' -> 'AMD EPYC 7453',
    '13th Gen Intel(R) Core(TM) i5-13600K' -> 'Intel Core i5-13600K'."""
    s = re.sub(r"\((R|TM)\)", "", model, flags=re.IGNORECASE)
    s = re.sub(r"\s(CPU\b|\d+-Core Processor|Processor\b|with ).*$", "", s)
    s = re.sub(r"^\d+th Gen\s+", "", s.strip())
    return " ".join(s.split())


def cpu_entry(model: str) -> str | None:
    keys = {k.lower(): k for k in cpu_catalog()}
    return keys.get(cpu_key(model).lower())


def link_rate(gen: int, width: int) -> tuple[float, str, bool]:
    """The pinned host-to-device rate of a PCIe link: links.toml's rate for the generation (the
    nearest one it has, `exact` False, for a generation it lacks), scaled by lanes / 16 (the
    rates are of x16 links; a link's bandwidth is per lane)."""
    links = link_generations()
    gens = {int(k.removeprefix("pcie")): k for k in links}
    nearest = min(gens, key=lambda g: abs(g - gen))
    key = gens[nearest]
    rate = float(links[key]["pinned_gbs"]) * width / 16
    scaled = f", x {width}/16 lanes" if width != 16 else ""
    return rate, f"links.toml {key}: {links[key]['pinned_gbs']} GB/s{scaled} ({links[key]['source']})", nearest == gen


def catalog_link(key: str) -> tuple[int, int] | None:
    """The PCIe generation and lanes of a catalog GPU's host interface ('4.0 x16'), if known."""
    m = re.match(r"(\d)(?:\.0)?\s*x(\d+)", str(gpu_catalog()[key].get("pcie", "")))
    return (int(m.group(1)), int(m.group(2))) if m else None
