"""Software stacks: the costs a runtime pays that the hardware does not explain.

The same box runs Mixtral-8x7B at 0.3 tok/s under one runtime and 3 under another: Python
loops, framework dispatch, kernels far from the roofline, copies that block the compute or are
issued late. A *stack* is that runtime as data (STYLE principle 14, beside the hardware profiles
of `casmoe/sim/box/profiles/`): `casmoe/sim/cost/stacks/NAME.toml`, each number with the source it was read from, or
the published row it was fitted on (`fitted_on`, never a row it is then asked to predict).

What each field adds to a run (`Machine`, `casmoe.sim.cost.compute`, `casmoe.sim.passes.timing`):

- `step_us`: per forward pass (a decode token of the batch, or a prefill), on the compute
  thread: the Python loop, sampling, launching the graph;
- `launch_share`: the share of the profile's kernel-launch overheads (`layer_overhead_us`,
  `expert_overhead_us`: a launch per kernel from the host) the runtime pays: 1 launches each
  kernel from Python or C++ one by one; 0 replays a captured graph (CUDA graphs) with one
  kernel for all of a layer's routed experts (a grouped `mul_mat_id`, a fused MoE kernel), so
  launch gaps vanish and what a layer still costs is measured in `layer_us`;
- `layer_us`: per block of a pass (each MoE layer, each dense-only block and the LM head: the
  runtime's module calls), beyond the profile's launch overhead it pays;
- `expert_us`: per routed expert run on a GPU, beyond the profile's launch overhead it pays;
- `expert_loop_us`: per expert of each MoE layer a pass goes through, routed or not: runtimes
  whose MoE block walks every expert (HF transformers' `for expert_idx in range(self.num_experts)`
  with a `torch.where` on its mask, a device sync each), so a layer of 128 experts costs 16x
  one of 8;
- `host_expert_us`: per expert computed on the host (dispatch, hand-over, synchronisation);
- `copy_us`: compute-thread time per expert copy issued (building and queueing the copy);
- `copy_efficiency`: the share of the link's pinned rate the runtime's copies reach (pageable
  buffers, staging through a bounce buffer);
- `gpu_efficiency`: the share of GPU memory bandwidth its expert kernels reach, as a multiple
  of the profile's `mem_efficiency` (dequantising kernels of low-bit formats are slower);
- `host_efficiency`: the share of the host's peak DRAM bandwidth (and `host_flops_efficiency`:
  of its peak FLOPs) its host expert kernels reach; 0 takes the shared default that every
  stack without its own measurement uses (`casmoe/sim/cost/stacks/shared.toml`, fitted leaving each
  system's rows out in turn);
- `numa_aware`: host experts are read from the memory of the socket whose cores compute them
  (all sockets' bandwidth); otherwise one socket's bandwidth serves them;
- `prefetch_early`: the prefetches chosen before layer l+1 are issued once layer l's router has
  run (speculative loading from the current hidden state) instead of when layer l+1 starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.output import write_text
from casmoe.tables import read_table
from casmoe.userfile import read_toml

STACKS_DIR = Path(__file__).with_name("stacks")
SHARED_FILE = STACKS_DIR / "shared.toml"
DEFAULT_STACK = "ideal"
"""A runtime with no cost of its own: an upper bound, as the model was before stacks."""


class StackError(CasmoeError, ValueError):
    """An unknown stack name, or a stack file that is incomplete or inconsistent."""


@dataclass(frozen=True)
class Stack:
    """One runtime's costs (see the module docstring). Times in microseconds."""

    name: str
    description: str
    step_us: float = 0.0
    launch_share: float = 1.0
    layer_us: float = 0.0
    expert_us: float = 0.0
    expert_loop_us: float = 0.0
    host_expert_us: float = 0.0
    copy_us: float = 0.0
    copy_efficiency: float = 1.0
    gpu_efficiency: float = 1.0
    host_efficiency: float = 0.0
    host_flops_efficiency: float = 0.0
    numa_aware: bool = True
    prefetch_early: bool = False
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    fitted_on: dict[str, list[str]] = field(default_factory=dict, compare=False)
    """Field -> ids of the published rows it was fitted on (`casmoe/sim/trust/published/measurements.toml`)."""
    origin: str = field(default="", compare=False)
    """The user's file it was read from ("": shipped, or built in code)."""

    def costs(self) -> dict[str, Any]:
        """What the stack charges, by field: its identity (sources, fits and origin say where
        numbers came from, not what they are)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("name", "description", "sources", "fitted_on")}

    @property
    def shipped(self) -> bool:
        """Whether it charges what the shipped stack of its name charges (a user's copy with the
        same numbers is that stack; an edited one is not, whatever it is named)."""
        path = stack_paths().get(self.name)
        return path is not None and load_stack(self.name).resolved().costs() == self.resolved().costs()

    @property
    def upper_bound(self) -> bool:
        """A runtime that costs nothing beyond the hardware (the ideal stack, or any stack of
        those numbers): its figures are upper bounds, by what it charges, not by its name."""
        ideal = Stack("ideal", "", launch_share=0.0,
                      sources={n: "-" for n in (*self.numeric_fields(), "numa_aware", "prefetch_early")})
        mine, base = self.costs(), ideal.costs()
        return all(mine[k] == base[k] for k in base if k not in ("host_efficiency", "host_flops_efficiency",
                                                                  "numa_aware", "prefetch_early"))

    @property
    def label(self) -> str:
        """How a record names it: the shipped name, or the name and the user's file it came from
        when it charges something else (two stacks of one name in one run stay two)."""
        if not self.origin or self.shipped:
            return self.name
        return f"{self.name} ({Path(self.origin).name})"

    def __post_init__(self) -> None:
        numbers = self.numeric_fields()
        for n in numbers:
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise StackError(f"stack {self.name!r}: {n} must be a finite number >= 0, got {v!r}")
        if self.launch_share > 1:
            raise StackError(f"stack {self.name!r}: launch_share must be in [0, 1]")
        for n in ("copy_efficiency", "gpu_efficiency"):
            if not 0 < getattr(self, n) <= 1:
                raise StackError(f"stack {self.name!r}: {n} must be in (0, 1]")
        for n in ("host_efficiency", "host_flops_efficiency"):
            if getattr(self, n) > 1:
                raise StackError(f"stack {self.name!r}: {n} must be in [0, 1] (0: the shared default)")
        missing = [n for n in [*numbers, "numa_aware", "prefetch_early"] if not self.sources.get(n)]
        if missing:
            raise StackError(f"stack {self.name!r}: no source given for {', '.join(missing)} (add them to [sources])")
        unknown = sorted(set(self.sources) - set(numbers) - {"numa_aware", "prefetch_early"})
        if unknown:
            raise StackError(f"stack {self.name!r}: [sources] names unknown fields {unknown}")

    @classmethod
    def numeric_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.type in ("int", "float")]

    def resolved(self, shared: Shared | None = None) -> Stack:
        """This stack with the shared defaults in place of its zeros (host efficiencies); a
        resolved stack is itself (its values stay, whatever `shared` says)."""
        if self.host_efficiency and self.host_flops_efficiency:
            return self
        shared = shared or load_shared()
        values, sources = {}, {}
        for n in ("host_efficiency", "host_flops_efficiency"):
            if getattr(self, n) == 0:
                values[n] = getattr(shared, n)
                sources[n] = f"shared default: {shared.sources[n]}"
        return replace(self, **values, sources={**self.sources, **sources}) if values else self

    def to_dict(self) -> dict[str, Any]:
        """Every field a stack file holds (`origin` is where this one was read, not part of it)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "origin"}

    def to_toml(self) -> str:
        lines = [f"{f.name} = {json.dumps(getattr(self, f.name))}" for f in fields(self)
                 if f.name not in ("sources", "fitted_on", "origin")]
        lines += ["", "[sources]"] + [f"{k} = {json.dumps(v)}" for k, v in self.sources.items()]
        if self.fitted_on:
            lines += ["", "[fitted_on]"] + [f"{k} = {json.dumps(v)}" for k, v in self.fitted_on.items()]
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path) -> Path:
        return write_text(path, self.to_toml())

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str) -> Stack:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise StackError(f"{where}: unknown stack fields {unknown}; known: {sorted(known)}")
        for n in ("name", "description"):
            if not isinstance(raw.get(n), str):
                raise StackError(f"{where}: {n} must be a string")
        for n in ("numa_aware", "prefetch_early"):
            if n in raw and not isinstance(raw[n], bool):
                raise StackError(f"{where}: {n} must be true or false, got {raw[n]!r}")
        if "origin" in raw:
            raise StackError(f"{where}: unknown stack fields ['origin']; known: the fields `casmoe stacks --json` shows")
        for n in ("sources", "fitted_on"):
            if n in raw and not isinstance(raw[n], dict):
                raise StackError(f"{where}: [{n}] must be a table")
        if "launch_share" not in raw:  # a file of before the field: every launch paid, as then
            raw = {**raw, "launch_share": 1.0,
                   "sources": {**raw.get("sources", {}), "launch_share": LAUNCH_SHARE_DEFAULT}}
        values = {k: (float(v) if k in cls.numeric_fields() and isinstance(v, int) and not isinstance(v, bool) else v)
                  for k, v in raw.items()}
        try:
            return cls(**values)
        except StackError as exc:
            raise StackError(f"{where}: {_without_name(exc, raw)}") from None
        except TypeError as exc:
            raise StackError(f"{where}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> Stack:
        stack = cls.from_dict(read_toml(path, "stack file", StackError), str(path))
        shipped = stack_paths().get(stack.name)
        is_shipped = shipped is not None and Path(path).resolve() == shipped.resolve()
        return stack if is_shipped else replace(stack, origin=str(path))


LAUNCH_SHARE_DEFAULT = "1: not stated in the file, every kernel launch of the profile paid"


def _without_name(exc: Exception, raw: dict[str, Any]) -> str:
    """A stack's own message without "stack NAME: " (the file is named instead)."""
    return str(exc).removeprefix(f"stack {raw.get('name')!r}: ")


@dataclass(frozen=True)
class Shared:
    """The constants every stack without its own measurement takes (`casmoe/sim/cost/stacks/shared.toml`)."""

    host_efficiency: float
    host_flops_efficiency: float
    sources: dict[str, str] = field(default_factory=dict, compare=False)


def load_shared(path: Path = SHARED_FILE) -> Shared:
    st = path.stat()
    return _shared(str(path), st.st_mtime_ns)


@lru_cache(maxsize=4)
def _shared(path: str, mtime_ns: int) -> Shared:
    raw = read_table(path)
    return Shared(float(raw["host_efficiency"]), float(raw["host_flops_efficiency"]), dict(raw.get("sources", {})))


def stack_paths() -> dict[str, Path]:
    """Shipped stacks by name."""
    return {p.stem: p for p in sorted(STACKS_DIR.glob("*.toml")) if p.stem != "shared"}


def load_stack(spec: str | Path) -> Stack:
    """A shipped stack's name (`llama.cpp`) or the path of a user's TOML file."""
    shipped = stack_paths()
    text = str(spec)
    path = shipped.get(text, Path(text))
    if text in shipped or path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise StackError(f"stack file {path} not found")
        st = path.stat()
        return _stack_file(str(path.resolve()), st.st_mtime_ns, st.st_size)
    raise StackError(f"unknown stack {text!r}; shipped: {', '.join(shipped)}; or pass the path of your own TOML "
                     "file (see `casmoe stacks`)")


@lru_cache(maxsize=64)
def _stack_file(path: str, mtime_ns: int, size: int) -> Stack:
    """One parse per stack file and version (a grid names the same stack in many runs)."""
    return Stack.from_file(path)


def check_stack(text: str) -> Stack:
    """`--stack` as written, loaded (the run option's parser)."""
    return load_stack(text)
