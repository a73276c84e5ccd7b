"""`casmoe plan`: from a model (a preset, the user's GGUF, a config or a Hugging Face id), a box (a
profile, or the one this runs on, detected), engines, a context and a concurrency to each engine's
own configuration, its memory map and its expected speed.

For each engine the plan first asks whether it runs the model at all (`support`: its architecture
and version, the format it loads, a GPU where it needs one): an engine that cannot is one line,
never a command. For one that can, it compares the precisions users download (`quality`; without
`--precision`) and, at each, the configurations the engine can express (`configurations`), each
filled to the memory map of the box. Every configuration the simulator can price becomes one
`RunSpec` through `Grid.of(...).specs()`, at the plan's context and concurrency on the engine's own
stack, and all of them run through `casmoe.sim.run.runner.run_all` in one batch (content-keyed
points under `out/points`: a repeated plan is free). The simulator's own memory check is never
lifted for a one-GPU box (its map is the plan's: `memory`); experts that do not fit host RAM are
priced with their storage reads. The best of an engine is the fastest configuration that fits at a
precision at or above the quality floor; the others are its runners-up, each with its own numbers
and its `casmoe simulate` line.

Speeds are the simulator's, on the trace's held-out requests (what the placement was fitted on
never scores it), each request served at the plan's context; what it does not model is said beside
them (llama.cpp's op offload of prefill; SGLang's whole-module copies, a closed form). The
uncertainty is the 80% interval of the error model `casmoe validate published` fitted for the
run's configuration (`casmoe.sim.trust.uncertainty`); a stack nothing validated says so.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from casmoe.errors import CasmoeError
from casmoe.output import write_text
from casmoe.precision import parse_precision
from casmoe.presets import ModelPreset, get_preset
from casmoe.presets.gguf_header import read_header
from casmoe.sim.box.hardware import HardwareProfile, load_profile, variant_spec
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy import support
from casmoe.sim.questions.deploy.candidate import NOT_VALIDATED, Candidate, Context, Speed, reproduce, rounded
from casmoe.sim.questions.deploy.configurations import BUILDERS, STACKS, ConfigurationError
from casmoe.sim.questions.deploy.model import resolve_model
from casmoe.sim.questions.deploy.placement import (
    first_layers,
    routed_order,
    train_shares,
    write_casmoe_profile,
    write_kt_order,
)
from casmoe.sim.questions.deploy.quality import DEFAULT_FLOOR, above, floor_kld, gguf_choices
from casmoe.sim.questions.deploy.routing import Routing, resolve
from casmoe.sim.run.grid import Grid
from casmoe.sim.run.runner import run_all, whole_trace
from casmoe.sim.run.spec import casmoe_version, file_digest
from casmoe.sim.trust.uncertainty import factor, spread
from casmoe.tables import read_table

SYSTEMS = {"llama.cpp": ("llama.cpp", "Ollama"), "ktransformers": ("KTransformers",), "vllm": ("vLLM",),
           "sglang": ("SGLang",), "casmoe": ()}
"""Names of each engine in casmoe/sim/trust/published/measurements.toml."""


class PlanError(CasmoeError, ValueError):
    """A plan that cannot be made as asked (an unknown engine, a box without RAM, ...)."""


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks: the model (a preset name, a GGUF file, a config.json or its folder, a
    Hugging Face id), the box (a hardware spec: a shipped name, a TOML file, a variant), the
    engines, the context and concurrency to serve, optionally a routing trace, a precision (or
    one for the GPUs' experts and one for the host's), the quality floor the precisions compared
    must meet, per-GPU memory when the GPUs differ, host threads, the stack of the one engine
    planned."""

    model: str
    hardware: str = "rtx4090x4"
    engines: tuple[str, ...] = eng.ENGINES
    context: int = 8192
    concurrency: int = 1
    trace: str | None = None
    precision: str | None = None
    gpu_precision: str | None = None
    host_precision: str | None = None
    quality_floor: str | None = None
    gpu_memory: tuple[float, ...] = ()
    threads: int = 0
    requests: int = 16
    weights: str = ""
    compare: bool = True
    stack: str | None = None

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
        if self.precision and (self.gpu_precision or self.host_precision):
            raise PlanError("--precision sets every expert's precision: give it, or --gpu-precision and "
                            "--host-precision, not both")
        if self.quality_floor is not None:
            if self.precision or self.gpu_precision or self.host_precision:
                raise PlanError("--quality-floor chooses among the precisions a plan compares, and --precision names "
                                "one: give either")
            floor_kld(self.quality_floor)
        if self.stack is not None and len(self.engines) != 1:
            raise PlanError(f"--stack {self.stack} prices one engine's configurations on your stack, and each engine "
                            "is otherwise priced on its own (llama.cpp, ktransformers, vllm: their fitted stacks); "
                            "give --engine too")


