"""The memory map of a deployment: what each GPU and each host NUMA node holds, and what does not fit.

Per GPU: the runtime's reserve (CUDA context, compute buffers, the engine's own margin), the
dense weights of the layers it runs (attention, routers, shared experts, norms), the embedding
table and LM head where the engine keeps them, the KV cache of its layers at the requested
context and concurrency, and the expert slots. Per host NUMA node: its share of the host experts
and of what else the engine keeps on the host, and the operating system's reserve. Each engine
counts these its own way (`memory.toml`, each rule with its source): llama.cpp keeps the token
embedding table on the CPU and a sliding-window layer's cache at its window plus a ubatch,
SGLang and KTransformers reserve by their own formula, vLLM leaves `1 - gpu_memory_utilization`.

`base` builds the map before any expert is placed (what is left is what experts can use);
`MemoryMap.with_experts` adds the placement and says what does not fit and why. Every size is
bytes; the printed tables use GiB.
"""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Sequence

from casmoe.geometry import split_layers
from casmoe.precision import Precision, parse_precision
from casmoe.presets import ModelPreset
from casmoe.sim.questions.deploy.engines import fact
from casmoe.sim.box.hardware import HOST_RESERVED_GIB

GIB = 1024**3
MIB = 1024**2
RULES = Path(__file__).with_name("memory.toml")


@cache
def rules() -> dict[str, Any]:
    with open(RULES, "rb") as fh:
        return tomllib.load(fh)


@dataclass(frozen=True)
class Box:
    """The machine a plan fits: memory of each GPU (GiB; they may differ), host RAM (GiB),
    NUMA nodes, host threads (0: unknown), and the hardware spec it was read from."""

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
    other: int  # what the engine keeps on the host besides experts (llama.cpp's embedding table)
    experts: int = 0
    expert_count: int = 0

    @property
    def used(self) -> int:
        return self.reserve + self.other + self.experts

    @property
    def free(self) -> int:
        return self.total - self.used

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "total_gib": _gib(self.total), "reserve_gib": _gib(self.reserve),
                "other_gib": _gib(self.other), "experts_gib": _gib(self.experts), "expert_count": self.expert_count,
                "used_gib": _gib(self.used), "free_gib": _gib(self.free)}


@dataclass(frozen=True)
class MemoryMap:
    """Where every byte of a deployment lives; `problems` says what does not fit and why."""

    engine: str
    gpus: tuple[GpuMemory, ...]
    host: tuple[HostNode, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

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
        return replace(self, gpus=gpus, host=host, problems=_problems(gpus, host))

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
                        "dense": "", "embeddings": d["other_gib"], "kv cache": "",
                        "experts": f"{d['experts_gib']:.2f} ({h.expert_count})", "free": d["free_gib"]})
        return out


def _gib(n: int) -> float:
    return round(n / GIB, 3)


def _problems(gpus: Sequence[GpuMemory], host: Sequence[HostNode]) -> tuple[str, ...]:
    out = []
    for g in gpus:
        if g.free < 0:
            fixed = g.reserve + g.dense + g.embeddings + g.kv
            why = ("its runtime reserve, dense weights, embeddings and KV cache alone take "
                   f"{fixed / GIB:.2f} of its {g.total / GIB:.2f} GiB" if fixed > g.total else
                   f"{g.expert_count} experts ({g.experts / GIB:.2f} GiB) do not fit beside the rest "
                   f"({fixed / GIB:.2f} GiB)")
            out.append(f"GPU {g.index}: over by {-g.free / GIB:.2f} GiB: {why}; use a shorter --context, fewer "
                       "--concurrency, a smaller KV cache type or a smaller precision")
    for h in host:
        if h.free < 0:
            out.append(f"host node {h.node}: over by {-h.free / GIB:.2f} GiB: {h.expert_count} host experts "
                       f"({h.experts / GIB:.2f} GiB) and {h.other / GIB:.2f} GiB of other weights beside the "
                       f"{h.reserve / GIB:.2f} GiB kept for the system; they would be read from disk as they are "
                       "used (llama.cpp's mmap pages them in): more RAM or a smaller --host-precision")
    return tuple(out)


# ---------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Precisions:
    """Precision of the GPU-resident experts, of the host experts, of the dense part, and of
    the KV cache (as the engine names its type: f16, q8_0, bfloat16, fp8_e4m3 ...)."""

    gpu: Precision
    host: Precision
    dense: Precision
    kv: str = "f16"

    @classmethod
    def of(cls, preset: ModelPreset, gpu: str | None = None, host: str | None = None, dense: str | None = None,
           kv: str = "f16") -> Precisions:
        g = parse_precision(gpu) if gpu else preset.expert_precision
        h = parse_precision(host) if host else g
        d = parse_precision(dense) if dense else preset.dense_precision
        return cls(g, h, d, kv)

    def describe(self) -> str:
        experts = self.gpu.name if self.gpu == self.host else f"{self.gpu.name} on the GPUs, {self.host.name} on the host"
        return f"experts {experts}; dense {self.dense.name}; KV cache {self.kv}"


KV_BITS = {"f16": 16, "bf16": 16, "f32": 32, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0,
           "iq4_nl": 4.5, "auto": 16, "bfloat16": 16, "float16": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8}
"""Bits per cached value of each KV type an engine takes (llama.cpp's ggml block sizes as in
llama.cpp.toml [[quant_type]]: q8_0 34 bytes / 32 values; `auto` is the model's bf16)."""


