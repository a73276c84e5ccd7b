"""The user's box, detected: a `HardwareProfile` of the machine this runs on, or of one whose
tools' outputs were recorded, every number sourced as read, measured or assumed.

A user should not have to write a profile by hand to ask what their own machine does. The
detector reads the GPUs (NVML or nvidia-smi, rocm-smi), the CPU (lscpu or /proc/cpuinfo), the
RAM (/proc/meminfo), the memory modules (dmidecode, as root) and the NUMA nodes (sysfs); it
takes the parts' vendor figures from the shipped catalogs (`casmoe.sim.box.parts`) and, where
the host's memory cannot be read, measures it (`casmoe.sim.box.bandwidth`). Each `[sources]`
string starts with `detected:`, `measured:` or `assumed:` and says from what, how or why, so a
user sees at once which numbers to check. Nothing here prints: the command line
(`casmoe hardware detect`) shows `Detected.rows()`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from casmoe.sim.box import parts
from casmoe.sim.box.bandwidth import Stream, array_bytes, stream_copy
from casmoe.sim.box.hardware import FASTEST_REAL, GPU_FIELDS, HOST_RESERVED_GIB, HOST_RESERVED_SOURCE, HardwareProfile
from casmoe.sim.box.reader import Reader, SystemReader
from casmoe.sim.box.readings import (
    ASSUMED,
    DETECTED,
    MEASURED,
    Cpu,
    Dimms,
    Fact,
    Gpu,
    detected,
    read_cpu,
    read_dimms,
    read_gpus,
    read_numa,
    read_ram_gib,
)

GPU_ASSUMED: dict[str, tuple[float, str]] = {
    "reserved_gib": (1.5, "CUDA context (~0.5 GiB) + activations and allocator slack, as the published boxes' profiles"),
    "matmul_efficiency": (0.6, "as the shipped profiles: fraction of peak tensor throughput reached by prefill GEMMs"),
    "mem_efficiency": (0.8, "as the shipped profiles: fraction of DRAM bandwidth reached by decode GEMVs"),
    "copy_latency_us": (6.0, "as the shipped profiles: per-copy cost of a copy's issue and DMA setup"),
    "layer_overhead_us": (30.0, "as the shipped profiles: ~10 kernels per decoder layer at ~3 us launch each"),
    "expert_overhead_us": (10.0, "as the shipped profiles: 3 GEMMs + activation + scatter per expert at ~3 us each"),
    "handover_us": (10.0, "as the shipped profiles: one device-to-device activation copy, fixed cost"),
    "host_cap_gbs": (0.0, "not modelled: the host side is taken not to limit the GPUs' links together"),
}
"""What a detected GPU box takes from the shipped profiles: kernel efficiencies and launch costs
that only a run of the runtime measures (`casmoe calibrate`)."""

PAGEABLE_SHARE = (13.0 / 24.0, "the pinned rate x 13/24, the RTX 4090's measured pageable/pinned ratio (rtx4090x4.toml)")

RUNTIME_COSTS = ("load_host_us", "load_layer_us", "wake_us", "resume_per_stall", "copy_beside_us", "decide_us",
                 "decide_load_us", "expert_pass_us")
"""A runtime's own costs: a property of the software, not of the box (`casmoe calibrate`)."""

DEFAULT_GHZ = (2.0, ("2.0 GHz, the base clock of the slowest current server parts (Xeon Gold 6330: 2.0 GHz, "
                     "catalog/cpus.toml)"))
DEFAULT_CHANNEL = (2, 3200.0, ("2 channels of DDR4-3200 per socket (8 B x 3200 MT/s = 25.6 GB/s each), a desktop's "
                               "memory; a server has 6 to 12 channels"))