@dataclass
class EnginePlan:
    engine: str
    best: Candidate | None
    others: list[Candidate]
    version: str
    refused: str = ""  # why this engine runs none of it (one line)
    why_none: str = ""  # why no configuration is best (none fits, none at the quality floor)
    precisions: list[dict[str, Any]] = field(default_factory=list)  # the precisions compared, one row each

    def ranked(self) -> list[Candidate]:
        return ([self.best] if self.best else []) + self.others

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "flags_read_at": self.version, "refused": self.refused or None,
                "no_best": self.why_none or None, "precisions": self.precisions,
                "best": None if self.best is None else self.best.to_dict(),
                "runners_up": [c.to_dict() for c in self.others]}


@dataclass(frozen=True)
class Comparison:
    """Routing-aware placements against llama.cpp's first-N rule at equal GPU experts on the
    held-out requests, each on the stack of the engine that can run it (llama.cpp's layers on
    llama.cpp's, the per-expert mask on KTransformers')."""

    gpu_layers: int
    gpu_experts: int
    rows: tuple[dict[str, Any], ...]

    def gain(self, placement: str) -> float | None:
        base = next((r for r in self.rows if r["placement"] == "n-cpu-moe"), None)
        mine = next((r for r in self.rows if r["placement"] == placement), None)
        if not base or not mine or not base["decode_tok_s"] or mine["decode_tok_s"] is None:
            return None
        return mine["decode_tok_s"] / base["decode_tok_s"] - 1

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_layers": self.gpu_layers, "gpu_experts": self.gpu_experts, "rows": list(self.rows),
                "gains": {f"{p} vs n-cpu-moe": rounded(self.gain(p)) for p in ("routed layers", "routed experts")}}


@dataclass
class Plan:
    request: PlanRequest
    preset: ModelPreset
    box: mem.Box
    routing: Routing
    engines: list[EnginePlan]
    model_note: str = ""
    comparison: Comparison | None = None
    published: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    simulated: int = 0

    def candidates(self) -> list[Candidate]:
        return [c for e in self.engines for c in e.ranked()]

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        chosen = [f"{e.engine} {e.best.precision_name}" for e in self.engines if e.best]
        return {"model": self.preset.name, "model_source": self.model_note, "hardware": r.hardware, "box": {
                    "gpus_gib": list(self.box.gpu_gib), "host_ram_gib": self.box.host_ram_gib,
                    "numa_nodes": self.box.numa_nodes, "threads": self.box.threads},
                "context": r.context, "concurrency": r.concurrency,
                "precisions": "experts " + (", ".join(chosen) or "none chosen"),
                "quality_floor": r.quality_floor or DEFAULT_FLOOR,
                "routing": self.routing.how, "trace": str(self.routing.path), "notes": self.notes,
                "engines": [e.to_dict() for e in self.engines],
                "comparison": None if self.comparison is None else self.comparison.to_dict(),
                "published": self.published, "simulated_now": self.simulated}


