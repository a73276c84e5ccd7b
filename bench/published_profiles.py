"""Write the hardware profiles of the published measurements' boxes: `casmoe/sim/trust/published/profiles/*.toml`.

Each box of `casmoe/sim/trust/published/boxes.toml` (what the paper or report says it ran on) is joined with
the parts catalogs (`casmoe/sim/box/catalog/gpus.toml`, `cpus.toml`: vendor specs) into a full profile,
every number sourced: from the box, the catalog, a link generation (`casmoe/sim/box/links.toml`), or the
same stated assumption the shipped profiles make (kernel efficiencies, launch overheads). What
neither says is 0 with a source saying so (a host of unknown bandwidth cannot price host experts,
and `casmoe validate published` leaves such rows out, saying why).

The host: its bandwidth is the box's own memory configuration where the box states one (channels
x transfer rate x 8 bytes per socket), else the catalog part's peak (or a measurement the box
quotes, where neither gives one); its cores are the box's, else the catalog's per socket x
sockets; its RAM the box's, with the shipped default reserve for the OS; its drive where the
source names one. Each profile's description names the host's instruction set (AVX2, AVX-512,
AMX) and memory type (DDR4, DDR5), which a fit of host efficiency by CPU generation reads.

A box a run used only part of has a profile of its own (`Spec.base`): one socket of a dual box,
or its host alone where the run kept no layer on its GPUs (`-ngl 0`; `gpus = 0`, every GPU field
0 sourced 'no GPU'). Rerun after editing either file:

    python bench/published_profiles.py
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from casmoe.sim.box.hardware import GPU_FIELDS, HOST_RESERVED_GIB, HOST_RESERVED_SOURCE, HardwareProfile
from casmoe.sim.box.parts import INT8_DOT

ROOT = Path(__file__).resolve().parents[1] / "casmoe" / "sim"
BOXES = tomllib.loads((ROOT / "trust" / "published" / "boxes.toml").read_text())
GPUS = tomllib.loads((ROOT / "box" / "catalog" / "gpus.toml").read_text())
CPUS = tomllib.loads((ROOT / "box" / "catalog" / "cpus.toml").read_text())
LINKS = tomllib.loads((ROOT / "box" / "links.toml").read_text())
OUT = ROOT / "trust" / "published" / "profiles"


@dataclass(frozen=True)
class Spec:
    """How one profile is made from its box (`base`, default the profile's own name)."""

    gpu: str | None  # catalog GPU; None: the run used no GPU (a host-only profile)
    cpu: str | None  # catalog CPU; None: the source does not name it
    link: str = ""  # link generation: the box's where it says one, else the GPU's own interface
    sockets: int = 0  # 0: not stated (one assumed)
    memory: tuple[int, int, str] | None = None  # (channels per socket, MT/s, where the box says so)
    host_bw: tuple[float, str] | None = None  # a measured host bandwidth (GB/s, source) where no peak is known
    storage: tuple[float, str] | None = None  # the drive's read rate (GB/s, source) where the source names it
    base: str = ""  # the boxes.toml key this profile is made from, when it differs from the profile's name
    why: str = ""  # how the run used part of the box
    ram_gib: tuple[float, str] | None = None  # host RAM when the box states it in other words than ram_gib
    int8_dot: tuple[str, str] | None = None  # the int8 dot product (catalog `int8_dot`) of a CPU the catalog lacks


ONE_SOCKET = "one socket of it: the single-socket rows run `numactl -N 1 -m 1 ... --cpu_infer 33` (measurements.toml notes)"
NO_GPU = "its host alone: the runs keep no layer on a GPU (-ngl 0 or a CPU build)"

MAP: dict[str, Spec] = {
    "mixoff-a100-sxm": Spec("NVIDIA A100-SXM4-80GB", None, "pcie4"),
    "mixoff-laptop-rtx3080m": Spec("NVIDIA GeForce RTX 3080 Laptop GPU", None, "pcie4", 1),
    "mixoff-desktop-rtx3060": Spec("NVIDIA GeForce RTX 3060", None, "pcie3", 1),
    "colab-t4-free": Spec("Tesla T4", None, "pcie3"),
    "azure-t4": Spec("Tesla T4", None, "pcie3"),
    "fiddler-env1-quadro-rtx6000": Spec("Quadro RTX 6000", None, "pcie3", int8_dot=(
        "vpmaddubsw", "box: a '48-core Intel Skylake' CPU (SKU not stated; a server part, Skylake-SP, as boxes.toml "
                      "infers): AVX-512 without VNNI, which came with the 2nd-generation Xeon Scalable (intel.com "
                      "'Introduction to Intel Deep Learning Boost on Second Generation Intel Xeon Scalable Processors')")),
    "fiddler-env2-l4": Spec("NVIDIA L4", None, "pcie4", int8_dot=(
        "vpdpbusd", "box: an 'Intel Cascade Lake' CPU (SKU not stated): DL Boost VNNI is 'available in 2nd generation "
                    "Intel Xeon Scalable processors' (intel.com 'Introduction to Intel Deep Learning Boost on Second "
                    "Generation Intel Xeon Scalable Processors')")),
    "moeinf-readme-a5000": Spec("NVIDIA RTX A5000", None, "pcie4"),
    "moeinf-paper-a5000-32g": Spec("NVIDIA RTX A5000", None, "pcie4"),
    "moeinf-paper-a5000-128g": Spec("NVIDIA RTX A5000", None, "pcie4"),
    "ktrans-2x6454s-4090d": Spec("NVIDIA GeForce RTX 4090 D", "Intel Xeon Gold 6454S", "pcie4", 2,
                                 (8, 4800, "box: 'DDR5-4800, 8 channels per socket (16 total)'")),
    "ktrans-2x6454s-4090": Spec("NVIDIA GeForce RTX 4090", "Intel Xeon Gold 6454S", "pcie4", 2),
    "ktrans-2x6454s-4090d-1socket": Spec("NVIDIA GeForce RTX 4090 D", "Intel Xeon Gold 6454S", "pcie4", 1,
                                         (8, 4800, "box: 'DDR5-4800, 8 channels per socket (16 total)'"),
                                         base="ktrans-2x6454s-4090d", why=ONE_SOCKET),
    "moel-s1-t4-24c": Spec("Tesla T4", None, "pcie3"),
    "moel-s2-l4-24c": Spec("NVIDIA L4", None, "pcie4"),
    "hybrimoe-a6000-5220r-10c": Spec("NVIDIA RTX A6000", "Intel Xeon Gold 5220R", "pcie4", 1),
    "moegen-c1-a5000-256g": Spec("NVIDIA RTX A5000", "AMD EPYC 7453", "pcie4", 1),
    "moegen-c2-a5000-512g": Spec("NVIDIA RTX A5000", "AMD EPYC 7453", "pcie4", 1),
    "hobbit-4090-64c": Spec("NVIDIA GeForce RTX 4090", None, "pcie4"),
    "pregated-a100-epyc7v12": Spec("NVIDIA A100 80GB PCIe", "AMD EPYC 7V12", "pcie4"),
    "ur-rtx3090-epyc7343-64g": Spec("NVIDIA GeForce RTX 3090", "AMD EPYC 7343", "pcie4", 1),
    "ur-rx6900xt-r9-7900-64g": Spec("AMD Radeon RX 6900 XT", "AMD Ryzen 9 7900", "pcie4", 1,
                                    (2, 5600, "box: 'DDR5-5600, 2 channels (2 x 32 GB)'")),
    "ur-rx7900xt-r9-5900x-32g": Spec("AMD Radeon RX 7900 XT", "AMD Ryzen 9 5900X", "pcie4", 1,
                                     (2, 3200, "box: 'DDR4-3200 CL16, 2 channels'")),
    "ur-rtx3090-unknown-host": Spec("NVIDIA GeForce RTX 3090", None, "pcie4"),
    "ur-rtx2080-i9-10900x-62g": Spec("NVIDIA GeForce RTX 2080", "Intel Core i9-10900X", "pcie3", 1, host_bw=(
        102.0, "the user's own measurement, as boxes.toml quotes it: 'DDR4, 4 channels (~102 GB/s measured by the user)'")),
    "ur-2x-rtx5090-unknown-host": Spec("NVIDIA GeForce RTX 5090", None, "pcie5"),
    # ---- llama.cpp-family user reports (ur-lc-*)
    **{f"ur-lc-ultra7-265k-64g-{card}": Spec(gpu, "Intel Core Ultra 7 265K", "pcie4", 1)
       for card, gpu in (("rtx4090", "NVIDIA GeForce RTX 4090"), ("rtx4070ti", "NVIDIA GeForce RTX 4070 Ti"),
                         ("rtxa4000", "NVIDIA RTX A4000"), ("rtx3060", "NVIDIA GeForce RTX 3060"))},
    "ur-lc-rtx4090-unknown-host": Spec("NVIDIA GeForce RTX 4090", None, "pcie4"),
    "ur-lc-r9-7950x-rtx4080": Spec("NVIDIA GeForce RTX 4080", "AMD Ryzen 9 7950X", "pcie4", 1),
    "ur-lc-r9-7950x-cpu": Spec(None, "AMD Ryzen 9 7950X", sockets=1, base="ur-lc-r9-7950x-rtx4080", why=NO_GPU),
    "ur-lc-2x-gold6138-512g": Spec(None, "Intel Xeon Gold 6138", sockets=2, memory=(
        6, 2666, "box: 'RAM: RDIMM DDR4 2666 2Rx4 32G x16(12 Channels total)' (6 per socket)")),
    "ur-lc-2x-e5-2697av4-cpu": Spec(None, "Intel Xeon E5-2697A v4", sockets=2, base="ur-lc-2x-e5-2697av4-2x-p100",
                                    why=NO_GPU),
    "ur-lc-xeon6980p-1socket": Spec(None, "Intel Xeon 6980P", sockets=1, base="ur-lc-2x-xeon6980p", why=(
        "one socket of it: the rows run on NUMA node 0 of the dual 6980P with SNC disabled (one node per socket)")),
    "ur-lc-epyc7773x-cpu": Spec(None, "AMD EPYC 7773X", sockets=1, base="ur-lc-epyc7773x-1tb", why=NO_GPU),
    "ur-lc-tr-pro-7965wx-256g-rtxa6000": Spec("NVIDIA RTX A6000", "AMD Ryzen Threadripper PRO 7965WX", "pcie4", 1, (
        8, 4800, "box: '8x 32GB KF560R32-32 DDR5-6000 running at JEDEC 4800MHz' (the owner measured ~225 GB/s with mlc)")),
    "ur-lc-r9-9950x-96g-rtx3090ti": Spec("NVIDIA GeForce RTX 3090 Ti", "AMD Ryzen 9 9950X", "pcie4", 1, (
        2, 6400, "box: '96GB DDR5-6400 RAM', '2x48GB tuned DIMMs'"), storage=(
        12.4, "the box's drive, a Crucial T700 2TB (ik_llama.cpp PR #270): 'Sequential Read 11,700 MBps 12,400 MBps "
              "12,400 MBps' for 1/2/4 TB (tomshardware.com Crucial T700 preview, spec table); a rated sequential "
              "read, which page-cache misses of a memory-mapped model (4 KiB-128 KiB reads) reach only in part")),
    "ur-lc-2x-epyc9115-768g-rtx3090": Spec("NVIDIA GeForce RTX 3090", "AMD EPYC 9115", "pcie4", 2),
    # ---- KTransformers and all-on-GPU vLLM user reports (ur-kt-*)
    "ur-kt-9654-4090-768g": Spec("NVIDIA GeForce RTX 4090", "AMD EPYC 9654", "pcie4", 1, (
        12, 4800, "box: 'RAM：64G 4800MHz DDR5✖️12' on a 12-channel socket (one DIMM per channel)")),
    "ur-kt-9274f-4090-576g": Spec("NVIDIA GeForce RTX 4090", "AMD EPYC 9274F", "pcie4", 1, (
        12, 4800, "box: 'Total Memory:576 GB (DDR5 RDIMM 4800)，12根内存' (the user measured ~230 GB/s with mlc "
                  "while another account's jobs shared the host)")),
    "ur-kt-2x6462c-l20-1t": Spec("NVIDIA L20", "Intel Xeon Gold 6462C", "pcie4", 2, (
        8, 4800, "box: '1024GB RAM(Hynix 64GB DDR5-4800 HMCG94MEBRA123N)': 16 DIMMs, 8 per 8-channel socket (inference)")),
    "ur-kt-tr7975wx-4090d-512g": Spec("NVIDIA GeForce RTX 4090 D", "AMD Ryzen Threadripper PRO 7975WX", "pcie4", 1, (
        8, 5200, "box: '8x DDR5-5200 64GB ECC'")),
    "ur-kt-2x2698v4-4090-512g": Spec("NVIDIA GeForce RTX 4090", "Intel Xeon E5-2698 v4", "pcie4", 2),
    "ur-kt-2xp8136-4090-448g": Spec("NVIDIA GeForce RTX 4090", "Intel Xeon Platinum P-8136", "pcie4", 2, (
        0, 2400, "box: 'Memory: DDR4-2400 DRAM (448GB=64GB x 7)' over 2 NUMA nodes: 7 populated channels in all")),
    "ur-kt-2x6330-l40-2t": Spec("NVIDIA L40", "Intel Xeon Gold 6330", "pcie4", 2),
    "ur-kt-tr7965wx-a6000-256g": Spec("NVIDIA RTX A6000", "AMD Ryzen Threadripper PRO 7965WX", "pcie4", 1),
    "ur-kt-2x6230-rtx6000ada-512g": Spec("NVIDIA RTX 6000 Ada Generation", "Intel Xeon Gold 6230", "pcie4", 2),
    "ur-kt-gold6133-4090-502g": Spec("NVIDIA GeForce RTX 4090", "Intel Xeon Gold 6133", "pcie4", 1, why=(
        "one socket priced: the source does not state the socket count, and a run with one weight copy reads it at one "
        "socket's bandwidth either way")),
    "ur-kt-2x9355-8x5090-1511g": Spec("NVIDIA GeForce RTX 5090", "AMD EPYC 9355", "pcie5", 2),
    "ur-kt-millstone-rtxpro6000": Spec("NVIDIA RTX PRO 6000 Blackwell Server Edition", None, "pcie5"),
}
"""Profile -> how it is made. Boxes whose GPU the source does not name (ur-i9-14900k-unknown-gpu)
have no profile, nor boxes no run uses."""

TOTAL_CHANNELS = {"ur-kt-2xp8136-4090-448g": 7}
"""Boxes whose populated channels are stated for the box, not per socket (unbalanced sockets)."""

TENSOR_PER_SM_CLOCK = {
    # dense FP16 tensor TFLOPS with FP32 accumulate where the catalog found none, from a sibling
    # part of the same architecture scaled by memory bandwidth; decode at batch 1 is bound by
    # bandwidth, so these move no validated row (a prefill row would need the vendor figure)
    "NVIDIA GeForce RTX 3060": (71.0 * 360 / 936, "estimate: the RTX 3090's 71 dense FP16/FP32-acc tensor TFLOPS "
                                "(catalog) scaled by memory bandwidth, 360/936 (same Ampere GA10x tensor cores)"),
    "NVIDIA GeForce RTX 3080 Laptop GPU": (71.0 * 448 / 936, "estimate: the RTX 3090's 71 dense tensor TFLOPS "
                                           "(catalog) scaled by memory bandwidth, 448/936 (Ampere)"),
    "NVIDIA GeForce RTX 2080": (130.5 * 448 / 672, "estimate: the Quadro RTX 6000's 130.5 dense FP16 tensor TFLOPS "
                                "(catalog) scaled by memory bandwidth, 448/672 (same Turing TU10x)"),
    "AMD Radeon RX 6900 XT": (46.1 * 0.5, "estimate: not in the catalog; RDNA2 has no matrix cores: taken as half "
                              "the RX 7900 XT class FP16 figure, unsourced — bandwidth-bound rows only"),
    "AMD Radeon RX 7900 XT": (46.1, "estimate: not in the catalog (RDNA3 WMMA FP16 rate not found); "
                              "bandwidth-bound rows only"),
    "NVIDIA GeForce RTX 4070 Ti": (165.2 * 504.2 / 1008, "estimate: the RTX 4090's 165.2 dense BF16/FP32-acc tensor "
                                   "TFLOPS (catalog) scaled by memory bandwidth, 504.2/1008 (same Ada AD10x tensor "
                                   "cores) — bandwidth-bound rows only"),
    "NVIDIA GeForce RTX 4080": (165.2 * 716.8 / 1008, "estimate: the RTX 4090's 165.2 dense tensor TFLOPS (catalog) "
                                "scaled by memory bandwidth, 716.8/1008 (Ada) — bandwidth-bound rows only"),
    "NVIDIA GeForce RTX 3090 Ti": (71.0 * 1008 / 936, "estimate: the RTX 3090's 71 dense tensor TFLOPS (catalog) "
                                   "scaled by memory bandwidth, 1008/936 (same GA102) — bandwidth-bound rows only"),
    "NVIDIA L20": (181.05, "estimate: the L40's 181.05 dense BF16 TFLOPS (catalog; same AD102 generation, the same "
                   "864 GB/s): the L20's own tensor rate was not found — bandwidth-bound rows only"),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": (209.5, "estimate: the RTX 5090's 209.5 dense BF16 TFLOPS "
                                                     "(catalog; GB202 like it, the same 1792 GB/s): its own rate was "
                                                     "not found — bandwidth-bound rows only"),
}

