"""The memory map of a deployment: what each GPU and each host NUMA node holds, and what does not fit.

Every size comes from the functions the simulator's own fit check uses (`Machine.gpu_resident`,
`Machine.kv_bytes`, `fits.HostDemand`), for a `Machine` on the engine's stack: the engine's
reserve, where it keeps the token embedding table and how it lays out a sliding-window cache
are data of the engine (casmoe/engines/memory.toml, `casmoe.engine_memory`), read by both. So a
placement this map says fits is one the simulator runs without overcommit.

Per GPU: the engine's reserve, the dense weights of the layers it runs (attention, routers,
shared experts, norms; the dense-only blocks on the first), the embedding table and LM head
where the engine keeps them, the KV cache of its layers at the requested context and
concurrency, and the expert slots. Per host NUMA node: its share of the host experts and of what
else the engine keeps on the host (llama.cpp's embedding table; on a box without a GPU, the
whole model and its KV cache), and the operating system's reserve.

`base` builds the map before any expert is placed (what is left is what experts can use);
`MemoryMap.with_experts` adds the placement and says what does not fit and why. Every size is
bytes; the printed tables use GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from casmoe import engine_memory
from casmoe.engine_memory import GIB, MIB, sglang_mem_fraction, sglang_reserve  # noqa: F401 (re-exported)
from casmoe.geometry import split_layers
from casmoe.precision import Precision, parse_precision
from casmoe.presets import ModelPreset
from casmoe.sim.box.hardware import HOST_RESERVED_GIB
from casmoe.sim.cost.machine import Machine
from casmoe.sim.run.fits import HostDemand


@dataclass(frozen=True)
class Box:
    """The machine a plan fits: memory of each GPU (GiB; they may differ; none on a box without
    a GPU), host RAM (GiB), NUMA nodes, host threads (0: unknown), and the hardware spec it was
    read from."""

    name: str
    gpu_gib: tuple[float, ...]
    host_ram_gib: float
    numa_nodes: int = 1
    threads: int = 0
    hardware: str = ""
    reserved_gib: float = 0.0  # the profile's own per-GPU reserve (casmoe's backend uses it)
    host_reserved_gib: float = HOST_RESERVED_GIB  # host RAM kept for the OS and the engine: the profile's

    @property
    def gpus(self) -> int:
        return len(self.gpu_gib)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's share, in bytes."""

    index: int
    total: int
    reserve: int
    dense: int
    embeddings: int
    kv: int
    experts: int = 0
    expert_count: int = 0
    layers: tuple[int, ...] = ()  # MoE layers whose attention runs here

    @property
    def used(self) -> int:
        return self.reserve + self.dense + self.embeddings + self.kv + self.experts

    @property
    def free(self) -> int:
        return self.total - self.used

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.index, "total_gib": _gib(self.total), "reserve_gib": _gib(self.reserve),
                "dense_gib": _gib(self.dense), "embeddings_gib": _gib(self.embeddings), "kv_gib": _gib(self.kv),
                "experts_gib": _gib(self.experts), "expert_count": self.expert_count, "used_gib": _gib(self.used),
                "free_gib": _gib(self.free), "moe_layers": [self.layers[0], self.layers[-1]] if self.layers else []}


@dataclass(frozen=True)
class HostNode:
    """One NUMA node's share of host RAM, in bytes."""

    node: int
    total: int
    reserve: int
    dense: int = 0  # a box without a GPU: the dense part of every block
    embeddings: int = 0  # llama.cpp's token table; without a GPU, the table and the head
    kv: int = 0  # a box without a GPU: the KV cache
    experts: int = 0
    expert_count: int = 0

    @property
    def other(self) -> int:
        """What the engine keeps on the host besides experts."""
        return self.dense + self.embeddings + self.kv

    @property
    def used(self) -> int:
        return self.reserve + self.other + self.experts

    @property
    def free(self) -> int:
        return self.total - self.used

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "total_gib": _gib(self.total), "reserve_gib": _gib(self.reserve),
                "dense_gib": _gib(self.dense), "embeddings_gib": _gib(self.embeddings), "kv_gib": _gib(self.kv),
                "other_gib": _gib(self.other), "experts_gib": _gib(self.experts), "expert_count": self.expert_count,
                "used_gib": _gib(self.used), "free_gib": _gib(self.free)}


