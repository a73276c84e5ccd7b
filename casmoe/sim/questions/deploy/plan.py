"""`casmoe plan`: from a model, a box, an engine, a context and a concurrency to the engine's own
configuration, its memory map and its expected speed.

For each engine asked for, the plan builds the configurations that engine can express
(`candidates`): llama.cpp's whole layers (routing-aware `-ot`, its own `--n-cpu-moe`, with a
smaller KV cache type), KTransformers' per-expert GPU mask from the routing, vLLM's and
SGLang's byte-budget offload, casmoe's own placement and cache. Each one is filled to the
memory map of the box (`memory.base`, `placement.place`) and, where the simulator can price
what the engine does, becomes one `RunSpec` through `Grid.of(...).specs()`; all of them run
through `casmoe.sim.run.runner.run_all` in one batch (content-keyed points under `out/points`, so a
repeated plan is free; local processes or `--ray`). The best that fits (fastest decode at the
requested context) is the plan; the others are its runners-up, each with its own numbers.

Speeds are the simulator's, at the routing's request lengths, on the trace's held-out requests
(what the placement was fitted on never scores it), with what it does not model said beside
them: decode at the full context adds the attention's KV read in closed form; SGLang's
whole-module copies are a closed form; llama.cpp's op offload of prefill is not modelled. The
uncertainty is the 80% interval of the error model `casmoe validate published` fitted for the
run's configuration (`casmoe.sim.trust.uncertainty`); a stack nothing validated says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from casmoe.errors import CasmoeError
from casmoe.geometry import Quant
from casmoe.precision import Precision
from casmoe.presets import ModelPreset, get_preset
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy.placement import (Placement, first_layers, place, routed_order, train_shares, write_casmoe_profile,
                                         write_kt_order)
from casmoe.sim.questions.deploy.routing import Routing, resolve
from casmoe.sim.box.hardware import GIB, HardwareProfile, load_profile

STACKS = {"llama.cpp": "llama.cpp", "ktransformers": "ktransformers", "vllm": "vllm", "sglang": "ideal",
          "casmoe": "ideal"}
"""The `stack` run option each engine is simulated with (casmoe/sim/cost/stacks/): SGLang and casmoe's own
backend have no published row to fit one on, so they run on the ideal stack, an upper bound
their speeds say is not validated."""
NOT_VALIDATED = "uncertainty: not yet validated for this stack"
SYSTEMS = {"llama.cpp": ("llama.cpp", "Ollama"), "ktransformers": ("KTransformers",), "vllm": ("vLLM",),
           "sglang": ("SGLang",), "casmoe": ()}
"""Names of each engine in casmoe/sim/trust/published/measurements.toml."""


class PlanError(CasmoeError, ValueError):
    """A plan that cannot be made as asked (an unknown engine, a box without RAM, ...)."""


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks: the model (a preset name), the box (a hardware spec: a shipped name,
    a TOML file, a variant), the engines, the context and concurrency to serve, optionally a
    routing trace, precisions (experts on the GPUs, on the host, dense part), per-GPU memory
    when the GPUs differ, host threads and NUMA nodes when the profile does not say."""

    model: str
    hardware: str = "rtx4090x4"
    engines: tuple[str, ...] = eng.ENGINES
    context: int = 8192
    concurrency: int = 1
    trace: str | None = None
    gpu_precision: str | None = None
    host_precision: str | None = None
    dense_precision: str | None = None
    gpu_memory: tuple[float, ...] = ()
    threads: int = 0
    numa_nodes: int = 0
    requests: int = 16
    weights: str = ""
    compare: bool = True

    def check(self) -> None:
        unknown = [e for e in self.engines if e not in eng.ENGINES]
        if unknown:
            raise PlanError(f"unknown engine {unknown[0]!r}; one of {', '.join(eng.ENGINES)}")
        if not self.engines:
            raise PlanError("no engine to plan for")
        if self.context < 1 or self.concurrency < 1:
            raise PlanError(f"--context and --concurrency must be >= 1 (got {self.context}, {self.concurrency})")
        if any(not (m > 0 and math.isfinite(m)) for m in self.gpu_memory):
            raise PlanError(f"--gpu-memory takes GiB > 0 per GPU (got {list(self.gpu_memory)})")


@dataclass(frozen=True)
class Speed:
    """Expected tokens/s and how it was obtained."""

    decode: float | None
    prefill: float | None = None
    decode_at_context: float | None = None
    band: tuple[float, float] | None = None  # decode tokens/s range from the validation table
    uncertainty: str = NOT_VALIDATED
    how: str = ""
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"decode_tok_s": _r(self.decode), "prefill_tok_s": _r(self.prefill),
                "decode_at_context_tok_s": _r(self.decode_at_context),
                "decode_band_tok_s": None if self.band is None else [_r(b) for b in self.band],
                "uncertainty": self.uncertainty, "how": self.how, "evidence": self.evidence}


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