# ------------------------------------------------------------------------------------------- the box
def box_of(profile: HardwareProfile, spec: str, req: PlanRequest) -> mem.Box:
    """The box a plan fits, from the profile and the user's overrides."""
    if req.gpu_memory and len(req.gpu_memory) != profile.gpus:
        raise PlanError(f"--gpu-memory gives {len(req.gpu_memory)} GPUs, the profile {profile.name!r} has "
                        f"{profile.gpus}; give one per GPU (or --gpus N)")
    gpus = req.gpu_memory or (profile.memory_gib,) * profile.gpus
    if profile.host_ram_gib <= 0:
        raise PlanError(f"profile {profile.name!r} does not say how much host RAM it has (host_ram_gib); add it to "
                        "the profile or give --host-ram GiB")
    threads = req.threads or profile.cpu_cores or _cores(profile)
    return mem.Box(profile.name, tuple(float(g) for g in gpus), profile.host_ram_gib, profile.sockets, threads,
                   spec, profile.reserved_gib, profile.host_reserved_gib)


def _cores(profile: HardwareProfile) -> int:
    """Physical cores from a profile's `cpu` text ('2x Intel Xeon Gold 6330 (28 cores, ...)': 28 a
    socket) times its sockets; 0 when it does not say."""
    m = re.search(r"(\d+)\s*(?:physical\s+)?cores", profile.cpu)
    return int(m.group(1)) * profile.sockets if m else 0


# ---------------------------------------------------------------------------------------- helpers
def hf_id(preset: ModelPreset) -> str:
    """The Hugging Face id the preset's source begins with ('Qwen/Qwen3-30B-A3B config.json ...',
    'deepseek-ai/DeepSeek-V2-Lite(-Chat) config.json', 'zai-org/GLM-4.5: ...'), or ''."""
    m = re.match(r"([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w-]*(?:\.[\w-]+)*)(?=[\s:(]|$)", preset.source)
    return m.group(1) if m else ""


def uncertainty(record: dict[str, Any] | None, decode: float | None) -> tuple[tuple[float, float] | None, str]:
    """The error model's 80% interval for this run (`casmoe.sim.trust.uncertainty`): a band
    around `decode` and its words; none for a closed form or a stack nothing validated."""
    if decode is None or record is None:
        return None, NOT_VALIDATED

    f = factor(record)
    return (None if f is None else (decode / f, decode * f)), f"uncertainty: {spread(record)}"


def _refusal(engine: str, ctx: Context, file_model: bool) -> str:
    """Why `engine` runs none of this plan (one line), or ''."""
    if not ctx.box.gpus and engine != "llama.cpp":
        return (f"{engine} needs a GPU here (casmoe plans its GPU offload); this box has none: llama.cpp runs the "
                "model on the CPU")
    if file_model and engine in ("vllm", "sglang", "casmoe"):
        return (f"{engine} loads Hugging Face checkpoints, not GGUF files (vLLM's GGUF loader moved to a plugin, PR "
                "#39612); plan it with --model ORG/NAME")
    if engine == "casmoe":
        return ""
    s = support.family_support(ctx.family, engine)
    return "" if s.supported else s.why


def _precisions(engine: str, ctx: Context) -> list[mem.Precisions]:
    """The precisions `engine` is planned at (see the module docstring)."""
    req, p = ctx.req, ctx.preset
    if ctx.file is not None:
        return [mem.Precisions.of(p, parse_precision(ctx.file.precision_name()))]
    native = p.expert_precision.name if p.expert_precision is not None else "bf16"
    if req.gpu_precision or req.host_precision:
        gpu = req.gpu_precision or (native if engine == "ktransformers" else req.host_precision)
        return [mem.Precisions.of(p, gpu, req.host_precision or gpu)]
    if req.precision:
        if engine == "ktransformers":
            return [mem.Precisions.of(p, native, req.precision)]
        return [mem.Precisions.of(p, req.precision)]
    if engine == "llama.cpp":
        return [mem.Precisions.of(p, q) for q in gguf_choices(p)]
    if engine == "ktransformers":  # the GPU experts are the checkpoint's; the host's a GGUF at the floor's type
        host = req.quality_floor if req.quality_floor not in (None, "none") else DEFAULT_FLOOR
        return [mem.Precisions.of(p, native, host)]
    if engine in ("vllm", "sglang") and native in ("bf16", "fp16"):  # the checkpoint, and FP8 made from it
        return [mem.Precisions.of(p, native), mem.Precisions.of(p, "fp8")]
    return [mem.Precisions.of(p, native)]