@dataclass(frozen=True)
class Detected:
    """A detected box: its profile (each source says read, measured or assumed) and the facts
    read besides its numbers (the GPUs, the ISA, the NUMA nodes, the memory modules, the
    measured rates)."""

    profile: HardwareProfile
    facts: dict[str, Fact]

    @property
    def provenance(self) -> dict[str, str]:
        """How each number of the profile was obtained: 'detected', 'measured' or 'assumed'."""
        return {n: s.split(":", 1)[0] for n, s in self.profile.sources.items()}

    def rows(self) -> list[dict[str, str]]:
        """The facts, then every number of the profile: value, how (read, measured, assumed),
        from what."""
        shown = {DETECTED: "read", MEASURED: "measured", ASSUMED: "assumed"}
        out = [{"field": k, "value": str(f.value), "how": shown[f.how], "from": f.source} for k, f in self.facts.items()]
        for n in HardwareProfile.numeric_fields():
            how, _, source = self.profile.sources[n].partition(": ")
            out.append({"field": n, "value": f"{getattr(self.profile, n):.4g}", "how": shown[how], "from": source})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.to_dict(), "provenance": self.provenance,
                "facts": {k: {"value": f.value if isinstance(f.value, (int, float, str)) else str(f.value),
                              "how": f.how, "source": f.source} for k, f in self.facts.items()}}


Probe = Callable[[int, int], Stream]
"""Measures the host's copy rate: (threads, bytes per array) -> `Stream`."""


def detect(reader: Reader, probe: Probe | None = None, name: str = "detected",
           note: Callable[[str], None] | None = None) -> Detected:
    """The profile of the machine `reader` reads. `probe` measures the host's memory where it
    cannot be read (None: assumed instead, as for a recorded box, which is not this machine);
    `note` hears a line before the probe runs (it takes about a second)."""
    cpu = read_cpu(reader)
    gpus, gpu_notes = read_gpus(reader)
    dimms = read_dimms(reader)
    facts: dict[str, Fact] = {}
    gpu, values = _gpu(gpus, gpu_notes, facts)
    stream = None
    if probe is not None:
        threads = int(cpu.threads.value) if cpu.threads else os.cpu_count() or 1
        nbytes = array_bytes(cpu.l3_bytes)
        if note:
            note(f"measuring host memory bandwidth: numpy copy of {nbytes / 2**20:.0f} MiB, 1 and {threads} threads ...")
        stream = (probe(1, nbytes), probe(threads, nbytes))
        for s in stream:
            facts[f"copy rate, {s.threads} thread{'s' * (s.threads > 1)}"] = Fact(round(s.gbs, 1), MEASURED, s.how)
    values.update(_host(reader, cpu, dimms, stream, bool(gpus), facts))
    numa = read_numa(reader)
    if numa:
        facts["NUMA nodes"] = numa
    kinds = {f.name: f.type for f in fields(HardwareProfile)}
    numbers = {k: int(f.value) if kinds[k] == "int" else float(f.value) for k, f in values.items()}
    profile = HardwareProfile(name=name, description=_describe(gpu, values), gpu=gpu, cpu=_cpu_text(cpu, values),
                              **numbers, sources={k: f.text for k, f in values.items()})
    return Detected(profile, facts)


@cache
def detect_profile(measure: bool = True) -> Detected:
    """This machine's profile (measured once a process: the probe takes about a second), for a
    command given no --hardware."""
    return detect(SystemReader(), stream_copy if measure else None)


# ------------------------------------------------------------------ GPUs