@dataclass
class Candidate:
    """One configuration of one engine: its placement and memory map, the command(s) that run
    it, the files it needs, and (once simulated) its speed."""

    engine: str
    label: str
    placement: Placement
    command: eng.Command
    prepare: tuple[eng.Command, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # file name -> what it holds
    notes: list[str] = field(default_factory=list)
    sim: dict[str, Any] | None = None  # run options of its simulation (None: closed form)
    closed_form: float | None = None  # decode tokens/s when not simulated
    speed: Speed | None = None
    key: str = ""

    @property
    def fits(self) -> bool:
        return self.placement.memory.fits

    def to_dict(self) -> dict[str, Any]:
        pl = self.placement
        layers = 1 + max((g.layers[-1] for g in pl.memory.gpus if g.layers), default=-1)
        return {"engine": self.engine, "label": self.label, "fits": self.fits, "rule": pl.rule, "unit": pl.unit,
                "gpu_experts": pl.count, "gpu_layers": pl.gpu_layers(), "experts_per_layer": pl.experts_per_layer,
                "gpu_experts_by_layer": pl.by_layer(layers),
                "command": self.command.text(), "argv": self.command.argv(),
                "prepare": [c.text() for c in self.prepare], "files": self.files, "notes": self.notes,
                "memory": pl.memory.to_dict(), "speed": None if self.speed is None else self.speed.to_dict(),
                "simulated_policy": None if self.sim is None else self.sim.get("policy"), "key": self.key}

    def row(self) -> dict[str, Any]:
        """A flat record (candidates.csv, the printed table)."""
        s = self.speed or Speed(None)
        t = self.placement.memory.totals()
        return {"engine": self.engine, "configuration": self.label, "fits": self.fits,
                "gpu_experts": self.placement.count, "gpu_gib": t["gpu_used_gib"], "host_gib": t["host_used_gib"],
                "decode_tok_s": _r(s.decode), "prefill_tok_s": _r(s.prefill),
                "decode_at_context_tok_s": _r(s.decode_at_context),
                "band": "" if s.band is None else f"{s.band[0]:.3g}-{s.band[1]:.3g}", "how": s.how, "key": self.key}


@dataclass
class EnginePlan:
    engine: str
    best: Candidate | None
    others: list[Candidate]
    version: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "flags_read_at": self.version, "notes": self.notes,
                "best": None if self.best is None else self.best.to_dict(),
                "runners_up": [c.to_dict() for c in self.others]}


@dataclass(frozen=True)
class Comparison:
    """Routing-aware placements against llama.cpp's first-N rule at equal memory, on requests
    the placement saw (train) and on ones it never saw (held-out)."""

    gpu_layers: int
    gpu_experts: int
    rows: tuple[dict[str, Any], ...]
    command: str

    def gain(self, policy: str, split: str) -> float | None:
        base = next((r for r in self.rows if r["placement"] == "n-cpu-moe" and r["split"] == split), None)
        mine = next((r for r in self.rows if r["placement"] == policy and r["split"] == split), None)
        if not base or not mine or not base["decode_tok_s"] or mine["decode_tok_s"] is None:
            return None
        return mine["decode_tok_s"] / base["decode_tok_s"] - 1

    def to_dict(self) -> dict[str, Any]:
        gains = {f"{p} vs n-cpu-moe, {s}": _r(self.gain(p, s)) for p in ("routed layers", "routed experts")
                 for s in ("heldout", "train")}
        return {"gpu_layers": self.gpu_layers, "gpu_experts": self.gpu_experts, "rows": list(self.rows),
                "gains": gains, "command": self.command}


@dataclass
class Plan:
    request: PlanRequest
    preset: ModelPreset
    box: mem.Box
    precisions: mem.Precisions
    routing: Routing
    engines: list[EnginePlan]
    comparison: Comparison | None = None
    published: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    simulated: int = 0

    def candidates(self) -> list[Candidate]:
        return [c for e in self.engines for c in ([e.best] if e.best else []) + e.others]

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {"model": self.preset.name, "hardware": r.hardware, "box": {
                    "gpus_gib": list(self.box.gpu_gib), "host_ram_gib": self.box.host_ram_gib,
                    "numa_nodes": self.box.numa_nodes, "threads": self.box.threads},
                "context": r.context, "concurrency": r.concurrency, "precisions": self.precisions.describe(),
                "routing": self.routing.how, "trace": str(self.routing.path), "notes": self.notes,
                "engines": [e.to_dict() for e in self.engines],
                "comparison": None if self.comparison is None else self.comparison.to_dict(),
                "published": self.published, "simulated_now": self.simulated}


# ------------------------------------------------------------------------------------------- the box
def box_of(profile: HardwareProfile, spec: str, req: PlanRequest) -> mem.Box:
    """The box a plan fits, from the profile and the user's overrides."""
    gpus = req.gpu_memory or (profile.memory_gib,) * profile.gpus
    if req.gpu_memory and len(req.gpu_memory) != profile.gpus:
        raise PlanError(f"--gpu-memory gives {len(req.gpu_memory)} GPUs, the profile {profile.name!r} has "
                        f"{profile.gpus}; give one per GPU (or --gpus N)")
    if profile.host_ram_gib <= 0:
        raise PlanError(f"profile {profile.name!r} does not say how much host RAM it has (host_ram_gib); add it to "
                        "the profile or give --host-ram GiB")
    threads = req.threads or int(getattr(profile, "host_threads", 0) or getattr(profile, "cpu_cores", 0) or 0) \
        or _cores(profile.cpu)
    nodes = req.numa_nodes or int(getattr(profile, "numa_nodes", 0) or getattr(profile, "sockets", 0) or 0) \
        or _sockets(profile.cpu)
    return mem.Box(profile.name, tuple(float(g) for g in gpus), profile.host_ram_gib, nodes, threads, spec,
                   profile.reserved_gib, profile.host_reserved_gib)


def _sockets(cpu: str) -> int:
    m = re.match(r"\s*(\d+)\s*x\s", cpu)
    return int(m.group(1)) if m else 1


def _cores(cpu: str) -> int:
    """Physical cores from a profile's `cpu` text ('2x Intel Xeon Gold 6330 (28 cores, ...)');
    0 when it does not say."""
    m = re.search(r"(\d+)\s*(?:physical\s+)?cores", cpu)
    return int(m.group(1)) * _sockets(cpu) if m else 0


# ---------------------------------------------------------------------------------------- helpers
def hf_id(preset: ModelPreset) -> str:
    """The Hugging Face id the preset's source names ('Qwen/Qwen3-30B-A3B config.json ...')."""
    m = re.search(r"\b([A-Za-z0-9][\w.-]*/[\w.-]+)\s+config\.json", preset.source)
    return m.group(1) if m else preset.name


LLAMA_FTYPE = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q4_k_m": "Q4_K_M",
               "q4_k_s": "Q4_K_S", "q4_0": "Q4_0", "q3_k_l": "Q3_K_L", "q3_k_m": "Q3_K_M", "q3_k_s": "Q3_K_S",
               "q2_k": "Q2_K", "mxfp4": "MXFP4_MOE", "bf16": "BF16", "fp16": "F16"}