@dataclass(frozen=True)
class MemoryMap:
    """Where every byte of a deployment lives; `problems` says what does not fit and why.
    `gpu_expert_bytes` and `host_expert_bytes` are one expert's bytes per MoE layer where it sits."""

    engine: str
    gpus: tuple[GpuMemory, ...]
    host: tuple[HostNode, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    gpu_expert_bytes: tuple[int, ...] = field(default=(), compare=False)
    host_expert_bytes: tuple[int, ...] = field(default=(), compare=False)
    mmap: bool = False  # host weights beyond RAM are read from the drive as used (llama.cpp), not a failure

    @property
    def fits(self) -> bool:
        return not self.problems

    def expert_room(self) -> list[int]:
        """Bytes each GPU has left for expert slots (0 where the rest already overflows)."""
        return [max(0, g.free) for g in self.gpus]

    def with_experts(self, gpu_bytes: Sequence[int], gpu_counts: Sequence[int], host_bytes: int,
                     host_count: int) -> MemoryMap:
        """This map with `gpu_bytes[i]` of experts on GPU i and `host_bytes` on the host, spread
        evenly over its NUMA nodes (one thread pool per node holds its share); checked."""
        gpus = tuple(replace(g, experts=int(b), expert_count=int(c)) for g, b, c in zip(self.gpus, gpu_bytes, gpu_counts))
        n = len(self.host)
        host = tuple(replace(h, experts=int(host_bytes) // n + (i < int(host_bytes) % n),
                             expert_count=host_count // n + (i < host_count % n)) for i, h in enumerate(self.host))
        return replace(self, gpus=gpus, host=host, problems=_problems(gpus, host, self.mmap),
                       notes=tuple(n for n in self.notes if not n.startswith(PAGED)) + _paged(host, self.mmap))

    def totals(self) -> dict[str, float]:
        return {"gpu_used_gib": _gib(sum(g.used for g in self.gpus)), "gpu_total_gib": _gib(sum(g.total for g in self.gpus)),
                "host_used_gib": _gib(sum(h.used for h in self.host)), "host_total_gib": _gib(sum(h.total for h in self.host))}

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "fits": self.fits, "problems": list(self.problems), "notes": list(self.notes),
                "gpus": [g.to_dict() for g in self.gpus], "host": [h.to_dict() for h in self.host], **self.totals()}

    def rows(self) -> list[dict[str, Any]]:
        """One row per GPU and per host node, for a table."""
        out = []
        for g in self.gpus:
            d = g.to_dict()
            out.append({"where": f"GPU {g.index}", "total": d["total_gib"], "reserve": d["reserve_gib"],
                        "dense": d["dense_gib"], "embeddings": d["embeddings_gib"], "kv cache": d["kv_gib"],
                        "experts": f"{d['experts_gib']:.2f} ({g.expert_count})", "free": d["free_gib"]})
        for h in self.host:
            d = h.to_dict()
            out.append({"where": f"host node {h.node}", "total": d["total_gib"], "reserve": d["reserve_gib"],
                        "dense": d["dense_gib"] if h.dense else "", "embeddings": d["embeddings_gib"],
                        "kv cache": d["kv_gib"] if h.kv else "",
                        "experts": f"{d['experts_gib']:.2f} ({h.expert_count})", "free": d["free_gib"]})
        return out


def rules_engine(engine: str) -> dict[str, Any]:
    """An engine's memory habits as data (casmoe/engines/memory.toml)."""
    return engine_memory.rules()["engine"][engine]


def rules_llama() -> dict[str, Any]:
    return rules_engine("llama.cpp")


def _gib(n: int) -> float:
    return round(n / GIB, 3)


PAGED = "host RAM: over by"


def _paged(host: Sequence[HostNode], mmap: bool) -> tuple[str, ...]:
    """What an engine that memory-maps the model reads from the drive (a note: it runs, slowly)."""
    over = sum(-h.free for h in host if h.free < 0)
    if not mmap or over <= 0:
        return ()
    return (f"{PAGED} {over / GIB:.2f} GiB: the engine memory-maps the model, so that much of the host's experts is "
            "read from the drive as it is used (priced with the drive's reads: a RAM tier over the storage)",)


def _problems(gpus: Sequence[GpuMemory], host: Sequence[HostNode], mmap: bool = False) -> tuple[str, ...]:
    out = []
    for g in gpus:
        if g.free < 0:
            fixed = g.reserve + g.dense + g.embeddings + g.kv
            why = ("its runtime reserve, dense weights, embeddings and KV cache alone take "
                   f"{fixed / GIB:.2f} of its {g.total / GIB:.2f} GiB" if fixed > g.total else
                   f"{g.expert_count} experts ({g.experts / GIB:.2f} GiB) do not fit beside the rest "
                   f"({fixed / GIB:.2f} GiB)")
            out.append(f"GPU {g.index}: over by {-g.free / GIB:.2f} GiB: {why}; use a shorter --context, fewer "
                       "--concurrency or a smaller precision")
    for h in host:
        if h.free < 0 and not (mmap and h.reserve + h.other <= h.total):
            out.append(f"host node {h.node}: over by {-h.free / GIB:.2f} GiB: {h.expert_count} host experts "
                       f"({h.experts / GIB:.2f} GiB) and {h.other / GIB:.2f} GiB of other weights beside the "
                       f"{h.reserve / GIB:.2f} GiB kept for the system; they would be read from disk as they are "
                       "used (llama.cpp's mmap pages them in): more RAM or a smaller precision")
    return tuple(out)


# ---------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Precisions:
    """Precision of the GPU-resident experts, of the host experts, and of the dense part."""

    gpu: Precision
    host: Precision
    dense: Precision

    @classmethod
    def of(cls, preset: ModelPreset, gpu: str | Precision | None = None, host: str | Precision | None = None) -> Precisions:
        g = _precision(gpu) or preset.expert_precision or parse_precision("bf16")
        h = _precision(host) or g
        d = g.dense if g.is_file_type and g.dense is not None else preset.dense_precision or parse_precision("bf16")
        return cls(g, h, d)

    def describe(self) -> str:
        experts = self.gpu.name if self.gpu == self.host else f"{self.gpu.name} on the GPUs, {self.host.name} on the host"
        return f"experts {experts}; dense {self.dense.name}"


def _precision(value: str | Precision | None) -> Precision | None:
    if value is None or isinstance(value, Precision):
        return value
    return parse_precision(value)


def expert_sizes(machine: Machine) -> tuple[list[int], list[int]]:
    """Bytes of one expert per MoE layer on the GPUs and on the host: the file's (`weights`), else
    the preset's at the machine's precisions (`Machine.host_expert_bytes`)."""
    if machine.weights is not None:
        gpu = list(machine.weights.expert)
    else:
        gpu = machine.preset.expert_bytes_per_layer(machine.quant)
    return gpu, machine.host_expert_bytes(gpu)


def base(machine: Machine, box: Box, context: int, concurrency: int) -> MemoryMap:
    """The map before any expert is placed: per GPU of `box` (the layers split in proportion to
    GPU memory, as llama.cpp's -ts) what `machine` puts there besides experts, its KV cache; the
    host's reserve and what the engine keeps there. `machine` is the model at its precisions on
    this box under the engine's stack, with one device per GPU."""
    preset = machine.preset
    g = preset.geometry
    ranges = [tuple(r) for r in split_layers(g.layers, box.gpu_gib)] if box.gpus else []
    kv = machine.kv_bytes(context, concurrency, ranges or [range(g.layers)])
    gpus, notes = [], []
    for i, (gib, layers) in enumerate(zip(box.gpu_gib, ranges)):
        total = int(gib * GIB)
        res = machine.gpu_resident(i, layers, total)
        gpus.append(GpuMemory(i, total, int(res.reserve), int(res.dense), int(res.embeddings), int(kv[i]),
                              layers=layers))
        if i == 0:
            notes.append(f"reserve per GPU: {res.how}")
    gpu_b, host_b = expert_sizes(machine)
    other = int(HostDemand.of(machine, gpu_b, 0, float(sum(kv))).other)  # the simulator's host RAM demand
    if box.gpus:
        parts = (0, other, 0)  # what the engine keeps there: llama.cpp's token table
    else:  # the whole model but its experts, and the KV cache
        tables = int(machine.table_bytes() + (0 if preset.tie_embeddings else machine.head_bytes()))
        parts = (other - tables - int(sum(kv)), tables, int(sum(kv)))
    host_total = int(box.host_ram_gib * GIB)
    nodes = max(1, box.numa_nodes)
    sys_reserve = int(box.host_reserved_gib * GIB)  # the profile's, as the simulator's RAM budget has it
    host = tuple(HostNode(n, host_total // nodes, sys_reserve // nodes,
                          *(p // nodes + (n == 0) * (p % nodes) for p in parts)) for n in range(nodes))
    if machine.memory.table_on_host and box.gpus:
        notes.append(f"{machine.memory.engine}: the token embedding table stays in host RAM "
                     "(src/llama-model.cpp:3062-3064 at b8914: 'there is very little benefit to offloading the input "
                     "layer, so always keep it on the CPU')")
    if not box.gpus:
        notes.append("no GPU: host RAM holds the whole model and its KV cache")
    notes.append(f"KV cache: {concurrency} x {context} tokens ({sum(kv) / GIB:.2f} GiB)")
    gpus_t = tuple(gpus)
    mmap = machine.memory.mmap
    return MemoryMap(machine.memory.engine or "profile", gpus_t, host, _problems(gpus_t, host, mmap),
                     tuple(notes) + _paged(host, mmap), tuple(gpu_b), tuple(host_b), mmap)
