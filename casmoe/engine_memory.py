"""What an inference engine keeps on a GPU besides the model's weights, the KV cache and the
experts it holds, and how it lays out a sliding-window KV cache.

One definition, as data of each engine (casmoe/engines/memory.toml), used by both the simulator's
fit check (`casmoe.sim.cost.machine.Machine.free_bytes`, `Machine.kv_bytes`, through the run's
stack, which names its engine) and `casmoe plan`'s memory map: a placement the plan says fits is
one the simulator runs without overcommit, and the other way round.

- the reserve: llama.cpp's CUDA context, compute buffer of one ubatch and `--fit` margin;
  SGLang's (and so KTransformers') own `--mem-fraction-static` formula; vLLM's
  `1 - --gpu-memory-utilization` and activations; else the hardware profile's `reserved_gib`;
- where the token embedding table lives (llama.cpp keeps it on the CPU);
- how many cells a sliding-window layer's cache holds (llama.cpp: the window plus a ubatch,
  padded to 256; the paged engines: the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable
from casmoe.tables import read_table

GIB = 1024**3
MIB = 1024**2
RULES = Path(__file__).resolve().parent / "engines" / "memory.toml"
PROFILE = ""
"""The engine of a stack no engine lists: the hardware profile's `reserved_gib`, every weight on the GPUs."""


@cache
def rules() -> dict[str, Any]:
    return read_table(RULES)


@dataclass(frozen=True)
class EngineMemory:
    """One engine's memory habits (`engine` "" : the profile's reserve, nothing engine-specific)."""

    engine: str = PROFILE
    ubatch: int = 512

    @property
    def _rule(self) -> dict[str, Any]:
        return rules()["engine"].get(self.engine, {})

    @property
    def table_on_host(self) -> bool:
        """Whether the token embedding table stays in host RAM (llama.cpp's input layer)."""
        return bool(self._rule.get("table_on_host", False))

    @property
    def mmap(self) -> bool:
        """Whether the engine memory-maps the model, so that host weights beyond RAM are read from
        the drive as used (llama.cpp) instead of failing to load."""
        return bool(self._rule.get("mmap", False))

    def window_cells(self) -> Callable[[int], int] | None:
        """Cells a sliding-window layer keeps for a window of `w` tokens, when more than `w`
        (`ModelPreset.attended_tokens`); None: the window itself."""
        pad = self._rule.get("window_pad")
        if not pad:
            return None
        ub = self.ubatch
        return lambda window: -(-(window + ub) // pad) * pad

    def reserve(self, total: int, vocab: int, hidden: int, top_k: int, intermediate: int,
                profile_reserved_gib: float) -> tuple[int, str]:
        """The engine's own bytes on a GPU of `total` bytes, and how they were counted."""
        kind = self._rule.get("reserve", "")
        r = rules()
        ctx_gib = r["cuda"]["context_gib"]
        if kind == "llama.cpp":
            floats = self.ubatch * (vocab + 8 * hidden + 3 * top_k * intermediate)
            margin = int(self._rule["margin_mib"] * MIB)
            return int(ctx_gib * GIB) + 4 * floats + margin, (
                f"CUDA context {ctx_gib} GiB + compute buffer of a {self.ubatch}-token ubatch "
                f"({4 * floats / GIB:.2f} GiB, estimate) + llama.cpp's {self._rule['margin_mib']} MiB --fit margin")
        if kind == "sglang":
            res = sglang_reserve(total)
            return res, f"SGLang's own reserve ({res / GIB:.2f} GiB: --mem-fraction-static {sglang_mem_fraction(total)})"
        if kind == "vllm":
            util = self._rule["gpu_memory_utilization"]
            res = int(total * (1 - util) + self._rule["activation_gib"] * GIB)
            return res, f"1 - --gpu-memory-utilization {util} plus {self._rule['activation_gib']} GiB of activations"
        return int(profile_reserved_gib * GIB), (f"the profile's reserved_gib ({profile_reserved_gib:g} GiB: CUDA "
                                                 "context, activations, allocator slack)")


def sglang_reserve(total: int) -> int:
    """SGLang's reserved memory on a GPU of `total` bytes (memory.toml [engine.sglang])."""
    mib = total / MIB
    chunk = 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else 8192 if mib < 160 * 1024 else 16384
    graph_bs = 8 if mib < 20 * 1024 else 24 if mib < 35 * 1024 else 32 if mib < 60 * 1024 else 256 if mib < 160 * 1024 else 512
    reserve = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + 1 / 8 * 1024
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return int(reserve * MIB)


def sglang_mem_fraction(total: int) -> float:
    """SGLang's own --mem-fraction-static for a GPU of `total` bytes."""
    return round((total - sglang_reserve(total)) / total, 3)


def engine_of_stack(stack: str) -> str:
    """The engine whose memory habits a run on stack `stack` has ("" for none)."""
    for engine, rule in rules()["engine"].items():
        if stack in rule.get("stacks", ()):
            return engine
    return PROFILE


def of_stack(stack: str) -> EngineMemory:
    return EngineMemory(engine_of_stack(stack))


def of_engine(engine: str, ubatch: int | None = None) -> EngineMemory:
    """`engine` as `casmoe plan` names it (llama.cpp, ktransformers, vllm, sglang, casmoe)."""
    known = engine if engine in rules()["engine"] else PROFILE
    return EngineMemory(known, ubatch or int(rules()["engine"]["llama.cpp"]["ubatch"]))
