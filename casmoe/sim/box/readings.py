"""What a machine's own tools say about it, each value with where it was read.

Parsers of the outputs the detector reads (lscpu, /proc/cpuinfo, /proc/meminfo, dmidecode,
nvidia-smi or NVML, rocm-smi, the NUMA nodes in sysfs), through a `Reader` so that a live
machine and a recorded one parse alike. A reading is a `Fact`: the value and the command, file
or library it came from. What a tool did not say is None here; the detector decides what to
assume instead (`casmoe.sim.box.detect`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from casmoe.sim.box.reader import Reader, command_line

DETECTED, MEASURED, ASSUMED = "detected", "measured", "assumed"
"""How a number was obtained: read from the machine, measured on it, or assumed (and why)."""


@dataclass(frozen=True)
class Fact:
    """A value and how it was obtained; `text` is its `[sources]` string in a profile."""

    value: Any
    how: str
    source: str

    @property
    def text(self) -> str:
        return f"{self.how}: {self.source}"


def detected(value: Any, source: str) -> Fact:
    return Fact(value, DETECTED, source)


@dataclass(frozen=True)
class Gpu:
    """One GPU as its vendor's tool reports it; None where the tool did not say."""

    name: str
    memory_mib: float | None
    pcie_gen: int | None
    pcie_width: int | None
    via: str
    bus: str | None = None


@dataclass(frozen=True)
class Cpu:
    """The host CPU(s); a None field was not read. `mhz` is the rated maximum (lscpu), `clock`
    the clock when read (/proc/cpuinfo: a power-saving core may be far below its maximum)."""

    model: Fact | None
    sockets: Fact | None
    cores: Fact | None
    threads: Fact | None
    mhz: Fact | None
    flags: Fact | None
    l3_bytes: int | None
    clock: Fact | None = None


@dataclass(frozen=True)
class Dimms:
    """The populated memory modules dmidecode lists: their type, the slowest configured speed
    (the controller runs every channel at it), and the channels they occupy."""

    kind: str
    mts: float
    channels: int
    modules: int
    channel_rule: str


# ------------------------------------------------------------------ CPU


