"""Write the hardware profiles of the published measurements' boxes: `casmoe/sim/trust/published/profiles/*.toml`.

Each box of `casmoe/sim/trust/published/boxes.toml` (what the paper or report says it ran on) is joined with
the parts catalogs (`casmoe/sim/box/catalog/gpus.toml`, `cpus.toml`: vendor specs) into a full profile,
every number sourced: from the box, the catalog, a link generation (`casmoe/sim/box/links.toml`), or the
same stated assumption the shipped profiles make (kernel efficiencies, launch overheads). What
neither says is 0 with a source saying so (a host of unknown bandwidth cannot price host experts,
and `casmoe validate published` leaves such rows out, saying why). Rerun after editing either:

    python bench/published_profiles.py
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from casmoe.sim.box.hardware import HardwareProfile

ROOT = Path(__file__).resolve().parents[1] / "casmoe" / "sim"
BOXES = tomllib.loads((ROOT / "trust" / "published" / "boxes.toml").read_text())
GPUS = tomllib.loads((ROOT / "box" / "catalog" / "gpus.toml").read_text())
CPUS = tomllib.loads((ROOT / "box" / "catalog" / "cpus.toml").read_text())
LINKS = tomllib.loads((ROOT / "box" / "links.toml").read_text())
OUT = ROOT / "trust" / "published" / "profiles"

# box -> (catalog GPU, catalog CPU or None, link generation, sockets, host bandwidth override (GB/s, source) or None)
# The link generation is the box's where it says one, else the GPU's own interface (catalog).
MAP: dict[str, tuple[str, str | None, str, int, tuple[float, str] | None]] = {
    "mixoff-a100-sxm": ("NVIDIA A100-SXM4-80GB", None, "pcie4", 0, None),
    "mixoff-laptop-rtx3080m": ("NVIDIA GeForce RTX 3080 Laptop GPU", None, "pcie4", 1, None),
    "mixoff-desktop-rtx3060": ("NVIDIA GeForce RTX 3060", None, "pcie3", 1, None),
    "colab-t4-free": ("Tesla T4", None, "pcie3", 0, None),
    "azure-t4": ("Tesla T4", None, "pcie3", 0, None),
    "fiddler-env1-quadro-rtx6000": ("Quadro RTX 6000", None, "pcie3", 0, None),
    "fiddler-env2-l4": ("NVIDIA L4", None, "pcie4", 0, None),
    "moeinf-readme-a5000": ("NVIDIA RTX A5000", None, "pcie4", 0, None),
    "moeinf-paper-a5000-32g": ("NVIDIA RTX A5000", None, "pcie4", 0, None),
    "moeinf-paper-a5000-128g": ("NVIDIA RTX A5000", None, "pcie4", 0, None),
    "ktrans-2x6454s-4090d": ("NVIDIA GeForce RTX 4090 D", "Intel Xeon Gold 6454S", "pcie4", 2, None),
    "ktrans-2x6454s-4090": ("NVIDIA GeForce RTX 4090", "Intel Xeon Gold 6454S", "pcie4", 2, None),
    "ktrans-2x6454s-4090d-1socket": ("NVIDIA GeForce RTX 4090 D", "Intel Xeon Gold 6454S", "pcie4", 1, None),
    "moel-s1-t4-24c": ("Tesla T4", None, "pcie3", 0, None),
    "moel-s2-l4-24c": ("NVIDIA L4", None, "pcie4", 0, None),
    "hybrimoe-a6000-5220r-10c": ("NVIDIA RTX A6000", "Intel Xeon Gold 5220R", "pcie4", 1, None),
    "moegen-c1-a5000-256g": ("NVIDIA RTX A5000", "AMD EPYC 7453", "pcie4", 1, None),
    "moegen-c2-a5000-512g": ("NVIDIA RTX A5000", "AMD EPYC 7453", "pcie4", 1, None),
    "hobbit-4090-64c": ("NVIDIA GeForce RTX 4090", None, "pcie4", 0, None),
    "pregated-a100-epyc7v12": ("NVIDIA A100 80GB PCIe", "AMD EPYC 7V12", "pcie4", 0, None),
    "ur-rtx3090-epyc7343-64g": ("NVIDIA GeForce RTX 3090", "AMD EPYC 7343", "pcie4", 1, None),
    "ur-rx6900xt-r9-7900-64g": ("AMD Radeon RX 6900 XT", "AMD Ryzen 9 7900", "pcie4", 1, None),
    "ur-rx7900xt-r9-5900x-32g": ("AMD Radeon RX 7900 XT", "AMD Ryzen 9 5900X", "pcie4", 1, None),
    "ur-rtx3090-unknown-host": ("NVIDIA GeForce RTX 3090", None, "pcie4", 0, None),
    "ur-rtx2080-i9-10900x-62g": ("NVIDIA GeForce RTX 2080", "Intel Core i9-10900X", "pcie3", 1,
                                 (102.0, "the user's own measurement, as boxes.toml quotes it: 'DDR4, 4 channels (~102 GB/s measured by the user)'")),
    "ur-2x-rtx5090-unknown-host": ("NVIDIA GeForce RTX 5090", None, "pcie5", 0, None),
}
"""Boxes whose GPU the source does not name (ur-i9-14900k-unknown-gpu) have no profile."""

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
}


def gpu_part(name: str) -> tuple[dict, dict]:
    entry = GPUS[name]
    return entry, entry["sources"]


VARIANTS = {"ktrans-2x6454s-4090d-1socket": ("ktrans-2x6454s-4090d", "one socket of it: the single-socket rows run "
                                            "`numactl -N 1 -m 1 ... --cpu_infer 33` (measurements.toml notes)")}
"""Profiles of a box as a run used part of it: (box, why)."""


def profile(box: str) -> HardwareProfile:
    gpu_name, cpu_name, link, sockets, bw_override = MAP[box]
    base, why = VARIANTS.get(box, (box, ""))
    b, bsrc = dict(BOXES[base]), dict(BOXES[base]["sources"])
    if why:
        b["cpu_cores"] = b["cpu_cores"] // 2 if isinstance(b["cpu_cores"], int) else b["cpu_cores"]
        b["cpu"] = f"{b['cpu']}: {why}"
        bsrc["cpu_sockets"] = why
    g, gsrc = gpu_part(gpu_name)
    tflops, tflops_src = g["bf16_tflops"], f"catalog {gpu_name}: {gsrc['bf16_tflops']}"
    if not tflops:
        tflops, tflops_src = TENSOR_PER_SM_CLOCK[gpu_name]
    rate = float(LINKS[link]["pinned_gbs"])
    v = dict(
        name=box,
        description=f"published box {box}: {b['gpu']}, host {b['cpu']} (casmoe/sim/trust/published/boxes.toml)",
        gpu=gpu_name,
        gpus=b["gpus_in_box"] if isinstance(b["gpus_in_box"], int) else 1,
        memory_gib=float(g["memory_gib"]),
        reserved_gib=1.5,
        dense_tflops=float(tflops),
        mem_bw_gbs=float(g["mem_bw_gbs"]),
        matmul_efficiency=0.6,
        mem_efficiency=0.8,
        h2d_pinned_gbs=rate,
        h2d_pageable_gbs=round(rate * 13.0 / 24.0, 3),
        copy_latency_us=6.0,
        host_cap_gbs=0.0,
        layer_overhead_us=30.0,
        expert_overhead_us=10.0,
        handover_us=10.0,
        p2p_gbs=rate,
        cpu=b["cpu"],
        cpu_tflops=0.0,
        cpu_mem_bw_gbs=0.0,
        host_ram_gib=float(b["ram_gib"]) if isinstance(b["ram_gib"], (int, float)) else 0.0,
        cpu_sockets=sockets,
        host_reserved_gib=0.0,
    )
    s = dict(
        gpus=f"box: {bsrc.get('gpus_in_box', 'not stated: one GPU used')}" if isinstance(b["gpus_in_box"], int)
        else "not stated: the one GPU the run used",
        memory_gib=f"catalog {gpu_name}: {gsrc['memory_gib']}",
        reserved_gib="assumption: CUDA context (~0.5 GiB) + activations and allocator slack (as the shipped profiles)",
        dense_tflops=tflops_src,
        mem_bw_gbs=f"catalog {gpu_name}: {gsrc['mem_bw_gbs']}",
        matmul_efficiency="assumption: as the shipped profiles (fraction of peak tensor throughput of prefill GEMMs)",
        mem_efficiency="assumption: as the shipped profiles (fraction of DRAM bandwidth of decode GEMVs)",
        h2d_pinned_gbs=f"{link}: {LINKS[link]['source']}; the box's link: {bsrc.get('pcie') or g.get('pcie')}",
        h2d_pageable_gbs="the pinned rate scaled as the RTX 4090's measured pageable/pinned ratio, 13/24 (rtx4090x4.toml)",
        copy_latency_us="assumption: per-copy cost of cudaMemcpyAsync issue + DMA setup (as the shipped profiles)",
        host_cap_gbs="not modelled: one GPU per box",
        layer_overhead_us="estimate: ~10 kernels per decoder layer at ~3 us launch each (as the shipped profiles)",
        expert_overhead_us="estimate: 3 GEMMs + activation + scatter per expert at ~3 us launch each (as the shipped profiles)",
        handover_us="estimate: one device-to-device activation copy (as the shipped profiles)",
        p2p_gbs="assumption: activations between GPUs at the host link's rate",
        cpu_tflops="unknown: the source does not name the CPU (casmoe/sim/box/catalog/README.md)",
        cpu_mem_bw_gbs="unknown: the source does not name the CPU or its memory (casmoe/sim/box/catalog/README.md)",
        host_ram_gib=f"box: {bsrc.get('ram_gib', 'not stated')}" if v["host_ram_gib"] else "not stated by the source (0: not modelled)",
        cpu_sockets=f"box: {bsrc.get('cpu_sockets', 'stated')}" if sockets else "not stated (0: one socket assumed)",
        host_reserved_gib="not stated (0: not modelled)",
    )
    if cpu_name is not None:
        c, csrc = CPUS[cpu_name], CPUS[cpu_name]["sources"]
        n = sockets or 1
        bw = c["mem_bw_gbs"] * n
        v["cpu_mem_bw_gbs"] = float(bw)
        s["cpu_mem_bw_gbs"] = (f"catalog {cpu_name}: {csrc['mem_bw_gbs']}; x {n} socket(s)" if bw else
                               f"unknown: catalog {cpu_name}: {csrc['mem_bw_gbs']}")
        per_cycle = c["fp32_flops_per_cycle"] or 32
        ghz = c["boost_ghz"] or c["base_ghz"] or 2.0
        cores = b["cpu_cores"] if isinstance(b["cpu_cores"], int) else c["cores"] * n
        v["cpu_tflops"] = round(cores * per_cycle * ghz / 1000, 3)
        s["cpu_tflops"] = (f"{cores} cores (box or catalog) x {per_cycle} FP32 FLOP/cycle "
                           f"({'catalog' if c['fp32_flops_per_cycle'] else 'estimate: one 512-bit or two 256-bit FMA units'}) "
                           f"x {ghz} GHz ({'catalog' if c['boost_ghz'] or c['base_ghz'] else 'estimate: clock not found'})")
    if bw_override is not None:
        v["cpu_mem_bw_gbs"], s["cpu_mem_bw_gbs"] = bw_override
    absent = "not stated by the source (0: not modelled)"
    return HardwareProfile(**v, sources={k: s.get(k, absent) for k in HardwareProfile.numeric_fields()})


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for box in MAP:
        p = profile(box)
        head = "# Generated by bench/published_profiles.py from casmoe/sim/trust/published/boxes.toml and casmoe/sim/box/catalog/: do not edit by hand.\n"
        (OUT / f"{box}.toml").write_text(head + p.to_toml())
        print(box, p.gpu, f"{p.h2d_pinned_gbs:g} GB/s link", f"host {p.cpu_mem_bw_gbs:g} GB/s", f"RAM {p.host_ram_gib:g} GiB")


if __name__ == "__main__":
    main()