"""llama-quantize's type names (QUANT_OPTIONS, tools/quantize/quantize.cpp at b8914) for casmoe's precisions."""
GGML_TYPE = {"q8_0": "q8_0", "q6_k": "q6_k", "q5_k_m": "q5_k", "q5_k_s": "q5_k", "q4_k_m": "q4_k", "q4_k_s": "q4_k",
             "q4_0": "q4_0", "q3_k_l": "q3_k", "q3_k_m": "q3_k", "q3_k_s": "q3_k", "q2_k": "q2_k", "mxfp4": "mxfp4",
             "bf16": "bf16", "fp16": "f16"}
"""The one ggml type `--tensor-type` gives a tensor for each precision (a mix's base type)."""


def kt_method(host: Precision, cpu: str) -> str:
    """kt-kernel's CPU method for the host experts' precision (verified.toml, kt_method_by_cpu)."""
    name = host.name
    amx = "amx" in cpu.lower() or "sapphire" in cpu.lower() or "emerald" in cpu.lower() or "6454s" in cpu.lower()
    if name in GGML_TYPE and name not in ("bf16", "fp16", "mxfp4"):
        return "LLAMAFILE"
    return {"bf16": "BF16", "fp16": "BF16", "fp8": "FP8", "mxfp4": "MXFP4", "gptq4": "GPTQ_INT4",
            "int8": "AMXINT8" if amx else "MOE_INT8"}.get(name, "AMXINT4" if amx else "RAWINT4")


def sim_quant(precision: Precision, preset: ModelPreset, trace_bytes: Sequence[int]) -> tuple[str, str | None]:
    """The simulator's `quant` for experts at `precision`: the trace's measured bytes when they
    are this precision's, else the precision itself by name (`--quant` takes every precision of
    casmoe/precisions.toml, llama.cpp's mixes with their per-layer types included), else the
    nearest by bits (and a note saying so). The nearest once stood in for every name but bf16,
    fp16, int8 and int4: q4_k_m's 4.5-6.6 bits were priced as int4's 4."""
    from casmoe.options import OptionError, parse_quant

    want = preset.expert_bytes_per_layer(precision)
    if trace_bytes and list(trace_bytes) == want:
        return "trace", None
    try:
        known = parse_quant(precision.name)
    except OptionError:
        known = None
    if known is not None and preset.expert_bytes_per_layer(known) == want:
        return precision.name, None
    for q in Quant:
        if q.value == precision.name:
            return q.value, None
    nearest = min(Quant, key=lambda q: (abs(q.bits - precision.leaf.bits), q.value))
    return nearest.value, (f"the simulator prices experts at {nearest.value} ({nearest.bits} bits) for "
                           f"{precision.name} ({precision.leaf.bits:g} bits): its --quant does not know "
                           f"{precision.name}")


def uncertainty(record: dict[str, Any] | None, decode: float | None) -> tuple[tuple[float, float] | None, str]:
    """The error model's 80% interval for this run (`casmoe.sim.trust.uncertainty`): a band
    around `decode` and its words; none for a closed form or a stack nothing validated."""
    if decode is None or record is None:
        return None, NOT_VALIDATED
    from casmoe.sim.trust.uncertainty import factor, spread

    f = factor(record)
    return (None if f is None else (decode / f, decode * f)), f"uncertainty: {spread(record)}"


# ------------------------------------------------------------------------------------- candidates
@dataclass
class Context:
    """What every engine's candidates are built from."""

    req: PlanRequest
    preset: ModelPreset
    profile: HardwareProfile
    box: mem.Box
    precisions: mem.Precisions
    routing: Routing
    shares: Any
    orders: dict[str, list[int]]
    trace_bytes: tuple[int, ...]
    out: Path
    families: tuple[str, ...] = ()

    @property
    def L(self) -> int:
        return self.preset.geometry.layers

    def sim(self, placement: Placement, hardware: str | None = None, precision: Precision | None = None,
            policy: str | None = None, capacity: str | None = None) -> dict[str, Any]:
        """Run options of a simulation of `placement` (`global_capacity` = its GPU experts)."""
        g = self.preset.geometry
        quant, _ = sim_quant(precision or self.precisions.host, self.preset, self.trace_bytes)
        count = placement.count
        if policy is None:
            policy = placement.policy(self.L, self.req.concurrency)
            if count < g.top_k:
                policy, count = f"n-cpu-moe[n={self.L}]", g.top_k
        values: dict[str, Any] = {"trace": str(self.routing.path), "model": self.preset.name,
                                  "hardware": hardware or self.box.hardware, "quant": quant, "policy": policy,
                                  "batch": self.req.concurrency, "requests": self.req.requests, "split": "heldout",
                                  "devices": 1}
        if capacity is not None:
            values["capacity"] = capacity
        else:
            values["global_capacity"] = str(count)
        return values


def _threads_args(flag: str, ctx: Context) -> list[tuple[str, str | None]]:
    return [(flag, str(ctx.box.threads))] if ctx.box.threads else []


