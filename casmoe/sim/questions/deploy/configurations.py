"""Each engine's configurations at one precision: the placements it can express, filled to the
memory map of the box, with the command line that runs them and the steps that make what they load.

- llama.cpp: whole layers' experts on the host (`--n-cpu-moe N`, counted in blocks as llama.cpp
  counts them, dense blocks included; or routing-aware `-ot` layers), or all on the GPU; on a box
  without a GPU, everything on the host (`-ngl 0`);
- KTransformers: a per-expert GPU mask from the routing (`--kt-expert-placement-strategy
  frequency` reading the order this plan writes), the host experts in kt-kernel's method for
  their precision;
- vLLM and SGLang: their byte-budget offload of the first layers' weights;
- casmoe's backend: routing-aware experts on the GPU, and an LRU cache of as many.

Each is simulated on its own engine's stack (`STACKS`); what cannot be simulated is a closed
form, said so. Every path a command names is the user's file (absolute), a file this plan writes,
or one a printed step makes: scripts run from the plan's folder (they `cd` there).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

from casmoe.errors import CasmoeError
from casmoe.precision import Precision
from casmoe.sim.box.hardware import GIB, load_profile
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy import support
from casmoe.sim.questions.deploy.candidate import Candidate, Context
from casmoe.sim.questions.deploy.placement import Placement, first_layers, per_layer_cache, place

STACKS = {"llama.cpp": "llama.cpp", "ktransformers": "ktransformers", "vllm": "vllm", "sglang": "ideal",
          "casmoe": "ideal"}
"""The `stack` run option each engine is simulated with (casmoe/sim/cost/stacks/): SGLang and casmoe's own
backend have no published row to fit one on, so they run on the ideal stack, an upper bound
their speeds say is not validated."""


class ConfigurationError(CasmoeError, ValueError):
    """A precision or file an engine cannot load."""


LLAMA_FTYPE = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q4_k_m": "Q4_K_M",
               "q4_k_s": "Q4_K_S", "q4_0": "Q4_0", "q3_k_l": "Q3_K_L", "q3_k_m": "Q3_K_M", "q3_k_s": "Q3_K_S",
               "q2_k": "Q2_K", "iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL", "iq3_xxs": "IQ3_XXS", "iq2_xxs": "IQ2_XXS",
               "iq2_xs": "IQ2_XS", "iq1_s": "IQ1_S", "mxfp4_moe": "MXFP4_MOE", "mxfp4": "MXFP4_MOE", "bf16": "BF16",
               "fp16": "F16"}
"""llama-quantize's type names (QUANT_OPTIONS, tools/quantize/quantize.cpp at b8914) for casmoe's precisions:
the GGUF file types llama.cpp loads (gpt-oss's MXFP4 experts as MXFP4_MOE)."""
GGML_TYPE = {"q8_0": "q8_0", "q6_k": "q6_k", "q5_k_m": "q5_k", "q5_k_s": "q5_k", "q4_k_m": "q4_k", "q4_k_s": "q4_k",
             "q4_0": "q4_0", "q3_k_l": "q3_k", "q3_k_m": "q3_k", "q3_k_s": "q3_k", "q2_k": "q2_k", "mxfp4": "mxfp4",
             "mxfp4_moe": "mxfp4", "iq4_xs": "iq4_xs", "iq4_nl": "iq4_nl", "bf16": "bf16", "fp16": "f16"}
"""The one ggml type `--tensor-type` gives a tensor for each precision (a mix's base type)."""
HF_LOADS = {"bf16": None, "fp16": None, "fp8": "fp8"}
"""Precisions vLLM and SGLang serve from a Hugging Face checkpoint, and the --quantization that makes
one from a 16-bit checkpoint (fp8: online dynamic FP8, vllm.toml / sglang.toml --quantization)."""


def llama_file_type(precision: Precision) -> str:
    """The GGUF file type of `precision`, or a one-line refusal naming those llama.cpp loads."""
    name = LLAMA_FTYPE.get(precision.name)
    if name is None:
        raise ConfigurationError(f"llama.cpp loads GGUF files, and {precision.name} is no GGUF type (no llama-quantize "
                                 f"type makes it); give one of {', '.join(sorted(LLAMA_FTYPE))}")
    return name


# ------------------------------------------------------------------------------------------ weights
def _hf_dir(ctx: Context) -> str:
    """The local folder of the Hugging Face checkpoint: the user's, or the one the download step makes."""
    if ctx.weights and Path(ctx.weights).exists():
        return str(Path(ctx.weights).resolve())
    return ctx.hf.rpartition("/")[2] if ctx.hf else ""


def _download(ctx: Context) -> tuple[eng.Command, ...]:
    """The download of the checkpoint (nothing when the user gave its folder)."""
    if ctx.weights and Path(ctx.weights).exists():
        return ()
    return (eng.Command("huggingface-cli download", (("", ctx.hf), ("--local-dir", _hf_dir(ctx))), eng.SHELL,
                        creates=_hf_dir(ctx)),)


def gguf_of(ctx: Context, prec: mem.Precisions) -> tuple[str, tuple[eng.Command, ...], list[str]]:
    """The GGUF llama.cpp (and kt-kernel's LLAMAFILE) loads at `prec`, the steps that make it, notes."""
    if ctx.gguf:
        return ctx.gguf, (), []
    if not ctx.hf:
        raise ConfigurationError(f"casmoe knows no Hugging Face checkpoint of {ctx.preset.name} to convert; give --model "
                                 "a GGUF file (or ORG/NAME)")
    host_type, gpu_type = llama_file_type(prec.host), llama_file_type(prec.gpu)
    name = ctx.preset.name
    bf16 = f"{name}-BF16.gguf"
    convert = eng.Command('python "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to your llama.cpp checkout}/convert_hf_to_gguf.py"',
                          (("", _hf_dir(ctx)), ("--outfile", bf16), ("--outtype", "bf16")), eng.SHELL, creates=bf16)
    steps: tuple[eng.Command, ...] = (*_download(ctx), convert)
    notes = ["the steps above make the GGUF from the Hugging Face checkpoint (casmoe/engines/support.toml [[prepare]] "
             "llama.cpp: convert_hf_to_gguf.py, then llama-quantize); a GGUF of the same type you already have works "
             "as well: plan it with --model FILE.gguf"]
    if host_type == gpu_type:
        if host_type == "BF16":
            return bf16, steps, notes
        out = f"{name}-{host_type}.gguf"
        return out, (*steps, eng.Command(eng.LLAMA_QUANTIZE, (("", bf16), ("", out), ("", host_type)), creates=out)), notes
    return f"{name}-{gpu_type}-{host_type}.gguf", steps, notes  # the mixed file: `_quantize` adds its step


# ------------------------------------------------------------------------------------------ llama.cpp
def llama_cpp(ctx: Context, prec: mem.Precisions) -> list[Candidate]:
    """llama.cpp's configurations at `prec` (one GGUF): all on the GPU when it fits, else the
    routing-aware layers (-ot) and llama.cpp's own --n-cpu-moe; on a box without a GPU, the host."""
    if ctx.file is not None and ctx.file.split_experts:
        raise ConfigurationError(f"{ctx.file.path} holds its experts as the old per-expert tensors, which llama.cpp "
                                 "stopped loading at b3990 (#10026: 'missing tensor blk.0.ffn_down_exps.weight'); "
                                 "re-convert it with a current convert_hf_to_gguf.py")
    gguf, steps, notes = gguf_of(ctx, prec)
    machine = ctx.machine(STACKS["llama.cpp"], prec)
    base = mem.base(machine, ctx.box, ctx.req.context, ctx.req.concurrency)
    q = ctx.quality(prec.gpu if prec.gpu == prec.host else prec.host)
    if not ctx.box.gpus:
        host = place(base, ctx.E, [], "layer", rule="host")
        return [_llama_candidate(ctx, "CPU only (-ngl 0)", host, prec, gguf, steps, notes, q)]
    routed = place(base, ctx.E, ctx.orders["layer"], "layer")
    if routed.rule == "all":
        return [_llama_candidate(ctx, "all on GPU", routed, prec, gguf, steps, notes, q)]
    first = first_layers(base, ctx.E)
    n = ctx.preset.dense_layers + len(first.host_layers(ctx.L))
    if routed.host_layers(ctx.L) == first.host_layers(ctx.L):
        c = _llama_candidate(ctx, f"--n-cpu-moe {n}", first, prec, gguf, steps, notes, q)
        c.notes.append("the routing ranks no layer above another here (every decode token routes "
                       f"top_k={ctx.preset.geometry.top_k} experts in every layer), so the routing-aware choice of "
                       "layers is llama.cpp's own")
        return [c]
    return [_llama_candidate(ctx, "routing-aware layers (-ot)", routed, prec, gguf, steps, notes, q),
            _llama_candidate(ctx, f"--n-cpu-moe {n} (llama.cpp's rule)", first, prec, gguf, steps, notes, q)]


def _llama_candidate(ctx: Context, label: str, pl: Placement, prec: mem.Precisions, gguf: str,
                     steps: tuple[eng.Command, ...], file_notes: list[str], q) -> Candidate:
    p, box, req = ctx.preset, ctx.box, ctx.req
    dense = p.dense_layers
    args: list[tuple[str, str | None]] = [("-m", gguf), ("-ngl", "all" if box.gpus else "0")]
    host = pl.host_layers(ctx.L) if box.gpus else list(range(ctx.L))
    notes: list[str] = []
    first_n = host == list(range(len(host)))
    if box.gpus and host and first_n and box.gpus == 1:
        # llama.cpp counts blocks, dense ones included: MoE layer l is block dense + l (common/arg.cpp --n-cpu-moe)
        args.append(("--n-cpu-moe", str(dense + len(host))))
        if dense:
            notes.append(f"--n-cpu-moe {dense + len(host)} counts transformer blocks as llama.cpp does: the first "
                         f"{dense} block{'s' * (dense > 1)} hold{'s' * (dense == 1)} no experts, so the experts of the "
                         f"first {len(host)} MoE layers stay on the host")
    elif box.gpus and (box.gpus > 1 or host):
        pairs: list[tuple[Sequence[int], str]] = []
        if box.gpus > 1:
            pairs += [([dense + layer for layer in gl], f"CUDA{i}") for i, gl in enumerate(pl.gpu_layers())]
        pairs.append(([dense + layer for layer in host], "CPU"))
        args.append(("-ot", eng.overrides_text(pairs)))
    if box.gpus > 1:
        args.append(("-ts", ",".join(f"{g:g}" for g in box.gpu_gib)))
    rules = mem.rules_llama()
    args += [("-c", str(req.context * req.concurrency)), ("-np", str(req.concurrency)), ("-b", str(rules["batch"])),
             ("-ub", str(rules["ubatch"]))]
    if ctx.threads:
        args.append(("-t", str(ctx.threads)))
    else:
        notes.append("-t left to llama.cpp (its default is the physical cores it finds); the profile does not say how "
                     "many the host has")
    if ctx.numa_nodes > 1 and host:
        args.append(("--numa", "distribute"))
        notes.append(f"--numa distribute: {ctx.numa_nodes} NUMA nodes; llama.cpp spreads its threads over them but keeps "
                     "one copy of the weights, so the host experts are priced at one socket's bandwidth (its stack's "
                     "numa_aware = false)")
    if box.gpus and (host or box.gpus > 1):
        args.append(("--fit", "off"))
        notes.append("--fit off: llama.cpp's --fit (on by default) gives up once -ngl, -ts or any tensor override is "
                     "set (common/fit.cpp:344-366 at b8914); the placement above is this plan's")
    if box.gpus and host:
        notes.append("prefill: for ubatches of at least 32 tokens llama.cpp copies the host layers' routed experts to "
                     "the GPU and runs them there (op offload, casmoe/engines/ALGORITHMS.md section 5); not simulated "
                     "here: the prefill figure computes them on the host")
    prepare = steps
    if prec.gpu != prec.host and box.gpus:
        prepare = (*steps, _quantize(ctx, pl, prec, gguf))
        notes.append(f"the GGUF holds the GPU layers' experts at {prec.gpu.name} and the host layers' at "
                     f"{prec.host.name}: made once by the llama-quantize line above (llama.cpp PR #12511, "
                     "--tensor-type); the placement must stay as planned for that file")
    command = eng.Command(eng.LLAMA_SERVER, tuple(args))
    build, why = support.llama_minimum(command.args, ctx.family)
    c = Candidate("llama.cpp", label, pl, command, prec, q, prepare, notes=[*notes, *file_notes],
                  sim=ctx.sim("llama.cpp", _stack(ctx, "llama.cpp"), pl, prec,
                              policy=f"n-cpu-moe[n={ctx.L}]" if not box.gpus else None),
                  minimum=f"{build}" if build else "", minimum_why=", ".join(why))
    return c


def _stack(ctx: Context, engine: str) -> str:
    return ctx.req.stack or STACKS[engine]


def _quantize(ctx: Context, pl: Placement, prec: mem.Precisions, out_gguf: str) -> eng.Command:
    """llama-quantize: host experts at the file type, GPU layers' experts raised by --tensor-type."""
    dense = ctx.preset.dense_layers
    blocks = [dense + layer for gl in pl.gpu_layers() for layer in gl]
    host_type = llama_file_type(prec.host)
    gpu_type = GGML_TYPE.get(prec.gpu.name)
    if gpu_type is None:
        raise ConfigurationError(f"llama.cpp has no tensor type for {prec.gpu.name}; give --gpu-precision among "
                                 f"{', '.join(sorted(GGML_TYPE))}")
    args: list[tuple[str, str | None]] = []
    if blocks:
        args.append(("--tensor-type", f"{eng.blocks_regex(blocks)}={gpu_type}"))
    args += [("", f"{ctx.preset.name}-BF16.gguf"), ("", out_gguf), ("", host_type)]
    return eng.Command(eng.LLAMA_QUANTIZE, tuple(args), creates=out_gguf)


# ------------------------------------------------------------------------------------------ KTransformers
def kt_method(host: Precision, isa: str) -> str:
    """kt-kernel's CPU method for the host experts' precision (verified.toml kt_method_by_cpu;
    casmoe/engines/support.toml [[loader]])."""
    name = host.name
    amx = any(k in isa.lower() for k in ("amx", "sapphire", "emerald", "6454s"))
    if name in GGML_TYPE and name not in ("bf16", "fp16", "mxfp4"):
        return "LLAMAFILE"
    method = {"bf16": "BF16", "fp16": "BF16", "fp8": "FP8", "gptq4": "GPTQ_INT4", "int8": "AMXINT8" if amx else "MOE_INT8",
              "int4": "AMXINT4" if amx else "MOE_INT4"}.get(name)
    if method is None:
        raise ConfigurationError(f"kt-kernel has no CPU method for {name} experts (methods: LLAMAFILE for GGUF types, "
                                 "BF16, FP8, GPTQ_INT4, AMXINT4/8, MOE_INT4/8); give --precision among those")
    return method


def ktransformers(ctx: Context, prec: mem.Precisions) -> list[Candidate]:
    """KTransformers at host precision `prec.host` (its GPU experts: the checkpoint's own, what
    SGLang loads from --model-path)."""
    p, box, req = ctx.preset, ctx.box, ctx.req
    if not ctx.hf:
        raise ConfigurationError("KTransformers loads the model's GPU part from its Hugging Face checkpoint, and casmoe "
                                 f"knows none for {ctx.file.path if ctx.file else p.name}; plan it with --model ORG/NAME")
    method = kt_method(prec.host, ctx.profile.cpu)
    machine = ctx.machine(STACKS["ktransformers"], prec)
    base = mem.base(machine, box, req.context, req.concurrency)
    pl = place(base, ctx.E, ctx.orders["expert"], "expert")
    L, E = p.geometry.layers, p.geometry.experts
    n = pl.count
    hf_dir = _hf_dir(ctx)
    prepare: tuple[eng.Command, ...] = _download(ctx)
    if method == "LLAMAFILE":
        weight_path, steps, _ = gguf_of(ctx, prec if prec.gpu == prec.host else mem.Precisions(prec.host, prec.host,
                                                                                                prec.dense))
        prepare = tuple(dict.fromkeys((*prepare, *steps)))
    elif method in ("BF16", "FP8", "GPTQ_INT4"):
        weight_path = hf_dir  # the checkpoint's own experts (kt-kernel/README.md Option A)
    else:
        weight_path = f"{p.name}-{method.lower()}-cpu-experts"
        quant = {"AMXINT4": "int4", "AMXINT8": "int8", "MOE_INT4": "moe_int4", "MOE_INT8": "moe_int8"}[method]
        prepare = (*prepare, eng.Command(
            'python "${KTRANSFORMERS_DIR:?set KTRANSFORMERS_DIR to your ktransformers checkout}/kt-kernel/scripts/'
            'convert_cpu_weights.py"', (("--input-path", hf_dir), ("--input-type", "bf16"),
            ("--output", weight_path), ("--quant-method", quant), ("--cpuinfer-threads", str(ctx.threads or 1)),
            ("--threadpool-count", str(ctx.numa_nodes))), eng.SHELL, creates=weight_path))
    args: list[tuple[str, str | None]] = [("--model-path", hf_dir), ("--kt-weight-path", weight_path),
                                          ("--kt-method", method)]
    if ctx.threads:
        args.append(("--kt-cpuinfer", str(ctx.threads)))
    args.append(("--kt-threadpool-count", str(ctx.numa_nodes)))
    if n % L == 0:
        args.append(("--kt-num-gpu-experts", str(n // L)))
    else:
        args.append(("--kt-gpu-experts-ratio", repr((n + 0.5) / (L * E))))
    order_file = "kt-expert-order.pt"
    args += [("--kt-expert-placement-strategy", "frequency"), ("--init-expert-location", order_file),
             ("--context-length", str(req.context)), ("--max-running-requests", str(req.concurrency)),
             ("--mem-fraction-static", str(mem.sglang_mem_fraction(base.gpus[0].total)))]
    notes = [f"{n} GPU experts of {L * E}: the {order_file} written beside this plan ranks them as the routing "
             "does (kt-kernel keeps the largest counts of that file: " + eng.fact("kt_frequency_file")[1] + ")",
             f"--kt-method {method} for {prec.host.name} host experts; CPU requirements: "
             + eng.fact("kt_method_by_cpu")[0]]
    if ctx.numa_nodes > 1:
        notes.append(f"--kt-threadpool-count {ctx.numa_nodes}: one thread pool per NUMA node, each holding its "
                     "share of the host experts")
    if not ctx.threads:
        notes.append("--kt-cpuinfer not set: give --threads (physical cores; kt-kernel/README.md:520-524)")
    gpu_prec = mem.Precisions(prec.gpu, prec.host, prec.dense)
    support_row = support.family_support(ctx.family, "ktransformers")
    c = Candidate("ktransformers", "GPU expert mask from the routing (frequency)", pl,
                  eng.Command(eng.SGLANG, tuple(args), eng.SGLANG + " (ktransformers)"), gpu_prec,
                  ctx.quality(prec.host), prepare,
                  files={order_file: "KTransformers frequency statistics: this plan's GPU expert order"},
                  notes=notes, sim=ctx.sim("ktransformers", _stack(ctx, "ktransformers"), pl, prec),
                  minimum=support_row.since, minimum_why=f"{support_row.row}; --kt-gpu-experts-ratio and "
                  "--kt-expert-placement-strategy are in the kvcache-ai SGLang fork only")
    return [c]


# ------------------------------------------------------------------------------------------ vLLM, SGLang
def _hf_precision(engine: str, ctx: Context, prec: mem.Precisions) -> list[tuple[str, str | None]]:
    """--quantization for a precision vLLM / SGLang make from the checkpoint, or a refusal."""
    name = prec.gpu.name
    native = ctx.preset.expert_precision.name if ctx.preset.expert_precision is not None else "bf16"
    if name == native:
        return []
    if name in HF_LOADS:
        q = HF_LOADS[name]
        return [("--quantization", q)] if q else []
    raise ConfigurationError(f"{engine} serves the Hugging Face checkpoint ({native}), or fp8 made from it "
                             f"(--quantization fp8); {name} needs a checkpoint of its own: give --precision "
                             f"{native} or fp8")


def _first_layers(ctx: Context, engine: str, prec: mem.Precisions) -> tuple[mem.Precisions, mem.MemoryMap, Placement]:
    one = mem.Precisions(prec.gpu, prec.gpu, prec.dense)  # one checkpoint: every expert at the GPU precision
    machine = ctx.machine("sglang" if engine == "sglang" else STACKS[engine], one)
    base = mem.base(machine, ctx.box, ctx.req.context, ctx.req.concurrency)
    return one, base, first_layers(base, ctx.E)


def vllm(ctx: Context, prec: mem.Precisions) -> list[Candidate]:
    req = ctx.req
    quant = _hf_precision("vllm", ctx, prec)
    one, _, pl = _first_layers(ctx, "vllm", prec)
    host = pl.host_layers(ctx.L)
    gib = sum(h.experts for h in pl.memory.host) / GIB
    rules = mem.rules_engine("vllm")
    args: list[tuple[str, str | None]] = [("", ctx.weights or ctx.hf), *quant]
    if host:
        args += [("--cpu-offload-gb", f"{math.ceil(gib * 100) / 100:.2f}"), ("--cpu-offload-params", "experts")]
    args += [("--max-model-len", str(req.context)), ("--max-num-seqs", str(req.concurrency)),
             ("--gpu-memory-utilization", f"{rules['gpu_memory_utilization']:g}")]
    notes = [eng.fact("vllm_uva")[0] + f": the first {len(host)} layers' experts are read over PCIe at every forward "
             "pass (no cache, no CPU compute); simulated as those layers' routed experts computed 'on the host' at "
             "the link's rate"] if host else []
    hardware = _uva_profile(ctx) if host else None
    command = eng.Command(eng.VLLM, tuple(args))
    minimum, why = support.minimum("vllm", command.args, ctx.family)
    if host:
        why += "; --cpu-offload-params is in no vLLM release casmoe read (main after v0.11.2, at 9a276d63)"
    c = Candidate("vllm", f"--cpu-offload-gb (first {len(host)} layers' experts streamed)" if host else "all on GPU",
                  pl, command, one, ctx.quality(one.gpu), notes=notes,
                  sim=ctx.sim("vllm", _stack(ctx, "vllm"), pl, one, hardware=hardware), minimum=minimum,
                  minimum_why=why)
    return [c]


def _uva_profile(ctx: Context) -> str:
    """A profile whose 'host compute' is the GPU reading offloaded weights over the link: what
    vLLM's UVA offload does with an expert of an offloaded layer each time one is routed."""
    hw = load_profile(ctx.hardware)
    rate = hw.h2d_pinned_gbs / hw.mem_efficiency  # x mem_efficiency in the roofline = the link's rate
    why = "vLLM UVA offload (casmoe plan): offloaded experts are read by the GPU over the host link at every forward"
    uva = hw.with_values(
        {"cpu_mem_bw_gbs": f"{why}: h2d_pinned_gbs / mem_efficiency, so the roofline's bandwidth is the link's",
         "cpu_tflops": f"{why}: the GPU computes them (dense_tflops)", "cpu_hop_us": f"{why}: no activation hop",
         "cpu_serial": f"{why}: the same GPU stream runs them", "cpu_thread_gbs": f"{why}: no host threads",
         "cpu_threads": f"{why}: no host threads"},
        name=f"{hw.name}-vllm-uva", cpu_mem_bw_gbs=rate, cpu_tflops=hw.dense_tflops, cpu_hop_us=0.0, cpu_serial=1.0,
        cpu_thread_gbs=0.0, cpu_threads=0)
    folder = ctx.out / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uva.name.replace('@', '_').replace(',', '_').replace('=', '')}.toml"
    uva.write(path)
    return str(path.resolve())


def sglang(ctx: Context, prec: mem.Precisions) -> list[Candidate]:
    p, req = ctx.preset, ctx.req
    quant = _hf_precision("sglang", ctx, prec)
    one, base, pl = _first_layers(ctx, "sglang", prec)
    host = pl.host_layers(ctx.L)
    offloaded = sum(h.experts for h in pl.memory.host)
    args: list[tuple[str, str | None]] = [("--model-path", ctx.weights or ctx.hf), *quant]
    if host:
        args.append(("--cpu-offload-gb", str(math.ceil(offloaded / GIB))))
    args += [("--context-length", str(req.context)), ("--max-running-requests", str(req.concurrency)),
             ("--mem-fraction-static", str(mem.sglang_mem_fraction(base.gpus[0].total)))]
    hw = ctx.profile
    g = p.geometry
    closed = None
    notes = []
    if host:
        machine = ctx.machine("sglang", one)
        gpu_b, _ = mem.expert_sizes(machine)
        active = sum(gpu_b) * g.top_k + machine.dense_weight_bytes(g.layers) + machine.head_bytes()
        t = active / (hw.mem_bw_gbs * 1e9 * hw.mem_efficiency) + p.blocks * hw.layer_overhead_us * 1e-6
        t += offloaded / (hw.h2d_pinned_gbs * 1e9)
        closed = 1 / t
        notes.append(eng.fact("sglang_offload")[0] + f": {offloaded / GIB:.1f} GiB cross the link every forward pass "
                     "(decode speed below is a closed form: active weights at the GPU's bandwidth plus that copy; not "
                     "simulated). Its parameters are offloaded first come in module order, embeddings and attention "
                     "included, not only experts; KTransformers is SGLang with CPU experts")
    else:
        notes.append("SGLang has no fitted stack: priced on the ideal stack, an upper bound")
    command = eng.Command(eng.SGLANG, tuple(args))
    minimum, why = support.minimum("sglang", command.args, ctx.family)
    return [Candidate("sglang", f"--cpu-offload-gb {math.ceil(offloaded / GIB)}" if host else "all on GPU", pl,
                      command, one, ctx.quality(one.gpu), notes=notes, closed_form=closed,
                      sim=None if host else ctx.sim("sglang", _stack(ctx, "sglang"), pl, one), minimum=minimum,
                      minimum_why=why)]


# ------------------------------------------------------------------------------------------ casmoe
def casmoe(ctx: Context, prec: mem.Precisions) -> list[Candidate]:
    p, box, req = ctx.preset, ctx.box, ctx.req
    one = mem.Precisions(prec.gpu, prec.gpu, prec.dense)
    native = p.expert_precision.name if p.expert_precision is not None else "bf16"
    if one.gpu.name != native:
        raise ConfigurationError(f"casmoe bench runs the checkpoint's own weights ({native}); {one.gpu.name} is not "
                                 "one it loads")
    machine = ctx.machine(STACKS["casmoe"], one)
    base = mem.base(machine, box, req.context, req.concurrency)
    pl = place(base, ctx.E, ctx.orders["expert"], "expert")
    supported = not ctx.families or ctx.family in ctx.families
    model = ctx.weights or ctx.hf
    common: list[tuple[str, str | None]] = [("--model", model)]
    tail: list[tuple[str, str | None]] = [("--device", "cuda:0")]
    if ctx.threads:
        tail.append(("--threads", str(ctx.threads)))
    if req.concurrency > 1:
        tail.append(("--batch", str(req.concurrency)))
    profile_file = "casmoe-profile.npz"
    routed = eng.Command(eng.CASMOE, tuple(common + [("--policy", f"routed-placement[profile={profile_file}]"),
                                                     ("--global-capacity", str(max(pl.count, p.geometry.top_k))),
                                                     ("--miss-mode", "cpu")] + tail), eng.CASMOE)
    notes = [] if supported else [f"casmoe's backend has no adapter for {ctx.family or p.name} (supported: "
                                  f"{', '.join(ctx.families)}): this is the command it would run; today it stops with "
                                  "'not a supported MoE model'"]
    notes.append("casmoe bench runs the backend on prompts and reports tokens/s; it is a benchmark, not a server")
    q = ctx.quality(one.gpu)
    stack = _stack(ctx, "casmoe")
    out = [Candidate("casmoe", "routing-aware experts on the GPU, the rest computed on the host", pl, routed, one, q,
                     files={profile_file: "casmoe profile: this plan's step shares (routed-placement[profile=...])"},
                     notes=list(notes), sim=ctx.sim("casmoe", stack, pl, one))]
    slots = pl.count // ctx.L
    if pl.rule != "all" and slots >= p.geometry.top_k:
        cache = per_layer_cache(base, ctx.E, slots)
        lru = eng.Command(eng.CASMOE, tuple(common + [("--policy", "lru"), ("--capacity", str(slots)),
                                                      ("--miss-mode", "load")] + tail), eng.CASMOE)
        out.append(Candidate("casmoe", f"LRU expert cache, {slots} slots per layer (copies misses)", cache, lru, one, q,
                             notes=list(notes), sim=ctx.sim("casmoe", stack, cache, one, policy="lru",
                                                            capacity=str(slots))))
    return out


BUILDERS: dict[str, Callable[[Context, mem.Precisions], list[Candidate]]] = {
    "llama.cpp": llama_cpp, "ktransformers": ktransformers, "vllm": vllm, "sglang": sglang, "casmoe": casmoe}