def _gpu(gpus: list[Gpu], notes: list[str], facts: dict[str, Fact]) -> tuple[str, dict[str, Fact]]:
    """The GPU's name and numbers: the commonest GPU model read (a profile holds one kind), its
    catalog figures and its link's rate; all 0 with the reason when none was found."""
    if not gpus:
        why = "no GPU: " + ("; ".join(notes) or "NVML, nvidia-smi and rocm-smi found none (or are not installed)")
        launches = ("layer_overhead_us", "expert_overhead_us", "cpu_hop_us")
        return "none", {"gpus": detected(0, why), **{n: detected(0.0, why) for n in (*GPU_FIELDS, *launches)}}
    count = Counter(g.name for g in gpus)
    name, n = count.most_common(1)[0]
    same = [g for g in gpus if g.name == name]
    via = same[0].via
    others = {k: v for k, v in count.items() if k != name}
    facts["GPUs"] = detected(", ".join(f"{v}x {k}" for k, v in count.items()), via)
    out: dict[str, Fact] = {}
    out["gpus"] = detected(n, f"{via}: {n} x '{name}'" + (
        f"; also {', '.join(f'{v} x {k!r}' for k, v in others.items())}, not in the profile (it holds one kind of GPU)"
        if others else ""))
    key, known = (parts.gpu_entry(name), True)
    if key is None:
        key, known = parts.nearest_gpu(name), False
    entry = parts.gpu_catalog()[key]
    whose = (f"catalog gpus.toml '{key}'" if known else
             f"'{name}' is not in catalog gpus.toml; the entry nearest by name, '{key}'")
    memory = [g.memory_mib for g in same]
    if all(memory):
        out["memory_gib"] = detected(min(memory) / 1024, f"{via}: {min(memory):g} MiB")  # type: ignore[type-var]
    else:
        out["memory_gib"] = Fact(float(entry["memory_gib"]), ASSUMED, f"not read; {whose}: {entry['sources']['memory_gib']}")
    for figure, field in (("bf16_tflops", "dense_tflops"), ("mem_bw_gbs", "mem_bw_gbs")):
        if entry.get(figure):
            out[field] = Fact(float(entry[figure]), DETECTED if known else ASSUMED, f"{whose}: {entry['sources'][figure]}")
        else:
            stand_in = parts.nearest_with(key, figure)
            out[field] = Fact(float(parts.gpu_catalog()[stand_in][figure]), ASSUMED,
                              f"{whose} has no {figure} ({entry['sources'][figure]}); the entry nearest in memory "
                              f"bandwidth that has one, '{stand_in}': {parts.gpu_catalog()[stand_in]['sources'][figure]}")
    out["h2d_pinned_gbs"] = _link(same, key, whose, facts)
    pinned = out["h2d_pinned_gbs"].value
    out["h2d_pageable_gbs"] = Fact(round(pinned * PAGEABLE_SHARE[0], 3), ASSUMED, PAGEABLE_SHARE[1])
    out["p2p_gbs"] = Fact(pinned, ASSUMED, "activations between GPUs at the host link's rate (NVLink is not detected)")
    for field, (value, why) in GPU_ASSUMED.items():
        out[field] = Fact(value, ASSUMED, why)
    out["cpu_hop_us"] = Fact(GPU_ASSUMED["copy_latency_us"][0], ASSUMED, "one small copy each way: copy_latency_us")
    return name, out


def _link(same: list[Gpu], key: str, whose: str, facts: dict[str, Fact]) -> Fact:
    """The pinned host-to-device rate of the GPUs' link: read (the slowest GPU's), else the
    catalog's interface for the part, else PCIe 4.0 x16."""
    if all(g.pcie_gen and g.pcie_width for g in same):
        gen, width = min(g.pcie_gen for g in same), min(g.pcie_width for g in same)  # type: ignore[type-var]
        facts["GPU link"] = detected(f"PCIe {gen}.0 x{width}", f"{same[0].via} (the fastest the GPU and its slot share)")
        rate, source, exact = parts.link_rate(gen, width)
        return Fact(rate, DETECTED if exact else ASSUMED, f"PCIe {gen}.0 x{width} read; rate from {source}")
    on_card = parts.catalog_link(key)
    gen, width = on_card or (4, 16)
    rate, source, _ = parts.link_rate(gen, width)
    why = (f"the link was not read; {whose}'s interface, PCIe {gen}.0 x{width}" if on_card else
           "the link was neither read nor in the catalog; PCIe 4.0 x16 taken (the commonest GPU link)")
    return Fact(rate, ASSUMED, f"{why}; rate from {source}")


# ------------------------------------------------------------------ host