def llama_cpp(ctx: Context) -> list[Candidate]:
    p, box = ctx.preset, ctx.box
    out: list[Candidate] = []
    kvs = ["f16"]
    for kv in ("f16", "q8_0"):
        if kv not in kvs:
            continue
        prec = replace(ctx.precisions, kv=kv)
        base = mem.base("llama.cpp", p, box, prec, ctx.req.context, ctx.req.concurrency)
        routed = place(base, p, prec, ctx.orders["layer"], "layer")
        first = first_layers(base, p, prec)
        kv_gib = sum(g.kv for g in base.gpus) / GIB
        if kv == "f16" and routed.rule != "all" and kv_gib >= 0.25:
            kvs.append("q8_0")
        same = routed.host_layers(ctx.L) == first.host_layers(ctx.L)
        suffix = "" if kv == "f16" else ", q8_0 KV cache"
        if kv != "f16" and out and routed.count <= max(c.placement.count for c in out):
            break  # a smaller KV cache that frees no room for another layer is only a lossier cache
        if routed.rule == "all":
            out.append(_llama_candidate(ctx, f"all on GPU{suffix}", routed, prec))
            break
        if same:
            label = f"--n-cpu-moe {len(first.host_layers(ctx.L))}{suffix}"
            c = _llama_candidate(ctx, label, first, prec)
            c.notes.append("the routing ranks no layer above another at this concurrency (every decode token routes "
                           f"top_k={p.geometry.top_k} experts in every layer), so the routing-aware choice of layers "
                           "is llama.cpp's own")
            out.append(c)
            continue
        out.append(_llama_candidate(ctx, f"routing-aware layers (-ot){suffix}", routed, prec))
        if kv == "f16":
            out.append(_llama_candidate(ctx, f"--n-cpu-moe {len(first.host_layers(ctx.L))} (llama.cpp's rule)", first,
                                        prec))
    return out


def _llama_candidate(ctx: Context, label: str, pl: Placement, prec: mem.Precisions) -> Candidate:
    p, box, req = ctx.preset, ctx.box, ctx.req
    dense = p.dense_layers
    gguf = req.weights or f"{p.name}-{prec.gpu.name if prec.gpu == prec.host else 'plan'}.gguf"
    args: list[tuple[str, str | None]] = [("-m", gguf), ("-ngl", "all")]
    host = pl.host_layers(ctx.L)
    gpu_layers = pl.gpu_layers()
    first_n = host == list(range(len(host)))
    overrides = box.gpus > 1 or (host and not first_n)
    if host and first_n and box.gpus == 1:
        args.append(("--n-cpu-moe", str(len(host))))
    elif overrides:
        pairs: list[tuple[Sequence[int], str]] = []
        if box.gpus > 1:
            pairs += [([dense + layer for layer in gl], f"CUDA{i}") for i, gl in enumerate(gpu_layers)]
        pairs.append(([dense + layer for layer in host], "CPU"))
        args.append(("-ot", eng.overrides_text(pairs)))
    if box.gpus > 1:
        args.append(("-ts", ",".join(f"{g:g}" for g in box.gpu_gib)))
    r = mem.rules()["llama_cpp"]
    args += [("-c", str(req.context * req.concurrency)), ("-np", str(req.concurrency)), ("-b", str(r["batch"])),
             ("-ub", str(r["ubatch"]))]
    notes = []
    if prec.kv != "f16":
        args += [("-ctk", prec.kv), ("-ctv", prec.kv), ("-fa", "on")]
        notes.append(eng.fact("llama_cpp_quantized_v_needs_flash_attention")[0])
    args += _threads_args("-t", ctx)
    if box.numa_nodes > 1 and host:
        args.append(("--numa", "distribute"))
    if host or box.gpus > 1:
        args += [("--fit", "off")]
        notes.append("--fit off: llama.cpp's --fit (on by default) gives up once -ngl, -ts or any tensor override is "
                     "set (common/fit.cpp:344-366 at b8914); the placement above is this plan's")
    if pl.host_layers(ctx.L):
        notes.append("prefill: for ubatches of at least 32 tokens llama.cpp copies the host layers' routed experts to "
                     "the GPU and runs them there (op offload, casmoe/engines/ALGORITHMS.md section 5), so a larger -ub "
                     "amortises those copies over more prompt tokens at the cost of a larger compute buffer (casmoe/sim/"
                     "published/measurements.toml: gpt-oss-120b, RTX 3090, --n-cpu-moe 26: 380 prompt tok/s at -ub 512, "
                     "1680 at -ub 4096); not simulated here")
    if not ctx.box.threads:
        notes.append("-t left to llama.cpp (its default is the physical cores it finds); the profile does not say how "
                     "many the host has")
    prepare: tuple[eng.Command, ...] = ()
    if prec.gpu != prec.host:
        prepare = (_quantize(ctx, pl, prec, gguf),)
        notes.append(f"the GGUF holds the GPU layers' experts at {prec.gpu.name} and the host layers' at "
                     f"{prec.host.name}: made once by the llama-quantize line above (llama.cpp PR #12511, "
                     "--tensor-type); the placement must stay as planned for that file")
    return Candidate("llama.cpp", label, pl, eng.Command(eng.LLAMA_SERVER, tuple(args)), prepare, notes=notes,
                     sim=ctx.sim(pl))


def _quantize(ctx: Context, pl: Placement, prec: mem.Precisions, out_gguf: str) -> eng.Command:
    """llama-quantize: host experts at the file type, GPU layers' experts raised by --tensor-type."""
    dense = ctx.preset.dense_layers
    blocks = [dense + layer for gl in pl.gpu_layers() for layer in gl]
    host_type = LLAMA_FTYPE.get(prec.host.name)
    gpu_type = GGML_TYPE.get(prec.gpu.name)
    if host_type is None or gpu_type is None:
        raise PlanError(f"llama.cpp has no type for {prec.host.name if host_type is None else prec.gpu.name}; "
                        f"give --gpu-precision/--host-precision among {', '.join(sorted(GGML_TYPE))}")
    args: list[tuple[str, str | None]] = []
    if blocks:
        args.append(("--tensor-type", f"{eng.blocks_regex(blocks)}={gpu_type}"))
    args += [("", f"{ctx.preset.name}-bf16.gguf"), ("", out_gguf), ("", host_type)]
    return eng.Command(eng.LLAMA_QUANTIZE, tuple(args))