def kv_bytes(engine: str, preset: ModelPreset, context: int, concurrency: int, kv: str, ubatch: int) -> int:
    """KV cache of `concurrency` sequences of `context` tokens as the engine sizes it
    (`ModelPreset.kv_bytes`, at the engine's KV type). llama.cpp: a sliding-window block keeps
    GGML_PAD(min(context, window + ubatch), 256) cells (verified.toml, llama_cpp_swa_cache); the
    paged engines keep a window block's window."""
    precision = parse_precision(f"{KV_BITS.get(kv, 16):g}bpw")
    cells = (lambda window: -(-(window + ubatch) // 256) * 256) if engine == "llama.cpp" else None
    return preset.kv_bytes(context, precision, window_cells=cells) * concurrency


def _sglang_reserve(total: int) -> int:
    mib = total / MIB
    chunk = 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else 8192 if mib < 160 * 1024 else 16384
    graph_bs = 8 if mib < 20 * 1024 else 24 if mib < 35 * 1024 else 32 if mib < 60 * 1024 else 256 if mib < 160 * 1024 else 512
    reserve = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + 1 / 8 * 1024
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return int(reserve * MIB)


def sglang_mem_fraction(total: int) -> float:
    """SGLang's own --mem-fraction-static for a GPU of `total` bytes (memory.toml [sglang])."""
    return round((total - _sglang_reserve(total)) / total, 3)


def reserve(engine: str, preset: ModelPreset, total: int, box: Box, ubatch: int) -> tuple[int, str]:
    """The runtime's own bytes on one GPU, and how they were counted."""
    r = rules()
    ctx = int(r["cuda"]["context_gib"] * GIB)
    if engine == "llama.cpp":
        g = preset.geometry
        floats = ubatch * (preset.vocab + 8 * g.hidden + 3 * g.top_k * g.intermediate)
        margin = int(r["llama_cpp"]["margin_mib"] * MIB)
        return ctx + 4 * floats + margin, (f"CUDA context {r['cuda']['context_gib']} GiB + compute buffer of a "
                                           f"{ubatch}-token ubatch ({4 * floats / GIB:.2f} GiB, estimate) + llama.cpp's "
                                           f"{r['llama_cpp']['margin_mib']} MiB --fit margin")
    if engine in ("sglang", "ktransformers"):
        res = _sglang_reserve(total)
        return res, f"SGLang's own reserve ({res / GIB:.2f} GiB: --mem-fraction-static {sglang_mem_fraction(total)})"
    if engine == "vllm":
        util = r["vllm"]["gpu_memory_utilization"]
        res = int(total * (1 - util) + r["vllm"]["activation_gib"] * GIB)
        return res, f"1 - --gpu-memory-utilization {util} plus {r['vllm']['activation_gib']} GiB of activations"
    res = int(max(box.reserved_gib, r["cuda"]["context_gib"]) * GIB)
    return res, f"the profile's reserved_gib ({box.reserved_gib:g} GiB: CUDA context, activations, allocator slack)"


def base(engine: str, preset: ModelPreset, box: Box, precisions: Precisions, context: int, concurrency: int,
         ubatch: int | None = None) -> MemoryMap:
    """The map before any expert is placed: reserve, dense weights, embeddings and KV per GPU
    (layers split in proportion to GPU memory), the host's reserve and other weights."""
    ub = ubatch or rules()["llama_cpp"]["ubatch"]
    g = preset.geometry
    per_gpu_layers = [tuple(r) for r in split_layers(g.layers, box.gpu_gib)]  # llama.cpp's -ts: by memory
    dense_total = preset.sizes(precisions.gpu, precisions.dense)["dense"]
    head = precisions.dense.param_bytes(preset.head_params)
    kv_total = kv_bytes(engine, preset, context, concurrency, precisions.kv, ub)
    gpus, notes = [], []
    for i, (gib, layers) in enumerate(zip(box.gpu_gib, per_gpu_layers)):
        total = int(gib * GIB)
        share = len(layers) / g.layers
        res, how = reserve(engine, preset, total, box, ub)
        last = i == box.gpus - 1
        if engine == "llama.cpp":  # the table stays on the CPU, the head goes with the last layer
            emb = head if last else 0
        elif box.gpus == 1:  # the table and the head (one matrix when tied)
            emb = head * (1 if preset.tie_embeddings else 2)
        else:  # the table with the first layers, the head with the last
            emb = head if i in (0, box.gpus - 1) else 0
        gpus.append(GpuMemory(i, total, res, int(dense_total * share), emb, int(kv_total * share), layers=layers))
        if i == 0:
            notes.append(f"reserve per GPU: {how}")
    host_total = int(box.host_ram_gib * GIB)
    nodes = max(1, box.numa_nodes)
    sys_reserve = int(box.host_reserved_gib * GIB)  # the profile's, as the simulator's RAM budget has it
    other = head if engine == "llama.cpp" else 0  # llama.cpp's token embedding table
    host = tuple(HostNode(n, host_total // nodes, sys_reserve // nodes, other // nodes + (n == 0) * (other % nodes))
                 for n in range(nodes))
    if engine == "llama.cpp":
        text, _ = fact("llama_cpp_input_layer_on_cpu")
        notes.append(f"llama.cpp: {text}")
    notes.append(f"KV cache: {concurrency} x {context} tokens at {precisions.kv} ({kv_total / GIB:.2f} GiB)")
    gpus_t = tuple(gpus)
    return MemoryMap(engine, gpus_t, host, _problems(gpus_t, host), tuple(notes))