def _host(reader: Reader, cpu: Cpu, dimms: Dimms | str, stream: tuple[Stream, Stream] | None, has_gpu: bool,
          facts: dict[str, Fact]) -> dict[str, Fact]:
    """The host numbers: CPU compute from its cores, FMA width and clock; DRAM bandwidth from
    the memory modules, the catalog, a measurement or a stated default; RAM; what no tool
    reads (storage, a runtime's costs) 0 with the reason."""
    key = parts.cpu_entry(cpu.model.value) if cpu.model else None
    entry = parts.cpu_catalog()[key] if key else None
    if cpu.model:
        facts["CPU"] = Fact(cpu.model.value, DETECTED, cpu.model.source + (f"; catalog cpus.toml '{key}'" if key else
                                                                          "; not in catalog cpus.toml"))
    if cpu.flags:
        facts["ISA"] = detected(_isa(cpu.flags.value), cpu.flags.source)
    sockets = cpu.sockets.value if cpu.sockets else 1
    out: dict[str, Fact] = {
        "cpu_sockets": cpu.sockets or Fact(0, ASSUMED, "not read (no lscpu or /proc/cpuinfo); 0: one socket"),
        "cpu_cores": cpu.cores or Fact(0, ASSUMED, "not read (no lscpu or /proc/cpuinfo); 0: not stated"),
        "cpu_threads": Fact(0, ASSUMED, "0: the runtime runs one thread per core"),
        "cpu_tflops": _flops(cpu, key, entry),
        "cpu_mem_bw_gbs": _dram(dimms, key, entry, sockets, stream, facts),
        "cpu_thread_gbs": Fact(round(stream[0].gbs, 1), MEASURED, stream[0].how) if stream else
        Fact(0.0, ASSUMED, "not measured (0: one thread is not taken to limit)"),
        "cpu_mem_efficiency": Fact(0.0, ASSUMED, "0: left to the software stack's share of the peak"),
        "cpu_matmul_efficiency": Fact(0.0, ASSUMED, "0: left to the software stack's share of the peak"),
        "cpu_matrix_speedup": Fact(0.0, ASSUMED, ("AMX read in the flags, but no sourced speedup of it; "
                                                  if cpu.flags and "amx_tile" in cpu.flags.value else "")
                                   + "0: no matrix units modelled"),
        "cpu_int8_speedup": _int8_dot(cpu, key, entry),
        "cpu_bf16_speedup": _bf16_dot(cpu),
        "cpu_serial": Fact(0.0 if has_gpu else 1.0, ASSUMED, "the host's experts run beside the GPU's" if has_gpu else
                           "no GPU: the host computes every expert, on the runtime's one thread pool"),
        "storage_read_gbs": Fact(0.0, ASSUMED, "not detected (0: not modelled); give the drive's read rate"),
        "storage_latency_us": Fact(0.0, ASSUMED, "not detected (0: not modelled)"),
        **{n: Fact(0.0, ASSUMED, "a runtime's cost, not the box's: `casmoe calibrate` measures it (0: not modelled)")
           for n in RUNTIME_COSTS},
    }
    ram = read_ram_gib(reader)
    out["host_ram_gib"] = Fact(round(ram.value, 2), DETECTED, ram.source) if ram else \
        Fact(0.0, ASSUMED, "not read (no /proc/meminfo or psutil); 0: not modelled")
    out["host_reserved_gib"] = Fact(HOST_RESERVED_GIB, ASSUMED, HOST_RESERVED_SOURCE) if ram else \
        Fact(0.0, ASSUMED, "host RAM not read (0: not modelled)")
    return out


def _isa(flags: frozenset[str]) -> str:
    """The vector and matrix extensions that matter for expert kernels, as flags name them."""
    named = [("avx2", "AVX2"), ("fma", "FMA"), ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX-512"),
             ("avx512_vnni", "AVX-512 VNNI"), ("avx512_bf16", "AVX-512 BF16"), ("amx_tile", "AMX"), ("asimd", "NEON"),
             ("sve", "SVE")]
    return ", ".join(label for flag, label in named if flag in flags) or "none of AVX2, AVX-512, AMX, NEON"