# ------------------------------------------------------------------------------------------ the plan
def make_plan(req: PlanRequest, out: str | Path, *, jobs: int = 1, ray_address: str | None = None,
              progress: Callable[[int, int], None] | None = None, say: Callable[[str], object] | None = None,
              families: Sequence[str] = ()) -> Plan:
    """Build, simulate and rank every engine's candidates; write the files they name into `out`."""
    req.check()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    choice = resolve_model(req.model, need_preset=False)
    preset = choice.model if choice.model is not None else get_preset(choice.preset)
    file = choice.file
    if file is not None and (req.precision or req.gpu_precision or req.host_precision):
        raise PlanError(f"{req.model} states every tensor's type: leave --precision, --gpu-precision and "
                        "--host-precision out (or plan the model by name to compare precisions)")
    if file is not None and req.weights:
        raise PlanError(f"--model {req.model} is the file the engines load: leave --weights out")
    if file is not None and req.quality_floor is not None:
        raise PlanError(f"--quality-floor chooses among the precisions a plan compares; {req.model} is one file: leave "
                        "it out")
    hardware = variant_spec(req.hardware, cpu_threads=req.threads) if req.threads else req.hardware
    profile = load_profile(hardware)
    box = box_of(profile, req.hardware, req)
    routing = resolve(preset, req.trace, say)
    whole = whole_trace(str(routing.path), file_digest(routing.path))
    longest = max(r.tokens for r in whole.requests)
    if req.context < longest:
        raise PlanError(f"--context {req.context} is below the longest request of the routing {routing.path.name} "
                        f"({longest} tokens); give --context {longest} or more")
    shares = train_shares(whole, req.concurrency)
    orders = {"layer": routed_order(shares, "layer"), "expert": routed_order(shares, "expert")}
    matched = get_preset(choice.preset) if choice.preset else None
    given = req.weights or choice.weights
    hf = given if (given and not Path(given).exists() and file is None) else \
        hf_id(matched) if matched is not None else ""
    arch = _gguf_arch(file.path) if file is not None else ""
    family = support.family_of(matched or preset, arch)
    ctx = Context(req, preset, profile, box, routing, shares, orders, out, family,
                  str(Path(file.path).resolve()) if file is not None else preset.name, hf, file,
                  req.weights or (choice.weights if file is None else ""), tuple(families), hardware,
                  floor_kld(req.quality_floor or DEFAULT_FLOOR), released_precision(matched, family),
                  str(Path(file.path).resolve()) if file is not None else "")
    notes = [f"routing: {routing.how}; placements are fitted on its train split at concurrency {req.concurrency} and "
             "scored on its held-out requests",
             f"speeds: each held-out request served at a context of {req.context} tokens (its attention reads the "
             "earlier ones); prefill at the routing's prompt lengths, host experts computed on the host (llama.cpp's op "
             "offload of prompt batches >= 32 tokens to the GPU and KTransformers' layerwise prefill are not modelled)"]
    if box.gpus > 1:
        notes.append(f"{box.gpus} GPUs: placed per GPU in the memory map and the commands; simulated as one device "
                     "holding every GPU's experts (the simulator places a run's experts per GPU its own way), past its "
                     "one-GPU memory check, with the host's storage reads where RAM is short")
    if req.gpu_memory and len(set(req.gpu_memory)) > 1:
        notes.append("GPUs of different sizes: the memory map holds each to its own size; the simulator prices them "
                     "as GPUs of the profile's kind")
    engines: list[EnginePlan] = []
    candidates: dict[str, list[Candidate]] = {}
    for e in req.engines:
        why = _refusal(e, ctx, file is not None)
        cands: list[Candidate] = []
        mine = ctx
        if not why and e == "ktransformers" and file is not None:  # its GPU part is the checkpoint's: priced by preset
            if matched is None:
                why = ("KTransformers loads the model's GPU part from its Hugging Face checkpoint, and casmoe knows none "
                       f"for {req.model} (no shipped preset has its shape); plan it with --model ORG/NAME")
            else:
                mine = replace(ctx, preset=matched, file=None, model_option=matched.name)
        if not why:
            tried = _precisions(e, ctx)
            if mine is not ctx:
                tried = [mem.Precisions.of(matched, ctx.released, parse_precision(file.precision_name()))]
            errors = []
            for prec in tried:
                try:
                    cands += BUILDERS[e](mine, prec)
                except ConfigurationError as exc:
                    errors.append(str(exc))
            if not cands:
                why = errors[0] if errors else f"{e}: no configuration"
        for c in cands:
            c.command.check()
            for step in c.prepare:
                step.check()
            c.above_floor = above(c.quality, ctx.floor) if not (req.precision or req.gpu_precision or file) else True
        candidates[e] = cands
        engines.append(EnginePlan(e, None, [], _version(e), refused=why))
    if all(e.refused for e in engines):
        raise PlanError("no engine asked for can run this: " + "; ".join(f"{e.engine}: {e.refused}" for e in engines))
    comparison_specs = _comparison_specs(ctx, candidates.get("llama.cpp")) if req.compare and box.gpus else None
    simulated, comparison = _simulate([c for cs in candidates.values() for c in cs], comparison_specs, ctx, out, jobs,
                                      ray_address, progress)
    for plan_e in engines:
        _rank(plan_e, candidates[plan_e.engine], ctx)
    _write_files(ctx, engines, out)
    plan = Plan(req, preset, box, routing, engines, choice.note, notes=notes, simulated=simulated)
    plan.comparison = comparison
    plan.published = published(preset.name, req.engines)
    return plan