def key_values(text: str) -> dict[str, str]:
    """`Key: value` lines (lscpu, /proc/meminfo, one /proc/cpuinfo block) as a dict; the first of
    a repeated key wins and indentation (lscpu's tree layout) is ignored."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(str(text).strip())
    except ValueError:
        return None


def _size_bytes(text: str | None) -> int | None:
    """'300 MiB (1 instance)', '8192K', '32 GB' as bytes."""
    m = re.match(r"\s*([\d.]+)\s*([KMGT]?)(i?B)?", text or "", re.IGNORECASE)
    if not m:
        return None
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def read_cpu(reader: Reader) -> Cpu:
    """The CPU from `lscpu` (and the clock when read from /proc/cpuinfo), else from
    /proc/cpuinfo, else core counts from psutil."""
    lscpu = reader.run("lscpu")
    fields = key_values(lscpu) if lscpu else {}
    cpuinfo = reader.read("/proc/cpuinfo")
    if fields.get("Socket(s)") or fields.get("Model name"):
        cpu = _cpu_from_lscpu(fields)
        return replace(cpu, clock=_cpu_from_cpuinfo(cpuinfo).clock) if cpuinfo else cpu
    if cpuinfo:
        return _cpu_from_cpuinfo(cpuinfo)
    counts = reader.library("psutil")
    if counts and counts.get("cores"):
        return Cpu(None, None, detected(int(counts["cores"]), "psutil.cpu_count(logical=False)"),
                   detected(int(counts["threads"]), "psutil.cpu_count(logical=True)"), None, None, None)
    return Cpu(None, None, None, None, None, None, None)


def _cpu_from_lscpu(f: dict[str, str]) -> Cpu:
    model = f.get("Model name")
    sockets, per_socket = _int(f.get("Socket(s)")), _int(f.get("Core(s) per socket"))
    threads = _int(f.get("CPU(s)"))
    mhz = _float(f.get("CPU max MHz"))
    flags = f.get("Flags")
    return Cpu(
        model=detected(model, f"lscpu 'Model name: {model}'") if model and model != "-" else None,
        sockets=detected(sockets, f"lscpu 'Socket(s): {sockets}'") if sockets else None,
        cores=detected(sockets * per_socket, f"lscpu 'Socket(s)' x 'Core(s) per socket' = {sockets} x {per_socket}")
        if sockets and per_socket else None,
        threads=detected(threads, f"lscpu 'CPU(s): {threads}'") if threads else None,
        mhz=detected(mhz, f"lscpu 'CPU max MHz: {f['CPU max MHz']}'") if mhz else None,
        flags=detected(frozenset(flags.split()), "lscpu 'Flags'") if flags else None,
        l3_bytes=_size_bytes(f.get("L3 cache")),
    )


def _cpu_from_cpuinfo(text: str) -> Cpu:
    blocks = [key_values(b) for b in text.split("\n\n") if b.strip()]
    first = blocks[0]
    model = first.get("model name")
    cores_by_socket = {b.get("physical id", "0"): _int(b.get("cpu cores")) for b in blocks if "processor" in b}
    cores = sum(c for c in cores_by_socket.values() if c) or None
    mhz = _float(first.get("cpu MHz"))
    flags = first.get("flags") or first.get("Features")
    src = "/proc/cpuinfo"
    return Cpu(
        model=detected(model, f"{src} 'model name: {model}'") if model else None,
        sockets=detected(len(cores_by_socket), f"{src}: {len(cores_by_socket)} distinct 'physical id'")
        if "physical id" in first else None,
        cores=detected(cores, f"{src}: 'cpu cores' summed over 'physical id'") if cores else None,
        threads=detected(sum("processor" in b for b in blocks), f"{src}: 'processor' entries"),
        mhz=None,
        flags=detected(frozenset(flags.split()), f"{src} 'flags'") if flags else None,
        l3_bytes=None,
        clock=detected(mhz, f"{src} 'cpu MHz: {first['cpu MHz']}' (the clock when read)") if mhz else None,
    )


# ------------------------------------------------------------------ host memory


def read_ram_gib(reader: Reader) -> Fact | None:
    """Host RAM in GiB: /proc/meminfo's MemTotal (what the kernel manages: installed memory less
    firmware and kernel reservations), else psutil's total."""
    meminfo = reader.read("/proc/meminfo")
    total = key_values(meminfo).get("MemTotal") if meminfo else None
    if total:
        return detected(int(total.split()[0]) / 1024**2, f"/proc/meminfo 'MemTotal: {total}'")
    counts = reader.library("psutil")
    if counts and counts.get("memory_bytes"):
        return detected(counts["memory_bytes"] / 1024**3, "psutil.virtual_memory().total")
    return None


def memory_devices(text: str) -> list[dict[str, str]]:
    """The 'Memory Device' (DMI type 17) sections of dmidecode's output."""
    sections = re.split(r"\n(?=Handle 0x)", text)
    return [key_values(s) for s in sections if "\nMemory Device\n" in s + "\n"]


def read_dimms(reader: Reader) -> Dimms | str:
    """The populated modules from `dmidecode -t memory`, or why they could not be read."""
    text = reader.run("dmidecode")
    if text is None:
        return "dmidecode is not installed"
    modules = [d for d in memory_devices(text) if _size_bytes(d.get("Size")) and "No Module" not in d.get("Size", "")]
    if not modules:
        lines = [ln.strip() for ln in text.splitlines()]
        errors = [ln for ln in lines if "denied" in ln] + [ln for ln in lines if re.search(r"No such file|sorry", ln)]
        if not errors:
            return f"`{command_line('dmidecode')}` lists no populated memory module"
        return (f"`{command_line('dmidecode')}` could not read the SMBIOS tables ('{errors[0]}': it needs root, and "
                "a machine that exposes them)")
    speeds = [_float(re.sub(r"\s*(MT/s|MHz)", "", d.get("Configured Memory Speed") or d.get("Configured Clock Speed")
                             or d.get("Speed", ""))) for d in modules]
    if not all(speeds):
        return f"`{command_line('dmidecode')}` lists {len(modules)} module(s) without a configured speed"
    channels, rule = _channels(modules)
    kinds = sorted({d.get("Type", "unknown") for d in modules})
    return Dimms("/".join(kinds), min(s for s in speeds if s), channels, len(modules), rule)