def _int8_dot(cpu: Cpu, key: str | None, entry: dict[str, Any] | None) -> Fact:
    """How many times the host's integer dot products raise the FP32 multiply-add rate for ggml's
    quantised types (`HardwareProfile.cpu_int8_speedup`, `parts.INT8_DOT`): from the flags (VNNI:
    4, AVX2 alone: 2), else from the catalog's entry for the CPU, else 0 with the reason."""
    if cpu.flags:
        flags = cpu.flags.value
        vnni = sorted(flags & {"avx512_vnni", "avx_vnni"})
        if vnni:
            speedup, why = parts.INT8_DOT["vpdpbusd"]
            return detected(speedup, f"{cpu.flags.source}: {' and '.join(vnni)}; {why}")
        if "avx2" in flags:
            speedup, why = parts.INT8_DOT["vpmaddubsw"]
            return detected(speedup, f"{cpu.flags.source}: avx2 without VNNI; {why}")
        return Fact(0.0, ASSUMED, "neither VNNI nor AVX2 in the flags (Arm's SDOT, asimddp, is not modelled); 0: int8 "
                                  "kernels at the FP32 rate")
    if entry and entry["int8_dot"] in parts.INT8_DOT:
        speedup, why = parts.INT8_DOT[entry["int8_dot"]]
        return detected(speedup, f"flags not read; catalog '{key}': {entry['sources']['int8_dot']}; {why}")
    unknown = f"catalog '{key}' does not know it ({entry['sources']['int8_dot']})" if entry else "the CPU not in the catalog"
    return Fact(0.0, ASSUMED, f"flags not read (no lscpu or /proc/cpuinfo) and {unknown}; 0: int8 kernels at the FP32 rate")


def _bf16_dot(cpu: Cpu) -> Fact:
    """How many times BF16 dot products raise the FP32 multiply-add rate for BF16 weights
    (`HardwareProfile.cpu_bf16_speedup`): 2 with AVX512_BF16 in the flags, else 0 and why."""
    if not cpu.flags:
        return Fact(0.0, ASSUMED, "flags not read (no lscpu or /proc/cpuinfo); 0: BF16 kernels at the FP32 rate")
    if "avx512_bf16" in cpu.flags.value:
        speedup, why = FASTEST_REAL["cpu_bf16_speedup"]
        return detected(speedup, f"{cpu.flags.source}: avx512_bf16; {why}; ggml uses it for BF16 weights "
                                 "(ggml_vec_dot_bf16 and tinyBLAS under __AVX512BF16__, llama.cpp 0c1e5709)")
    return Fact(0.0, ASSUMED, "no avx512_bf16 in the flags (Arm's BF16 instructions are not modelled): ggml's x86 "
                              "kernels convert BF16 weights to FP32 before their FMAs; 0: the FP32 rate")


def _flops(cpu: Cpu, key: str | None, entry: dict[str, Any] | None) -> Fact:
    """Peak FP32 FLOP/s of all cores: cores x FLOP per cycle (the catalog's, else the vector
    width and FMA the flags show) x clock (lscpu's maximum, the model name's rated clock, the
    catalog's, the clock when read, else a stated default)."""
    if not cpu.cores:
        return Fact(0.0, ASSUMED, "cores not read: the host's compute is not priced (0)")
    per_cycle = _per_cycle(cpu, key, entry)
    ghz = _ghz(cpu, key, entry)
    how = DETECTED if per_cycle.how == ghz.how == DETECTED else ASSUMED
    tflops = cpu.cores.value * per_cycle.value * ghz.value / 1000
    return Fact(round(tflops, 3), how, f"{cpu.cores.value} cores ({cpu.cores.source}) x {per_cycle.value} FP32 FLOP/cycle "
                                       f"({per_cycle.text}) x {ghz.value:g} GHz ({ghz.text})")


def _per_cycle(cpu: Cpu, key: str | None, entry: dict[str, Any] | None) -> Fact:
    if entry and entry["fp32_flops_per_cycle"]:
        return detected(entry["fp32_flops_per_cycle"], f"catalog '{key}': {entry['sources']['fp32_flops_per_cycle']}")
    flags = cpu.flags.value if cpu.flags else frozenset()
    if "avx512f" in flags or {"avx2", "fma"} <= flags:
        return Fact(32, ASSUMED, "AVX2/AVX-512 with FMA in the flags: 16 FP32 lanes x 2 FLOP, one 512-bit or two "
                                 "256-bit FMA units a core (parts with two 512-bit units reach 64)")
    if "avx" in flags:
        return Fact(16, ASSUMED, "AVX without FMA in the flags: one 256-bit add and one multiply a cycle, 8 lanes x 2")
    if "asimd" in flags:
        return Fact(16, ASSUMED, "NEON (asimd) in the flags: two 128-bit FMA pipes a core, 4 lanes x 2 x 2 FLOP "
                                 "(Arm Cortex-A76, Neoverse N1)")
    return Fact(8, ASSUMED, "no AVX or NEON in the flags read: SSE's 128-bit add and multiply a cycle, 4 lanes x 2")


