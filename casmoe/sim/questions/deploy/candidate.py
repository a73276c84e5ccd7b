"""One configuration of one engine (`Candidate`), what it is built from (`Context`) and how fast it
is expected to run (`Speed`).

A candidate is one object: the placement and its memory map, the command line and the steps that
make what it loads, the run options it is simulated with (`sim`) and so the `casmoe simulate`
line that gives its figure again (`reproduce`), and, once simulated, its speed. The plan prints,
writes to plan.json and to a script, and ranks the same object.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from casmoe.precision import Precision
from casmoe.presets import ModelPreset
from casmoe.presets.weights import FileWeights
from casmoe.sim.box.hardware import HardwareProfile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.cost.stack import StackError, load_stack
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy.placement import Placement
from casmoe.sim.questions.deploy.quality import Quality, quality
from casmoe.sim.questions.deploy.routing import Routing
from casmoe.sim.run.options import BY_NAME

NOT_VALIDATED = "uncertainty: not yet validated for this stack"


def rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


@dataclass(frozen=True)
class Speed:
    """Expected tokens/s at the plan's context and how they were obtained."""

    decode: float | None
    prefill: float | None = None
    band: tuple[float, float] | None = None  # decode tokens/s: the error model's 80% interval
    uncertainty: str = NOT_VALIDATED
    how: str = ""
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"decode_tok_s": rounded(self.decode), "prefill_tok_s": rounded(self.prefill),
                "decode_band_tok_s": None if self.band is None else [rounded(b) for b in self.band],
                "uncertainty": self.uncertainty, "how": self.how, "evidence": self.evidence}


def reproduce(values: dict[str, Any]) -> str:
    """The `casmoe simulate` line of these run options: every option, the stack included, so that
    running it gives the figure printed beside it."""
    parts = ["casmoe simulate"]
    for name, value in values.items():
        if value is None or name.startswith("_"):
            continue
        option = BY_NAME[name]
        if option.kind is bool:
            if value != option.default:
                parts.append(option.flags[0].split("/")[0 if value else 1] if option.flags else option.flag)
            continue
        parts += [option.flag, shlex.quote(str(value))]
    return " ".join(parts)