def _channels(modules: list[dict[str, str]]) -> tuple[int, str]:
    """How many memory channels the modules occupy. Boards name slots by channel: a bank locator
    `P0_Node0_Channel2_Dimm0` or `P0 CHANNEL A`, or a locator whose letter is the channel and
    whose trailing digit the slot in it (`DIMM_A1`, `P1-DIMMA2`, `CPU0_DIMM_C1`,
    `Controller0-DIMM1`). Modules whose slots follow neither, or a grouping that would put more
    than two modules on a channel (no DDR4/DDR5 board does: `A1..A12` on some servers name the
    socket, not the channel), count one channel each."""
    keys = set()
    for d in modules:
        bank, locator = d.get("Bank Locator", ""), d.get("Locator", "")
        if re.search("channel", bank, re.IGNORECASE):
            keys.add(re.sub(r"[\s_-]*dimm[\s_-]*\d+$", "", bank, flags=re.IGNORECASE))
        elif m := re.fullmatch(r"(.*[A-Za-z])\d+", locator.strip()):
            keys.add(m.group(1))
        else:
            return len(modules), "one channel per module (slot names give no channel)"
    if 2 * len(keys) < len(modules):
        return len(modules), "one channel per module (slot names would put more than two on a channel)"
    return len(keys), "distinct channels in the modules' slot names"


# ------------------------------------------------------------------ NUMA


def read_numa(reader: Reader) -> Fact | None:
    """The NUMA nodes: sysfs's node folders (with each node's CPUs and memory where it says), else
    lscpu's 'NUMA node(s)'."""
    base = "/sys/devices/system/node"
    nodes = sorted((n for n in reader.listdir(base) if re.fullmatch(r"node\d+", n)), key=lambda n: int(n[4:]))
    if nodes:
        parts = []
        for n in nodes:
            cpus = _cpu_count(reader.read(f"{base}/{n}/cpulist"), reader.read(f"{base}/{n}/cpumap"))
            mem = key_values(reader.read(f"{base}/{n}/meminfo") or "").get(f"Node {n[4:]} MemTotal")
            parts.append(n + (f" {cpus} CPUs" if cpus else "") + (f" {int(mem.split()[0]) / 1024**2:.1f} GiB" if mem else ""))
        return detected(len(nodes), f"{base}: " + ", ".join(parts))
    lscpu = key_values(reader.run("lscpu") or "")
    count = _int(lscpu.get("NUMA node(s)"))
    return detected(count, f"lscpu 'NUMA node(s): {count}'") if count else None


def _cpu_count(cpulist: str | None, cpumap: str | None) -> int | None:
    """CPUs of a node from its `cpulist` ('0-5,48-53') or its `cpumap` hex mask."""
    if cpulist and cpulist.strip():
        total = 0
        for part in cpulist.strip().split(","):
            lo, _, hi = part.partition("-")
            total += int(hi or lo) - int(lo) + 1
        return total
    if cpumap and cpumap.strip():
        return int(cpumap.strip().replace(",", ""), 16).bit_count()
    return None


# ------------------------------------------------------------------ GPUs