def released_precision(matched: ModelPreset | None, family: str) -> Any:
    """The precision the model's experts were released at: the shipped preset's, else gpt-oss's
    MXFP4 or 16 bits (a GGUF read alone states its own file's type, not the release's)."""
    if matched is not None and matched.expert_precision is not None:
        return matched.expert_precision
    return parse_precision("mxfp4" if family == "gpt_oss" else "bf16")


def _gguf_arch(path: str) -> str:
    try:
        return read_header(path).architecture
    except CasmoeError:
        return ""


def _rank_speed(c: Candidate) -> float:
    """What configurations are ranked by: decode tokens/s at the requested context."""
    s = c.speed
    return 0.0 if s is None else float(s.decode or 0.0)


def _rank(plan: EnginePlan, cands: list[Candidate], ctx: Context) -> None:
    """The engine's best: the fastest that fits at or above the quality floor (none when none
    does, and why); the rest in order; one row per precision compared."""
    ranked = sorted(cands, key=lambda c: (not c.fits, not c.above_floor, c.speed is None or c.speed.decode is None,
                                          -_rank_speed(c)))
    if ranked and ranked[0].fits and ranked[0].above_floor and ranked[0].speed and ranked[0].speed.decode:
        plan.best, plan.others = ranked[0], ranked[1:]
    else:
        plan.best, plan.others = None, ranked
        fitting = [c for c in ranked if c.fits]
        if not ranked:
            plan.why_none = ""
        elif not fitting:
            smallest = min(ranked, key=lambda c: c.placement.memory.totals()["gpu_used_gib"] +
                           c.placement.memory.totals()["host_used_gib"])
            plan.why_none = (f"no configuration of {plan.engine} fits this box; the smallest "
                             f"({smallest.precisions.describe()}, {smallest.label}): "
                             + "; ".join(smallest.placement.memory.problems))
        elif not any(c.above_floor for c in fitting):
            below = fitting[0]
            plan.why_none = (f"nothing at or above the quality floor ({ctx.req.quality_floor or DEFAULT_FLOOR}) fits; "
                             f"the fastest below it is {below.precisions.gpu.name}, {below.label}: give "
                             "--quality-floor none (or --precision) to plan it")
        else:
            plan.why_none = "no configuration that fits could be priced: " + "; ".join(
                dict.fromkeys(c.speed.how for c in fitting if c.speed))
    by_precision: dict[str, Candidate] = {}
    for c in ranked:
        by_precision.setdefault(c.precisions.describe(), c)
    if len(by_precision) > 1:
        plan.precisions = [_precision_row(c, plan.best) for c in by_precision.values()]