ISA_WORDS = {"avx2": "AVX2", "avx512": "AVX-512", "amx": "AMX (with AVX-512)"}


def gpu_part(name: str) -> tuple[dict, dict]:
    entry = GPUS[name]
    return entry, entry["sources"]


def host_isa(b: dict, bsrc: dict, cpu_name: str | None) -> tuple[str, str]:
    """The host's widest vector ISA in words, and where it was read: the box's statement, else the catalog part's."""
    stated = str(b.get("cpu_isa", "unknown"))
    word = stated.split()[0].strip("()").lower() if stated != "unknown" else ""
    if word in ISA_WORDS:
        return ISA_WORDS[word], f"box: {bsrc.get('cpu_isa', stated)}"
    if cpu_name and CPUS[cpu_name]["isa"] in ISA_WORDS:
        return ISA_WORDS[CPUS[cpu_name]["isa"]], f"catalog {cpu_name}: {CPUS[cpu_name]['sources']['isa']}"
    return "unknown", "not stated and not in the catalog"


def int8_speedup(spec: Spec, b: dict, bsrc: dict) -> tuple[float, str]:
    """The host's `cpu_int8_speedup` and its source: the catalog CPU's integer dot product (or the
    box's, for a CPU the catalog lacks); 0 where neither is known. A run that forced another
    backend is the runtime's choice: the profile keeps the CPU's instructions and says so."""
    if spec.cpu is not None:
        kind, where = CPUS[spec.cpu]["int8_dot"], f"catalog {spec.cpu}: {CPUS[spec.cpu]['sources']['int8_dot']}"
    elif spec.int8_dot is not None:
        kind, where = spec.int8_dot
    else:
        return 0.0, "unknown: the source does not name the CPU (0: int8 kernels at the FP32 rate)"
    if kind not in INT8_DOT:
        return 0.0, f"unknown: {where} (0: int8 kernels at the FP32 rate)"
    speedup, how = INT8_DOT[kind]
    stated = str(b.get("cpu_isa", ""))
    forced = (f"; the box's runs chose the AVX2 backend ({bsrc.get('cpu_isa', stated)}): the runtime's choice, which "
              "its stack's fitted efficiency carries, not the CPU's") if "AVX2 backend" in stated else ""
    return speedup, f"{how}; {where}{forced}"