def read_gpus(reader: Reader) -> tuple[list[Gpu], list[str]]:
    """NVIDIA GPUs through NVML, else nvidia-smi; AMD GPUs through rocm-smi (their PCIe link from
    sysfs). Also what each tool said when it found none (its first line), for the sources."""
    notes: list[str] = []
    gpus = _nvml_gpus(reader.library("nvml"))
    if not gpus:
        text = reader.run("nvidia-smi")
        gpus = parse_nvidia_smi(text) if text else []
        if text and not gpus:
            notes.append(f"nvidia-smi: {text.strip().splitlines()[0] if text.strip() else 'no output'}")
    text = reader.run("rocm-smi")
    amd = [_amd_link(reader, g) for g in parse_rocm_smi(text)] if text else []
    if text and not amd:
        notes.append(f"rocm-smi: {text.strip().splitlines()[0] if text.strip() else 'no output'}")
    return gpus + amd, notes


def _nvml_gpus(found: list[dict[str, Any]] | None) -> list[Gpu]:
    return [Gpu(g["name"], g["memory_bytes"] / 2**20, g["pcie_gen"], g["pcie_width"],
                "NVML (nvidia-ml-py: nvmlDeviceGetName, GetMemoryInfo, GetMaxPcieLinkGeneration, GetMaxPcieLinkWidth)")
            for g in found or []]


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=... --format=csv` output, columns found by their header names (so
    an output with other columns besides reads alike); `[N/A]` is None."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if re.match(r"(.*,\s*)?name(\s*,|$)", ln)), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:])), skipinitialspace=True))
    header = [h.split(" [")[0].strip() for h in rows[0]]
    gpus = []
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        d = dict(zip(header, (v.strip() for v in row)))
        gen, width = _number(d, "pcie.link.gen.max"), _number(d, "pcie.link.width.max")
        gpus.append(Gpu(d["name"], _number(d, "memory.total"), int(gen) if gen else None, int(width) if width else None,
                        f"`{command_line('nvidia-smi')}`"))
    return gpus


def _number(row: dict[str, str], key: str) -> float | None:
    """A CSV cell as a number, its unit ('81559 MiB') dropped; None for '[N/A]' or a missing column."""
    return _float(re.sub(r"\s*[A-Za-z/]+$", "", row.get(key, "")))


def parse_rocm_smi(text: str) -> list[Gpu]:
    """`rocm-smi --showproductname --showmeminfo vram --showbus --json`: one GPU per card, named
    by its card series (an older rocm-smi prints 'Arcturus GL-XL [AMD Instinct MI100]': the
    bracketed name), memory from 'VRAM Total Memory (B)'; the PCI bus kept for its link."""
    try:
        cards = json.loads(text[text.index("{"):])
    except ValueError:
        return []
    gpus = []
    for card, raw in sorted(cards.items()):
        if not card.startswith("card") or not isinstance(raw, dict):
            continue
        d = {k.lower(): str(v) for k, v in raw.items()}
        series = d.get("card series", "")
        if m := re.search(r"\[(.+)\]", series):
            series = m.group(1)
        if not series:
            continue
        name = series if series.upper().startswith("AMD") else f"AMD {series}"
        memory = _float(d.get("vram total memory (b)"))
        gpus.append(Gpu(name, memory / 2**20 if memory else None, None, None, f"`{command_line('rocm-smi')}` {card}",
                        d.get("pci bus")))
    return gpus


GT_PER_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
"""PCIe generation by its per-lane transfer rate, as sysfs's `max_link_speed` prints it
('16.0 GT/s PCIe'): PCI-SIG's 2.5, 5, 8, 16, 32 and 64 GT/s for generations 1 to 6."""


def _amd_link(reader: Reader, gpu: Gpu) -> Gpu:
    """An AMD GPU with its PCIe link from sysfs (the GPU's own maximum), where rocm-smi gave
    its PCI bus."""
    if not gpu.bus:
        return gpu
    device = f"/sys/bus/pci/devices/{gpu.bus.lower()}"
    speed = (reader.read(f"{device}/max_link_speed") or "").split(" ")[0]
    width = _int(reader.read(f"{device}/max_link_width"))
    gen = GT_PER_GEN.get(speed)
    if gen is None or width is None:
        return gpu
    return Gpu(gpu.name, gpu.memory_mib, gen, width, f"{gpu.via}; its link from {device}/max_link_speed, max_link_width",
               gpu.bus)