@dataclass
class Candidate:
    """One configuration of one engine: its precision, placement and memory map, the command
    that runs it and the steps that make what it loads, the files it needs, and (once simulated)
    its speed. `sim` holds its run options (None: a closed form, `closed_form`)."""

    engine: str
    label: str
    placement: Placement
    command: eng.Command
    precisions: mem.Precisions
    quality: Quality
    prepare: tuple[eng.Command, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # file name -> what it holds
    notes: list[str] = field(default_factory=list)
    sim: dict[str, Any] | None = None
    closed_form: float | None = None
    minimum: str = ""  # the engine version it needs ('' : no check)
    minimum_why: str = ""
    speed: Speed | None = None
    key: str = ""
    above_floor: bool = True

    @property
    def fits(self) -> bool:
        return self.placement.memory.fits

    @property
    def precision_name(self) -> str:
        """'q4_k_m', or 'bf16 / q4_k_m' (the GPUs' experts / the host's)."""
        p = self.precisions
        return p.gpu.name if p.gpu == p.host else f"{p.gpu.name} / {p.host.name}"

    @property
    def reproduce(self) -> str:
        return reproduce(self.sim) if self.sim is not None else ""

    def to_dict(self) -> dict[str, Any]:
        pl = self.placement
        layers = len(pl.memory.gpu_expert_bytes) or 1 + max((g.layers[-1] for g in pl.memory.gpus if g.layers), default=-1)
        return {"engine": self.engine, "label": self.label, "fits": self.fits, "rule": pl.rule, "unit": pl.unit,
                "precision": self.precisions.describe(), "precision_name": self.precision_name,
                "quality": self.quality.to_dict(),
                "above_quality_floor": self.above_floor,
                "gpu_experts": pl.count, "gpu_layers": pl.gpu_layers(), "experts_per_layer": pl.experts_per_layer,
                "gpu_experts_by_layer": pl.by_layer(layers),
                "command": self.command.text(), "argv": self.command.argv(),
                "prepare": [c.text() for c in self.prepare], "files": self.files, "notes": self.notes,
                "minimum_version": self.minimum, "minimum_why": self.minimum_why,
                "memory": pl.memory.to_dict(), "speed": None if self.speed is None else self.speed.to_dict(),
                "simulated_policy": None if self.sim is None else self.sim.get("policy"),
                "stack": None if self.sim is None else self.sim.get("stack"),
                "reproduce": self.reproduce, "key": self.key}

    def row(self) -> dict[str, Any]:
        """A flat record (candidates.csv, the printed table)."""
        s = self.speed or Speed(None)
        t = self.placement.memory.totals()
        return {"engine": self.engine, "configuration": self.label, "precision": self.precision_name,
                "fits": self.fits, "gpu_experts": self.placement.count, "gpu_gib": t["gpu_used_gib"],
                "host_gib": t["host_used_gib"], "decode_tok_s": rounded(s.decode), "prefill_tok_s": rounded(s.prefill),
                "band": "" if s.band is None else f"{s.band[0]:.3g}-{s.band[1]:.3g}", "how": s.how, "key": self.key}


@dataclass
class Context:
    """What every engine's candidates are built from: the request, the model (`preset`, and
    `file` when it is the user's GGUF), the box, the routing and its placement orders."""

    req: Any  # PlanRequest
    preset: ModelPreset
    profile: HardwareProfile
    box: mem.Box
    routing: Routing
    shares: Any
    orders: dict[str, list[int]]
    out: Path
    family: str
    model_option: str  # the simulator's `model`: the preset's name, or the GGUF's path
    hf: str  # the Hugging Face id of the checkpoint ('' : not known)
    file: FileWeights | None = None
    weights: str = ""  # what the user said the engines load
    families: tuple[str, ...] = ()  # what casmoe's backend adapts
    hardware: str = ""  # the simulator's hardware spec (threads as a variant)
    floor: float | None = None
    released: Precision | None = None  # the precision the model's experts were released at
    gguf: str = ""  # the user's GGUF file (absolute), which llama.cpp and kt-kernel's LLAMAFILE load

    def quality(self, precision: Precision) -> Quality:
        return quality(precision, self.preset, self.released)

    @property
    def L(self) -> int:
        return self.preset.geometry.layers

    @property
    def E(self) -> int:
        return self.preset.geometry.experts

    @property
    def threads(self) -> int:
        return self.req.threads or self.profile.cpu_cores

    @property
    def numa_nodes(self) -> int:
        return self.box.numa_nodes

    def machine(self, stack: str, prec: mem.Precisions | None, devices: int | None = None):
        """The model at `prec` (or the file's bytes) on this box under `stack`, one device per GPU:
        what the memory map reads its sizes from (the simulator's own functions)."""
        try:
            runtime = load_stack(stack).resolved()
        except StackError:  # an engine with no fitted stack (SGLang): its memory habits only, never simulated
            runtime = replace(load_stack("ideal").resolved(), name=stack)
        quant = host = None
        if self.file is None and prec is not None:
            quant = prec.gpu
            host = prec.host if prec.host != prec.gpu else None
        return Machine(self.preset, self.profile, devices or max(1, self.box.gpus), quant, True, None, host,
                       runtime, None, self.file)

    def sim(self, engine: str, stack: str, placement: Placement, prec: mem.Precisions,
            policy: str | None = None, capacity: str | None = None, hardware: str | None = None) -> dict[str, Any]:
        """Run options of a simulation of `placement` on `stack` (`global_capacity` = its GPU
        experts), at the plan's context and concurrency, on the routing's held-out requests."""
        count = placement.count
        if policy is None:
            policy = placement.policy(self.L, self.req.concurrency)
            if self.box.gpus and count < self.preset.geometry.top_k:
                policy, count = f"n-cpu-moe[n={self.L}]", 0
        values: dict[str, Any] = {"trace": str(self.routing.path), "model": self.model_option}
        if self.file is None:
            values["quant"] = prec.gpu.name
            if prec.host != prec.gpu:
                values["host_quant"] = prec.host.name
        values.update({"hardware": hardware or self.hardware, "stack": stack, "policy": policy,
                       "batch": self.req.concurrency, "context": self.req.context, "requests": self.req.requests,
                       "split": "heldout", "devices": 1 if self.box.gpus else 0})
        if capacity is not None:
            values["capacity"] = capacity
        else:
            values["global_capacity"] = str(count)
        values["_engine"] = engine
        return values