def _precision_row(c: Candidate, best: Candidate | None) -> dict[str, Any]:
    s = c.speed or Speed(None)
    m = c.placement.memory
    size = sum(g.experts + g.dense + g.embeddings for g in m.gpus) + sum(h.experts + h.other for h in m.host)
    return {"precision": c.precisions.gpu.name if c.precisions.gpu == c.precisions.host else c.precisions.describe(),
            "chosen": c is best, "weights_gib": round(size / mem.GIB, 2), "fits": c.fits, "configuration": c.label,
            "decode_tok_s": rounded(s.decode), "band": "" if s.band is None else f"{s.band[0]:.3g}-{s.band[1]:.3g}",
            "quality": c.quality.text, "at_floor": "yes" if c.above_floor else "no"}


def _version(engine: str) -> str:
    if engine == "casmoe":
        return f"casmoe {casmoe_version()} (this checkout's `casmoe bench`)"
    if engine == "ktransformers":
        return ("kt-kernel of kvcache-ai/ktransformers v0.7.0 (95009ea6) with the kvcache-ai/sglang fork (sglang-kt, "
                "04653fa8); upstream SGLang flags at d2b3c7fb")
    program = {"llama.cpp": eng.LLAMA_SERVER, "vllm": eng.VLLM, "sglang": eng.SGLANG}[engine]
    return " ".join(eng.flag_list(program).version.split())


def _spec_of(values: dict[str, Any], gpus: int) -> tuple[Any, str | None, list[str]]:
    """The one RunSpec of these run options, why the simulator refuses it (None: it does not),
    and what it notes (a RAM tier over storage). A box of several GPUs is simulated as one
    device holding every GPU's experts: past the one-GPU check, with the RAM tier the run
    would have had (its storage reads priced)."""
    values = {k: v for k, v in values.items() if not k.startswith("_")}
    try:
        runs = Grid.of(values, "casmoe plan").specs(strict=False)
    except CasmoeError as exc:  # the simulator cannot price it at all (no drive to read what RAM lacks)
        return None, _plan_terms(str(exc), values.get("hardware", "")), []
    spec = runs.specs[0]
    if spec in runs.refused and gpus > 1:
        if spec.host_cache is not None:
            values["host_cache"] = str(spec.host_cache.rows)
        values["allow_overcommit"] = True
        again = Grid.of(values, "casmoe plan").specs(strict=False)
        return again.specs[0], None, runs.notes
    return spec, runs.refused.get(spec), runs.notes


def _plan_terms(why: str, hardware: str) -> str:
    """A simulator refusal as what a plan's user can change (simulate's remedies name its flags)."""
    if "no storage tier" in why:
        what = why.split(", and the profile has no storage tier", 1)[0]
        return (f"{what}; the engine would read the rest from the drive, and the profile does not say how fast "
                f"(storage_read_gbs): add it to {hardware.split('@')[0]} to price that, or plan a smaller precision")
    return why.split("; give ", 1)[0]