def ktransformers(ctx: Context) -> list[Candidate]:
    p, box, req = ctx.preset, ctx.box, ctx.req
    out = []
    for kv in ("auto", "fp8_e4m3"):
        prec = replace(ctx.precisions, kv=kv)
        base = mem.base("ktransformers", p, box, prec, req.context, req.concurrency)
        pl = place(base, p, prec, ctx.orders["expert"], "expert")
        L, E = p.geometry.layers, p.geometry.experts
        n = pl.count
        method = kt_method(prec.host, ctx.profile.cpu)
        args: list[tuple[str, str | None]] = [("--model-path", req.weights or hf_id(p)),
                                              ("--kt-weight-path", f"{p.name}-{method.lower()}-cpu-experts"),
                                              ("--kt-method", method)]
        args += _threads_args("--kt-cpuinfer", ctx)
        args.append(("--kt-threadpool-count", str(box.numa_nodes)))
        if n % L == 0:
            args.append(("--kt-num-gpu-experts", str(n // L)))
        else:
            args.append(("--kt-gpu-experts-ratio", repr((n + 0.5) / (L * E))))
        order_file = "kt-expert-order.pt"
        args += [("--kt-expert-placement-strategy", "frequency"), ("--init-expert-location", order_file),
                 ("--context-length", str(req.context)), ("--max-running-requests", str(req.concurrency)),
                 ("--mem-fraction-static", str(mem.sglang_mem_fraction(base.gpus[0].total)))]
        if kv != "auto":
            args.append(("--kv-cache-dtype", kv))
        notes = [f"{n} GPU experts of {L * E}: the {order_file} written beside this plan ranks them as the routing "
                 "does (kt-kernel keeps the largest counts of that file: " + eng.fact("kt_frequency_file")[1] + ")",
                 f"--kt-method {method} for {prec.host.name} host experts; CPU requirements: "
                 + eng.fact("kt_method_by_cpu")[0],
                 "more GPU experts leave less room for CUDA graphs (KTransformers #1232): SGLang's own reserve is kept "
                 "for them here (memory map)"]
        if box.numa_nodes > 1:
            notes.append(f"--kt-threadpool-count {box.numa_nodes}: one thread pool per NUMA node, each holding its "
                         "share of the host experts")
        if not box.threads:
            notes.append("--kt-cpuinfer not set: give --threads (physical cores; kt-kernel/README.md:520-524)")
        label = "GPU expert mask from the routing (frequency)" + ("" if kv == "auto" else ", fp8 KV cache")
        c = Candidate("ktransformers", label, pl, eng.Command(eng.SGLANG, tuple(args), eng.SGLANG + " (ktransformers)"),
                      files={order_file: "KTransformers frequency statistics: this plan's GPU expert order"},
                      notes=notes, sim=ctx.sim(pl))
        if kv != "auto" and pl.count <= out[0].placement.count:
            break  # fp8 KV that frees no room for more experts is only a lossier cache
        out.append(c)
        if pl.rule == "all" or sum(g.kv for g in base.gpus) < 0.25 * GIB:
            break
    return out


def _one_checkpoint_first_layers(ctx: Context, engine: str) -> tuple[mem.Precisions, Any, Placement, list[int]]:
    """vLLM's and SGLang's offload: one checkpoint (every expert at the GPU precision), KV in
    the engine's own dtype, the first layers' weights offloaded. (precisions, memory base,
    placement, host layers)."""
    prec = replace(ctx.precisions, host=ctx.precisions.gpu, kv="auto")
    base = mem.base(engine, ctx.preset, ctx.box, prec, ctx.req.context, ctx.req.concurrency)
    pl = first_layers(base, ctx.preset, prec)
    return prec, base, pl, pl.host_layers(ctx.L)


def vllm(ctx: Context) -> list[Candidate]:
    p, req = ctx.preset, ctx.req
    prec, _, pl, host = _one_checkpoint_first_layers(ctx, "vllm")
    gib = sum(pl.memory.host[i].experts for i in range(len(pl.memory.host))) / GIB
    util = mem.rules()["vllm"]["gpu_memory_utilization"]
    args: list[tuple[str, str | None]] = [("", req.weights or hf_id(p))]
    if host:
        args += [("--cpu-offload-gb", f"{math.ceil(gib * 100) / 100:.2f}"), ("--cpu-offload-params", "experts")]
    args += [("--max-model-len", str(req.context)), ("--max-num-seqs", str(req.concurrency)),
             ("--gpu-memory-utilization", f"{util:g}")]
    notes = [eng.fact("vllm_uva")[0] + f": the first {len(host)} layers' experts are read over PCIe at every forward "
             "pass (no cache, no CPU compute); simulated as those layers' routed experts computed 'on the host' at "
             "the link's rate"] if host else []
    if ctx.precisions.gpu != ctx.precisions.host:
        notes.append("vLLM holds one checkpoint: every expert is at the GPU precision here")
    hardware = _uva_profile(ctx) if host else None
    c = Candidate("vllm", f"--cpu-offload-gb (first {len(host)} layers' experts streamed)" if host else "all on GPU",
                  pl, eng.Command(eng.VLLM, tuple(args)), notes=notes,
                  sim=ctx.sim(pl, hardware=hardware, precision=prec.gpu))
    return [c]


def _uva_profile(ctx: Context) -> str:
    """A profile whose 'host compute' is the GPU reading offloaded weights over the link: what
    vLLM's UVA offload does with an expert of an offloaded layer each time one is routed."""
    hw = ctx.profile
    rate = hw.h2d_pinned_gbs / hw.mem_efficiency  # x mem_efficiency in the roofline = the link's rate
    why = "vLLM UVA offload (casmoe plan): offloaded experts are read by the GPU over the host link at every forward"
    uva = hw.with_values(
        {"cpu_mem_bw_gbs": f"{why}: h2d_pinned_gbs / mem_efficiency, so the roofline's bandwidth is the link's",
         "cpu_tflops": f"{why}: the GPU computes them (dense_tflops)", "cpu_hop_us": f"{why}: no activation hop",
         "cpu_serial": f"{why}: the same GPU stream runs them"},
        name=f"{hw.name}-vllm-uva", cpu_mem_bw_gbs=rate, cpu_tflops=hw.dense_tflops, cpu_hop_us=0.0, cpu_serial=1.0)
    folder = ctx.out / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uva.name}.toml"
    uva.write(path)
    return str(path)


def sglang(ctx: Context) -> list[Candidate]:
    p, req = ctx.preset, ctx.req
    prec, base, pl, host = _one_checkpoint_first_layers(ctx, "sglang")
    offloaded = sum(h.experts for h in pl.memory.host)
    args: list[tuple[str, str | None]] = [("--model-path", req.weights or hf_id(p))]
    if host:
        args.append(("--cpu-offload-gb", str(math.ceil(offloaded / GIB))))
    args += [("--context-length", str(req.context)), ("--max-running-requests", str(req.concurrency)),
             ("--mem-fraction-static", str(mem.sglang_mem_fraction(base.gpus[0].total)))]
    hw = ctx.profile
    g = p.geometry
    active = (sum(p.expert_bytes_per_layer(prec.gpu)) * g.top_k + p.sizes(prec.gpu, prec.dense)["dense"]
              + prec.dense.param_bytes(p.head_params))
    t = active / (hw.mem_bw_gbs * 1e9 * hw.mem_efficiency) + p.blocks * hw.layer_overhead_us * 1e-6
    t += offloaded / (hw.h2d_pinned_gbs * 1e9)
    notes = []
    if host:
        notes.append(eng.fact("sglang_offload")[0] + f": {offloaded / GIB:.1f} GiB cross the link every forward pass "
                     "(decode speed below is a closed form: active weights at the GPU's bandwidth plus that copy; not "
                     "simulated). Its parameters are offloaded first come in module order, embeddings and attention "
                     "included, not only experts; KTransformers is SGLang with CPU experts")
    return [Candidate("sglang", f"--cpu-offload-gb {math.ceil(offloaded / GIB)}" if host else "all on GPU", pl,
                      eng.Command(eng.SGLANG, tuple(args)), notes=notes, closed_form=None if not host else 1 / t,
                      sim=None if host else ctx.sim(pl))]


def casmoe(ctx: Context) -> list[Candidate]:
    p, box, req = ctx.preset, ctx.box, ctx.req
    prec = replace(ctx.precisions, kv="bf16")
    base = mem.base("casmoe", p, box, prec, req.context, req.concurrency)
    pl = place(base, p, prec, ctx.orders["expert"], "expert")
    family = _family(p)
    supported = not ctx.families or family in ctx.families
    model = req.weights or hf_id(p)
    common: list[tuple[str, str | None]] = [("--model", model)]
    tail: list[tuple[str, str | None]] = [("--device", "cuda:0")] + _threads_args("--threads", ctx)
    if req.concurrency > 1:
        tail.append(("--batch", str(req.concurrency)))
    profile_file = "casmoe-profile.npz"
    routed = eng.Command(eng.CASMOE, tuple(common + [("--policy", f"routed-placement[profile={profile_file}]"),
                                                     ("--global-capacity", str(max(pl.count, p.geometry.top_k))),
                                                     ("--miss-mode", "cpu")] + tail), eng.CASMOE)
    notes = [] if supported else [f"casmoe's backend has no adapter for {family} (supported: {', '.join(ctx.families)}): "
                                  "this is the command it would run; today it stops with 'not a supported MoE model'"]
    notes.append("casmoe bench runs the backend on prompts and reports tokens/s; it is a benchmark, not a server")
    out = [Candidate("casmoe", "routing-aware experts on the GPU, the rest computed on the host", pl, routed,
                     files={profile_file: "casmoe profile: this plan's step shares (routed-placement[profile=...])"},
                     notes=list(notes), sim=ctx.sim(pl))]
    slots = pl.count // ctx.L
    if pl.rule != "all" and slots >= p.geometry.top_k:
        lru = eng.Command(eng.CASMOE, tuple(common + [("--policy", "lru"), ("--capacity", str(slots)),
                                                      ("--miss-mode", "load")] + tail), eng.CASMOE)
        out.append(Candidate("casmoe", f"LRU expert cache, {slots} slots per layer (copies misses)", pl, lru,
                             notes=list(notes), sim=ctx.sim(pl, policy="lru", capacity=str(slots),
                                                            precision=prec.gpu)))
    return out


def _family(p: ModelPreset) -> str:
    """The transformers model type of a preset's family (what casmoe's backend adapts)."""
    name = p.name
    for prefix, family in (("qwen3", "qwen3_moe"), ("qwen2", "qwen2_moe"), ("qwen1.5", "qwen2_moe"),
                           ("mixtral", "mixtral"), ("olmoe", "olmoe"), ("deepseek-v2", "deepseek_v2"),
                           ("deepseek-v3", "deepseek_v3"), ("deepseek-r1", "deepseek_v3"), ("gpt-oss", "gpt_oss"),
                           ("glm", "glm4_moe"), ("kimi", "deepseek_v3"), ("dbrx", "dbrx"), ("llama-4", "llama4"),
                           ("phi", "phimoe"), ("switch", "switch_transformers")):
        if name.startswith(prefix):
            return family
    return name


BUILDERS: dict[str, Callable[[Context], list[Candidate]]] = {
    "llama.cpp": llama_cpp, "ktransformers": ktransformers, "vllm": vllm, "sglang": sglang, "casmoe": casmoe}


# ------------------------------------------------------------------------------------------ the plan
def make_plan(req: PlanRequest, out: str | Path, *, jobs: int = 1, ray_address: str | None = None,
              progress: Callable[[int, int], None] | None = None, say: Callable[[str], object] | None = None,
              families: Sequence[str] = ()) -> Plan:
    """Build, simulate and rank every engine's candidates; write the files they name into `out`."""
    from casmoe.sim.run.runner import whole_trace
    from casmoe.sim.run.spec import file_digest

    req.check()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(req.model)
    profile = load_profile(req.hardware)
    box = box_of(profile, req.hardware, req)
    precisions = mem.Precisions.of(preset, req.gpu_precision, req.host_precision, req.dense_precision)
    routing = resolve(preset, req.trace, say)
    whole = whole_trace(str(routing.path), file_digest(routing.path))
    shares = train_shares(whole, req.concurrency)
    orders = {"layer": routed_order(shares, "layer"), "expert": routed_order(shares, "expert")}
    ctx = Context(req, preset, profile, box, precisions, routing, shares, orders, whole.geometry.layer_expert_bytes
                  if whole.geometry.hidden in (0, preset.geometry.hidden) else (), out, tuple(families))
    notes = [f"routing: {routing.how}; placements are fitted on its train split at concurrency {req.concurrency} and "
             "scored on its held-out requests"]
    _, qnote = sim_quant(precisions.host, preset, ctx.trace_bytes)
    if qnote:
        notes.append(qnote)
    if precisions.gpu != precisions.host:
        notes.append(f"GPU experts at {precisions.gpu.name}, host experts at {precisions.host.name}: the memory map "
                     f"counts each; the simulator prices every expert at the host's ({precisions.host.name}) until it "
                     "takes a precision per placement")
    if box.gpus > 1:
        notes.append(f"{box.gpus} GPUs: placed per GPU in the memory map and the commands; simulated as one device "
                     "holding every GPU's experts (the simulator gives a placement one device's layers only)")
    notes.append("speeds: decode at the routing's request lengths; 'at context' adds reading a full "
                 f"{req.context}-token KV cache per token (closed form); prefill at the routing's prompt lengths, "
                 "host experts computed on the host (llama.cpp's op offload of prompt batches >= 32 tokens to the GPU "
                 "and KTransformers' layerwise prefill are not modelled)")
    candidates = {e: BUILDERS[e](ctx) for e in req.engines}
    for cands in candidates.values():
        for c in cands:
            c.command.check()
            for step in c.prepare:
                step.check()
    comparison_specs = _comparison_specs(ctx, candidates.get("llama.cpp")) if req.compare else None
    simulated = _simulate([c for cs in candidates.values() for c in cs], comparison_specs, ctx, out, jobs,
                          ray_address, progress)
    _write_files(ctx, candidates, out)
    engines = []
    for e in req.engines:
        cands = candidates[e]
        ranked = sorted(cands, key=lambda c: (not c.fits, -_rank_speed(c)))
        best = ranked[0] if ranked else None
        version = _version(e)
        engines.append(EnginePlan(e, best, ranked[1:], version))
    plan = Plan(req, preset, box, precisions, routing, engines, notes=notes, simulated=simulated[0])
    plan.comparison = simulated[1]
    plan.published = published(preset.name, req.engines)
    return plan


def _rank_speed(c: Candidate) -> float:
    """What configurations are ranked by: decode tokens/s at the requested context."""
    s = c.speed
    return 0.0 if s is None else float(s.decode_at_context or s.decode or 0.0)


def _version(engine: str) -> str:
    if engine == "casmoe":
        from casmoe.sim.run.spec import casmoe_version

        return f"casmoe {casmoe_version()} (this checkout's `casmoe bench`)"
    if engine == "ktransformers":
        return ("kt-kernel of kvcache-ai/ktransformers v0.7.0 (95009ea6) with the kvcache-ai/sglang fork (sglang-kt, "
                "04653fa8); upstream SGLang flags at d2b3c7fb")
    program = {"llama.cpp": eng.LLAMA_SERVER, "vllm": eng.VLLM,
               "sglang": eng.SGLANG}[engine]
    return " ".join(eng.flag_list(program).version.split())


def _spec_of(values: dict[str, Any]) -> tuple[Any, str | None]:
    """The one RunSpec of these run options (and why the simulator's own memory check refuses
    it, when it does: then it runs overcommitted, said so)."""
    from casmoe.sim.run.grid import Grid

    if "stack" not in values and values.get("_engine"):
        values["stack"] = STACKS[values["_engine"]]
    values = {k: v for k, v in values.items() if not k.startswith("_")}
    runs = Grid.of(values, "casmoe plan").specs(strict=False)
    spec = runs.specs[0]
    if spec in runs.refused:
        why = runs.refused[spec]
        runs = Grid.of({**values, "allow_overcommit": True}, "casmoe plan").specs(strict=False)
        return runs.specs[0], why
    return spec, None


def _comparison_specs(ctx: Context, llama: list[Candidate] | None) -> list[tuple[dict[str, Any], Any]] | None:
    """n-cpu-moe, routed layers and routed experts at the memory of the llama.cpp placement,
    each on the held-out and on the train split."""
    p = ctx.preset
    prec = replace(ctx.precisions, kv="f16")
    base = mem.base("llama.cpp", p, ctx.box, prec, ctx.req.context, ctx.req.concurrency)
    first = first_layers(base, p, prec)
    G = ctx.L - len(first.host_layers(ctx.L))
    if G <= 0 or G >= ctx.L:
        return None
    E = p.geometry.experts
    budget = str(G * E)
    B = ctx.req.concurrency
    batch = f",batch={B}" if B > 1 else ""
    policies = {"n-cpu-moe": f"n-cpu-moe[n={ctx.L - G}]", "routed layers": f"routed-placement[unit=layer{batch}]",
                "routed experts": "routed-placement" + (f"[batch={B}]" if B > 1 else "")}
    out = []
    for name, policy in policies.items():
        for split in ("heldout", "train"):
            values = {**ctx.sim(first, policy=policy), "global_capacity": budget, "split": split,
                      "_engine": "llama.cpp"}
            out.append(({"placement": name, "split": split, "policy": policy, "gpu_layers": G}, values))
    return out


def _simulate(cands: list[Candidate], comparison: list[tuple[dict[str, Any], Any]] | None, ctx: Context, out: Path,
              jobs: int, ray_address: str | None, progress: Callable[[int, int], None] | None
              ) -> tuple[int, Comparison | None]:
    """One `run_all` for every candidate and comparison point."""
    from casmoe.sim.run.runner import run_all

    specs, owners = [], []
    for c in cands:
        if c.sim is None:
            continue
        spec, why = _spec_of({**c.sim, "_engine": c.engine})
        if why:
            # the refusal's remedy ('give --context 53 or --global-capacity 2174, or --allow-overcommit')
            # is simulate's: the plan chose this placement itself and its memory map is the plan's own
            reason = why.split("; give ", 1)[0]
            c.notes.append(f"simulated past the simulator's own memory check ({reason}: the simulator counts the "
                           "profile's reserved_gib where the plan counts each engine's own reserve); the memory "
                           "map above is this plan's")
        specs.append(spec)
        owners.append(("candidate", c, spec))
    for meta, values in comparison or []:
        spec, _ = _spec_of(dict(values))
        specs.append(spec)
        owners.append(("comparison", meta, spec))
    unique = list({s.key: s for s in specs}.values())
    records, computed = run_all(unique, out, jobs=jobs, ray_address=ray_address, progress=progress) if unique \
        else ([], 0)
    by_key = {r["key"]: r for r in records}
    rows = []
    for kind, owner, spec in owners:
        rec = by_key[spec.key]
        if kind == "candidate":
            owner.key = spec.key
            owner.speed = _speed(rec, spec, ctx, owner)
        else:
            rows.append({**owner, "decode_tok_s": _r(rec.get("decode_tokens_per_s")),
                         "requests": rec.get("requests"), "scored": rec.get("scored"), "key": spec.key,
                         **({"skipped": rec["skipped"]} if "skipped" in rec else {})})
    for c in cands:
        if c.sim is None:
            band, text = uncertainty(None, c.closed_form)
            c.speed = Speed(c.closed_form, None, _at_context(c.closed_form, ctx, c.placement), None,
                            text, "closed form (not simulated)")
    comp = None
    if rows:
        G = rows[0]["gpu_layers"]
        quant, _ = sim_quant(ctx.precisions.host, ctx.preset, ctx.trace_bytes)
        cmd = (f"casmoe simulate --trace {ctx.routing.path} --model {ctx.preset.name} --hardware {ctx.box.hardware} "
               f"--quant {quant} --global-capacity {G * ctx.preset.geometry.experts} --split heldout --devices 1 "
               f"--requests {ctx.req.requests} --batch {ctx.req.concurrency} " + " ".join(f"--policy '{p}'" for p in
                                                             dict.fromkeys(r["policy"] for r in rows)))
        comp = Comparison(G, G * ctx.preset.geometry.experts, tuple(rows), cmd)
    return computed, comp


def _speed(rec: dict[str, Any], spec: Any, ctx: Context, c: Candidate) -> Speed:
    if "skipped" in rec:
        return Speed(None, how=f"not simulated: {rec['skipped']}", evidence=f"points/{spec.key}.json")
    decode = rec.get("decode_tokens_per_s")
    prefill = None
    reqs, ttft = rec.get("requests") or 0, rec.get("ttft_p50_s") or 0.0
    if reqs and ttft > 0:
        prefill = rec.get("prefill_tokens", 0) / reqs / ttft
    band, text = uncertainty(rec, decode)
    return Speed(decode, prefill, _at_context(decode, ctx, c.placement), band, text,
                 f"simulated, {rec.get('scored', '')}", f"points/{spec.key}.json")


def _at_context(decode: float | None, ctx: Context, pl: Placement) -> float | None:
    """Decode tokens/s with every sequence's KV cache at the full context (its read added)."""
    if not decode:
        return None
    hw = ctx.profile
    B = ctx.req.concurrency
    kv = sum(g.kv for g in pl.memory.gpus)  # B sequences at the full context
    step = B / decode + kv / (hw.mem_bw_gbs * 1e9 * hw.mem_efficiency)
    return B / step


def _write_files(ctx: Context, candidates: dict[str, list[Candidate]], out: Path) -> None:
    from casmoe.output import write_text

    for engine, cands in candidates.items():
        for i, c in enumerate(cands):
            if "kt-expert-order.pt" in c.files and i == 0:
                write_kt_order(out / "kt-expert-order.pt", ctx.orders["expert"], ctx.preset)
            if "casmoe-profile.npz" in c.files:
                write_casmoe_profile(out / "casmoe-profile.npz", ctx.shares, str(ctx.routing.path))
        for i, c in enumerate(cands):
            lines = ["#!/bin/sh", f"# {engine}: {c.label} (casmoe plan)"]
            if not c.fits:  # the plan's best may not fit (a concurrency too high): the script must say so itself
                lines += [f"# DOES NOT FIT this box: {p}" for p in c.placement.memory.problems] or \
                    ["# DOES NOT FIT this box (casmoe plan's memory map)"]
                lines += ["echo 'casmoe plan: this configuration does not fit the box it was planned for' >&2", "exit 1"]
            lines += [s.text() for s in c.prepare] + [c.command.text()]
            write_text(out / f"{engine}{'' if i == 0 else f'-{i}'}.sh", "\n".join(lines) + "\n")


def published(model: str, engines: Sequence[str]) -> list[dict[str, Any]]:
    """Measurements of this model on these engines in casmoe/sim/trust/published/measurements.toml, with their
    boxes: what real runs reported, beside what the plan predicts."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    folder = Path(__file__).resolve().parents[2] / "trust" / "published"
    try:
        rows = tomllib.loads((folder / "measurements.toml").read_text())["row"]
        boxes = tomllib.loads((folder / "boxes.toml").read_text())
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return []
    systems = {s: e for e in engines for s in SYSTEMS.get(e, ())}
    out = []
    for r in rows:
        if r.get("model") != model or r.get("system") not in systems:
            continue
        b = boxes.get(r.get("box", ""), {})
        out.append({"engine": systems[r["system"]], "id": r["id"], "metric": r.get("metric"), "value": r.get("value"),
                    "setting": r.get("cache", ""), "box": f"{b.get('gpu', '?')} + {b.get('cpu', '?')}, "
                                                         f"{b.get('ram_gib', '?')} GB RAM",
                    "source": r.get("url", r.get("source", ""))})
    return out