def memory_type(b: dict, cpu_name: str | None) -> str:
    """DDR4 or DDR5 (or unknown), from the box's memory statement, else the catalog part's."""
    for text in (str(b.get("ram", "")), str(CPUS[cpu_name]["memory"]) if cpu_name else ""):
        found = re.search(r"DDR[45]", text)
        if found:
            return found.group(0)
    return "unknown"


def profile(name: str) -> HardwareProfile:
    spec = MAP[name]
    base = spec.base or name
    b, bsrc = dict(BOXES[base]), dict(BOXES[base]["sources"])
    host_only = spec.gpu is None
    cores_note = ""
    if spec.why:
        b["cpu"] = f"{b['cpu']}: {spec.why}"
        if spec.sockets == 1 and b.get("cpu_sockets") == 2 and isinstance(b["cpu_cores"], int):
            b["cpu_cores"] = b["cpu_cores"] // 2
            cores_note = " (half the box's, one of its two sockets)"
        bsrc["cpu_sockets"] = spec.why
    sockets = spec.sockets
    isa, isa_src = host_isa(b, bsrc, spec.cpu)
    mem = memory_type(b, spec.cpu)
    gpu_text = "no GPU" if host_only else b["gpu"]
    v = dict(
        name=name,
        description=(f"published box {base}: {gpu_text}, host {b['cpu']}; host ISA {isa}, memory {mem} "
                     "(casmoe/sim/trust/published/boxes.toml)"),
        gpu="none" if host_only else spec.gpu,
        gpus=0 if host_only else (b["gpus_in_box"] if isinstance(b["gpus_in_box"], int) and b["gpus_in_box"] else 1),
        reserved_gib=1.5, matmul_efficiency=0.6, mem_efficiency=0.8, copy_latency_us=6.0, host_cap_gbs=0.0,
        layer_overhead_us=30.0, expert_overhead_us=10.0, handover_us=10.0,
        cpu=b["cpu"], cpu_tflops=0.0, cpu_mem_bw_gbs=0.0, cpu_sockets=sockets, host_reserved_gib=0.0,
    )
    s = dict(
        reserved_gib="assumption: CUDA context (~0.5 GiB) + activations and allocator slack (as the shipped profiles)",
        matmul_efficiency="assumption: as the shipped profiles (fraction of peak tensor throughput of prefill GEMMs)",
        mem_efficiency="assumption: as the shipped profiles (fraction of DRAM bandwidth of decode GEMVs)",
        h2d_pageable_gbs="the pinned rate scaled as the RTX 4090's measured pageable/pinned ratio, 13/24 (rtx4090x4.toml)",
        copy_latency_us="assumption: per-copy cost of cudaMemcpyAsync issue + DMA setup (as the shipped profiles)",
        host_cap_gbs="not modelled: one GPU per box",
        layer_overhead_us="estimate: ~10 kernels per decoder layer at ~3 us launch each (as the shipped profiles)",
        expert_overhead_us="estimate: 3 GEMMs + activation + scatter per expert at ~3 us launch each (as the shipped profiles)",
        handover_us="estimate: one device-to-device activation copy (as the shipped profiles)",
        p2p_gbs="assumption: activations between GPUs at the host link's rate",
        cpu_tflops="unknown: the source does not name the CPU (casmoe/sim/box/catalog/README.md)",
        cpu_mem_bw_gbs="unknown: the source does not name the CPU or its memory (casmoe/sim/box/catalog/README.md)",
        cpu_sockets=f"box: {bsrc.get('cpu_sockets', 'stated')}" if sockets else "not stated (0: one socket assumed)",
        host_reserved_gib="not stated (0: not modelled)",
    )
    if host_only:
        for f in GPU_FIELDS:
            v[f] = 0.0
            s[f] = "no GPU: the run computes every part of the model on the host"
        v["layer_overhead_us"] = v["expert_overhead_us"] = 0.0
        s["layer_overhead_us"] = s["expert_overhead_us"] = "no GPU: no kernel launches (the runtime's own costs are its stack's)"
        s["gpus"] = f"no GPU: {spec.why or bsrc.get('gpu', 'the box has none')}"
    else:
        g, gsrc = gpu_part(spec.gpu)
        tflops, tflops_src = g["bf16_tflops"], f"catalog {spec.gpu}: {gsrc['bf16_tflops']}"
        if not tflops:
            tflops, tflops_src = TENSOR_PER_SM_CLOCK[spec.gpu]
        rate = float(LINKS[spec.link]["pinned_gbs"])
        v.update(memory_gib=float(g["memory_gib"]), dense_tflops=float(tflops), mem_bw_gbs=float(g["mem_bw_gbs"]),
                 h2d_pinned_gbs=rate, h2d_pageable_gbs=round(rate * 13.0 / 24.0, 3), p2p_gbs=rate)
        s.update(
            gpus=f"box: {bsrc.get('gpus_in_box', 'not stated: one GPU used')}" if isinstance(b["gpus_in_box"], int)
            else "not stated: the one GPU the run used",
            memory_gib=f"catalog {spec.gpu}: {gsrc['memory_gib']}",
            dense_tflops=tflops_src,
            mem_bw_gbs=f"catalog {spec.gpu}: {gsrc['mem_bw_gbs']}",
            h2d_pinned_gbs=f"{spec.link}: {LINKS[spec.link]['source']}; the box's link: {bsrc.get('pcie') or g.get('pcie')}",
        )
    ram = b.get("ram_gib")
    if isinstance(ram, (int, float)) and ram:
        v["host_ram_gib"] = float(ram)
        s["host_ram_gib"] = f"box: {bsrc.get('ram_gib') or b.get('ram') or 'stated'}"
        v["host_reserved_gib"], s["host_reserved_gib"] = HOST_RESERVED_GIB, HOST_RESERVED_SOURCE
    else:
        s["host_ram_gib"] = "not stated by the source (0: not modelled)"
    if spec.cpu is not None:
        c, csrc = CPUS[spec.cpu], CPUS[spec.cpu]["sources"]
        n = sockets or 1
        if spec.memory is not None:
            per, mts, where = spec.memory
            channels = TOTAL_CHANNELS.get(name, per * n)
            bw = round(channels * 8 * mts / 1000, 3)
            v["cpu_mem_bw_gbs"] = bw
            s["cpu_mem_bw_gbs"] = (f"the box's memory: {channels} channels x 8 bytes x {mts} MT/s = {bw:g} GB/s "
                                   f"({where}); the part's peak: catalog {spec.cpu}: {csrc['mem_bw_gbs']}")
        else:
            bw = c["mem_bw_gbs"] * n
            v["cpu_mem_bw_gbs"] = float(bw)
            s["cpu_mem_bw_gbs"] = (f"catalog {spec.cpu} (the box does not state its memory configuration): "
                                   f"{csrc['mem_bw_gbs']}; x {n} socket(s)" if bw else
                                   f"unknown: catalog {spec.cpu}: {csrc['mem_bw_gbs']}")
        per_cycle = c["fp32_flops_per_cycle"] or 32
        ghz = c["boost_ghz"] or c["base_ghz"] or 2.0
        if isinstance(b["cpu_cores"], int):
            cores, cores_src = b["cpu_cores"], f"box: {bsrc.get('cpu_cores', b['cpu_cores'])}{cores_note}"
        elif c["cores"]:
            cores, cores_src = c["cores"] * n, f"catalog {spec.cpu}: {c['cores']} cores per socket x {n} ({csrc['cores']})"
        else:
            cores, cores_src = 0, ""
        if cores:
            v["cpu_cores"], s["cpu_cores"] = cores, cores_src
        v["cpu_tflops"] = round((cores or 8) * per_cycle * ghz / 1000, 3)
        s["cpu_tflops"] = (f"{cores or 'estimate: 8'} cores ({'box or catalog' if cores else 'not found'}) x {per_cycle} FP32 "
                           f"FLOP/cycle ({'catalog' if c['fp32_flops_per_cycle'] else 'estimate: one 512-bit or two 256-bit FMA units'}) "
                           f"x {ghz} GHz ({'catalog' if c['boost_ghz'] or c['base_ghz'] else 'estimate: clock not found'}); "
                           f"host ISA {isa} ({isa_src}), memory {mem}")
    v["cpu_int8_speedup"], s["cpu_int8_speedup"] = int8_speedup(spec, b, bsrc)
    if spec.host_bw is not None and not v["cpu_mem_bw_gbs"]:
        v["cpu_mem_bw_gbs"], s["cpu_mem_bw_gbs"] = spec.host_bw
    if spec.storage is not None:
        v["storage_read_gbs"], s["storage_read_gbs"] = spec.storage
        v["storage_latency_us"] = 80.0
        s["storage_latency_us"] = ("assumption: NVMe read latency at low queue depth, 60-100 us for 4 KiB random reads "
                                   "(as the shipped profiles a100-80g, h100-sxm)")
    absent = "not stated by the source (0: not modelled)"
    return HardwareProfile(**v, sources={k: s.get(k, absent) for k in HardwareProfile.numeric_fields()})


HEAD = ("# Generated by bench/published_profiles.py from casmoe/sim/trust/published/boxes.toml and "
        "casmoe/sim/box/catalog/: do not edit by hand.\n")


def text(name: str) -> str:
    """The file this script writes for one profile (a test holds the shipped files to it)."""
    return HEAD + profile(name).to_toml()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in MAP:
        p = profile(name)
        (OUT / f"{name}.toml").write_text(text(name))
        print(name, p.gpu, f"{p.h2d_pinned_gbs:g} GB/s link", f"host {p.cpu_mem_bw_gbs:g} GB/s {p.cpu_tflops:g} TFLOPS",
              f"{p.cpu_cores} cores", f"RAM {p.host_ram_gib:g} GiB", f"drive {p.storage_read_gbs:g} GB/s")


if __name__ == "__main__":
    main()