def _comparison_specs(ctx: Context, llama: list[Candidate] | None) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
    """n-cpu-moe and routed layers on llama.cpp's stack, routed experts on KTransformers', at the
    GPU experts of llama.cpp's first-layers placement at the precision of its best candidate."""
    if not llama:
        return None
    prec = max(llama, key=lambda c: (c.above_floor, c.precisions.gpu.bits)).precisions
    picks = [c for c in llama if c.above_floor and c.placement.rule != "all"]
    if picks:
        prec = min(picks, key=lambda c: c.precisions.gpu.bits).precisions
    firsts = [first_layers(mem.base(ctx.machine(STACKS[e], prec), ctx.box, ctx.req.context, ctx.req.concurrency),
                           ctx.E) for e in ("llama.cpp", "ktransformers")]
    first = min(firsts, key=lambda pl: pl.count)  # equal memory: the layers both engines' GPUs hold beside the rest
    G = ctx.L - len(first.host_layers(ctx.L))
    if G <= 0 or G >= ctx.L:
        return None
    B = ctx.req.concurrency
    batch = f",batch={B}" if B > 1 else ""
    policies = {"n-cpu-moe": (f"n-cpu-moe[n={ctx.L - G}]", "llama.cpp"),
                "routed layers": (f"routed-placement[unit=layer{batch}]", "llama.cpp"),
                "routed experts": ("routed-placement" + (f"[batch={B}]" if B > 1 else ""), "ktransformers")}
    out = []
    for name, (policy, engine) in policies.items():
        values = {**ctx.sim(engine, STACKS[engine], first, prec, policy=policy), "global_capacity": str(G * ctx.E)}
        out.append(({"placement": name, "engine": engine, "stack": STACKS[engine], "policy": policy,
                     "precision": prec.gpu.name, "gpu_layers": G}, values))
    return out


def _simulate(cands: list[Candidate], comparison: list[tuple[dict[str, Any], dict[str, Any]]] | None, ctx: Context,
              out: Path, jobs: int, ray_address: str | None, progress: Callable[[int, int], None] | None
              ) -> tuple[int, Comparison | None]:
    """One `run_all` for every candidate and comparison point."""
    specs, owners, rows = [], [], []
    for c in cands:
        if c.sim is None:
            continue
        if not c.fits:
            c.speed = Speed(None, how="not priced: it does not fit the box (memory map)")
            continue
        spec, why, run_notes = _spec_of(c.sim, ctx.box.gpus)
        if why:
            c.speed = Speed(None, how=f"not priced: {_plan_terms(why, ctx.hardware)}")
            continue
        c.notes += [n.removeprefix("note: ") for n in run_notes if "RAM tier" in n]
        if ctx.box.gpus > 1:
            c.sim = {**c.sim, "allow_overcommit": spec.overcommit or None,
                     "host_cache": str(spec.host_cache.rows) if spec.host_cache is not None else None}
        specs.append(spec)
        owners.append(("candidate", c, spec))
    for meta, values in comparison or []:
        spec, why, _ = _spec_of(dict(values), ctx.box.gpus)
        if why:
            rows.append({**meta, "decode_tok_s": None, "scored": f"not priced: {_plan_terms(why, ctx.hardware)}",
                         "key": "", "reproduce": reproduce(values)})
            continue
        specs.append(spec)
        owners.append(("comparison", (meta, values), spec))
    unique = list({s.key: s for s in specs}.values())
    records, computed = run_all(unique, out, jobs=jobs, ray_address=ray_address, progress=progress) if unique \
        else ([], 0)
    by_key = {r["key"]: r for r in records}
    for kind, owner, spec in owners:
        rec = by_key[spec.key]
        if kind == "candidate":
            owner.key = spec.key
            owner.speed = _speed(rec, spec)
        else:
            meta, values = owner
            rows.append({**meta, "decode_tok_s": rounded(rec.get("decode_tokens_per_s")), "scored": rec.get("scored"),
                         "key": spec.key, "reproduce": reproduce(values),
                         **({"skipped": rec["skipped"]} if "skipped" in rec else {})})
    for c in cands:
        if c.sim is None:
            band, text = uncertainty(None, c.closed_form)
            c.speed = Speed(c.closed_form, None, band, text, "closed form (not simulated)")
    comp = None
    if rows:
        G = rows[0]["gpu_layers"]
        comp = Comparison(G, G * ctx.E, tuple(rows))
    return computed, comp