def _ghz(cpu: Cpu, key: str | None, entry: dict[str, Any] | None) -> Fact:
    if cpu.mhz:
        return Fact(cpu.mhz.value / 1000, DETECTED, cpu.mhz.source)
    rated = re.search(r"@\s*([\d.]+)\s*GHz", cpu.model.value) if cpu.model else None
    if rated:
        return detected(float(rated.group(1)), f"the model name's rated clock '{rated.group(0)}'")
    for clock in ("boost_ghz", "base_ghz"):
        if entry and entry[clock]:
            return detected(entry[clock], f"catalog '{key}': {entry['sources'][clock]}")
    if cpu.clock:
        return Fact(cpu.clock.value / 1000, DETECTED, cpu.clock.source)
    return Fact(DEFAULT_GHZ[0], ASSUMED, f"clock not read: {DEFAULT_GHZ[1]}")


def _dram(dimms: Dimms | str, key: str | None, entry: dict[str, Any] | None, sockets: int,
          stream: tuple[Stream, Stream] | None, facts: dict[str, Fact]) -> Fact:
    """Peak DRAM bandwidth of all sockets: the modules' channels x 8 B x their speed (dmidecode),
    else the catalog's peak (every channel populated at the rated speed), else the measured
    copy rate (an achieved rate: a floor of the peak), else a stated default."""
    if isinstance(dimms, Dimms):
        gbs = dimms.channels * 8 * dimms.mts / 1000
        facts["memory"] = detected(f"{dimms.kind}-{dimms.mts:g}, {dimms.modules} modules on {dimms.channels} channels",
                                   f"dmidecode ({dimms.channel_rule})")
        return detected(round(gbs, 1), f"dmidecode: {dimms.channels} channels ({dimms.channel_rule}) x 8 B x "
                                       f"{dimms.mts:g} MT/s ({dimms.kind}, the slowest module's configured speed)")
    facts["memory"] = Fact("not read", ASSUMED, dimms)
    if entry and entry["mem_bw_gbs"]:
        return Fact(entry["mem_bw_gbs"] * sockets, ASSUMED,
                    f"{dimms}; catalog '{key}' peak, every channel populated at the rated speed: "
                    f"{entry['sources']['mem_bw_gbs']} x {sockets} socket(s)")
    if stream:
        best = max(stream, key=lambda s: s.gbs)  # on a busy machine one thread may beat all of them
        return Fact(round(best.gbs, 1), MEASURED, f"{dimms}; the faster copy rate measured, {best.how} (an achieved "
                                                  "rate: the peak is higher)")
    channels, mts, why = DEFAULT_CHANNEL
    return Fact(channels * 8 * mts / 1000 * sockets, ASSUMED, f"{dimms}; not measured: {why}, x {sockets} socket(s)")


# ------------------------------------------------------------------ text


def _cpu_text(cpu: Cpu, values: dict[str, Fact]) -> str:
    """'2x AMD EPYC 7451 24-Core Processor (48 cores, AVX2, FMA)'."""
    model = cpu.model.value if cpu.model else "CPU model not read"
    sockets, cores = values["cpu_sockets"].value, values["cpu_cores"].value
    inside = ", ".join(x for x in (f"{cores} cores" if cores else "", _isa(cpu.flags.value) if cpu.flags else "") if x)
    return (f"{sockets}x " if sockets > 1 else "") + model + (f" ({inside})" if inside else "")


def _describe(gpu: str, values: dict[str, Fact]) -> str:
    gpus = values["gpus"].value
    ram = values["host_ram_gib"].value
    return (f"detected by casmoe hardware detect: {f'{gpus}x {gpu}' if gpus else 'no GPU'}"
            + (f", {ram:g} GiB host RAM" if ram else ""))