def _speed(rec: dict[str, Any], spec: Any) -> Speed:
    if "skipped" in rec:
        return Speed(None, how=f"not simulated: {rec['skipped']}", evidence=f"points/{spec.key}.json")
    decode = rec.get("decode_tokens_per_s")
    prefill = None
    reqs, ttft = rec.get("requests") or 0, rec.get("ttft_p50_s") or 0.0
    if reqs and ttft > 0:
        prefill = rec.get("prefill_tokens", 0) / reqs / ttft
    band, text = uncertainty(rec, decode)
    return Speed(decode, prefill, band, text, f"simulated on the {rec.get('stack', '?')} stack, {rec.get('scored', '')}",
                 f"points/{spec.key}.json")


# ------------------------------------------------------------------------------------------ files
def script(c: Candidate, rank: int) -> str:
    """A POSIX shell script that runs `c` from the plan's folder: it refuses when the
    configuration does not fit, checks the engine's version, makes what it loads (each step
    skipped when its output exists) and starts the engine."""
    lines = ["#!/bin/sh", f"# {c.engine}: {c.label}, {c.precisions.describe()} (casmoe plan: "
             f"{'the best configuration' if rank == 0 else f'runner-up {rank}'})",
             f"# expected: {c.speed.decode:.3g} tok/s decode" if c.speed and c.speed.decode else "# expected: not priced",
             *([f"# reproduce the figure: {c.reproduce}"] if c.reproduce else []),
             "set -e", 'cd "$(dirname "$0")"  # the files this plan wrote, and what the steps below make, are here']
    if not c.fits:  # the script must say so itself
        lines += [f"# DOES NOT FIT this box: {p}" for p in c.placement.memory.problems] or \
            ["# DOES NOT FIT this box (casmoe plan's memory map)"]
        lines += ["echo 'casmoe plan: this configuration does not fit the box it was planned for' >&2", "exit 1"]
    lines += support.version_check(c.engine, c.minimum, c.minimum_why)
    for step in c.prepare:
        text = step.text()
        lines.append(f"[ -e {_quote(step.creates)} ] || {text}" if step.creates else text)
    lines.append(("exec " if c.command.program != eng.CASMOE else "") + c.command.text())
    return "\n".join(lines) + "\n"


def _quote(path: str) -> str:
    return shlex.quote(path)


def _write_files(ctx: Context, engines: list[EnginePlan], out: Path) -> None:
    """Each engine's scripts in rank order (`<engine>.sh` its best, `<engine>-1.sh`, ... the
    runners-up; `<engine>-1.sh` first when none is best), and the files they read."""
    for old in out.glob("*.sh"):
        old.unlink()
    for e in engines:
        ranked = e.ranked()
        if any("kt-expert-order.pt" in c.files for c in ranked):
            write_kt_order(out / "kt-expert-order.pt", ctx.orders["expert"], ctx.preset)
        if any("casmoe-profile.npz" in c.files for c in ranked):
            write_casmoe_profile(out / "casmoe-profile.npz", ctx.shares, str(ctx.routing.path))
        for i, c in enumerate(ranked):
            rank = i if e.best is not None else i + 1
            path = out / f"{e.engine}{'' if rank == 0 else f'-{rank}'}.sh"
            write_text(path, script(c, rank))
            path.chmod(0o755)


def published(model: str, engines: Sequence[str]) -> list[dict[str, Any]]:
    """Measurements of this model on these engines in casmoe/sim/trust/published/measurements.toml, with their
    boxes: what real runs reported, beside what the plan predicts."""
    folder = Path(__file__).resolve().parents[2] / "trust" / "published"
    rows, boxes = read_table(folder / "measurements.toml")["row"], read_table(folder / "boxes.toml")
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


__all__ = ["Comparison", "EnginePlan", "Plan", "PlanError", "PlanRequest", "box_of", "hf_id", "make_plan"]
