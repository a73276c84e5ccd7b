"""Every run option, declared once: its type, default, help and whether it is an axis of a grid.

The command line's flags of simulate, sweep, search, leaderboard and replay
(`casmoe.cli.flags`), the keys of a sweep file and the keyword arguments of
`casmoe.sim.simulate` are all made from `OPTIONS`, so an option means the same everywhere and
fails with the same one-line message. `casmoe.sim.run.grid.Grid` holds the values given and builds
the runs. This module imports nothing heavy: `casmoe --help` reads it.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE


class GridError(CasmoeError, ValueError):
    """Options that do not make a run: an unknown key, a value of the wrong kind, none left."""


SHIPPED_REQUESTS = 12
"""Requests of the shipped default trace run when no trace is named (a few seconds)."""


@dataclass(frozen=True)
class Option:
    """One run option. `axis`: every value given is a point of the grid (the flag repeats);
    else one value. `alias`: the name earlier sweep files and the Python API used for it.
    `group` says which commands take it: `routing` (every command, replay too), `box`
    (commands that price time), `serving` (arrivals and batching)."""

    name: str
    kind: type
    help: str
    default: Any = None
    axis: bool = True
    alias: str = ""
    flags: tuple[str, ...] = ()
    minimum: float | None = None
    group: str = "routing"
    parser: str = ""
    """`module:function` that parses a text value (imported when used), so a malformed one
    fails where it is written, before any work; its result is not kept (the run parses it)."""

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")

    def check(self, value: Any, where: str) -> Any:
        """`value` as this option's kind (numpy numbers become Python ones), or a one-line error."""
        kind = self.kind
        if kind is bool:
            ok = isinstance(value, bool) or type(value).__name__ == "bool_"
            value = bool(value) if ok else value
        elif kind is int:
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            value = int(value) if ok else value
        elif kind is float:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
            value = float(value) if ok else value
        else:  # text options: a capacity may be written as a number of slots, a file as a path object
            if isinstance(value, os.PathLike) and not isinstance(value, str):
                value = os.fspath(value)
            ok = isinstance(value, str) or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                                            and self.name in _SLOTS)
            value = str(value) if ok else value
        if not ok:
            what = "a whole number of slots or a memory size such as '24GB'" if self.name in _SLOTS else _KINDS[kind]
            raise GridError(f"{where}: {self.name} = {value!r} is not {what}")
        if kind is str and not value.strip():  # no option means "the default" by an empty text
            default = f" (default: {self.default})" if self.default is not None else ""
            raise GridError(f"{where}: {self.name} is empty; give a value or leave it out{default}")
        if self.minimum is not None and value < self.minimum:
            raise GridError(f"{where}: {self.name} must be >= {self.minimum:g}, got {value}")
        if self.parser and isinstance(value, str):
            module, _, function = self.parser.partition(":")
            try:
                getattr(importlib.import_module(module), function)(value)
            except CasmoeError as exc:
                raise GridError(f"{where}: {exc}") from None
        return value


_KINDS = {str: "a string", int: "a whole number", float: "a finite number", bool: "true or false"}
_SLOTS = ("capacity", "global_capacity", "host_cache")
"""Text options that also take a plain number (slots, experts)."""

OPTIONS: tuple[Option, ...] = (
    Option("trace", str, f"Trace (.npz), repeatable; default: the shipped {DEFAULT_TRACE} (its first "
           f"{SHIPPED_REQUESTS} scored requests).", alias="traces"),
    Option("model", str, "Model preset (`casmoe presets`) or a GGUF file (its shapes and every tensor's bytes read from "
           "its header), repeatable; default: the trace's, else the one of its shape.", alias="models"),
    Option("quant", str, "Expert precision, repeatable: a name (bf16, fp8, int8, int4, nf4, q8_0, q4_k_m, q3_k_m, q2_k, "
           "mxfp4, hqq2, hqq3, ...), a width (4.5bpw), or trace (the trace's measured bytes per expert); default: "
           "trace, else the checkpoint's (`casmoe presets`).", alias="quants", parser="casmoe.options:parse_quant"),
    Option("dense_quant", str, "Precision of the dense part (attention, shared experts, routers, embeddings), "
           "repeatable; default: the checkpoint's (`casmoe presets`).", parser="casmoe.options:parse_quant"),
    Option("host_quant", str, "Precision of the experts computed on the host, repeatable; default: as --quant "
           "(llama.cpp PR #12511 runs GPU and host experts at different precisions).", parser="casmoe.options:parse_quant"),
    Option("stack", str, "Software stack, repeatable: the runtime's own costs (`casmoe stacks`: ideal, llama.cpp, "
           "ktransformers, mixtral-offloading, ...) or a TOML path; default: ideal, no runtime cost (an upper bound).",
           parser="casmoe.sim.cost.stack:check_stack", group="box"),
    Option("policy", str, "Policy, repeatable: NAME, NAME[key=value,...] (casmoe[predictor=noisy]) or "
           "package.module:Class; default: every policy, CasMoE with a planner fitted on the trace's train split "
           "(casmoe[planner=auto]) beside its oracle brackets.", alias="policies", parser="casmoe.policies.spec:parse_policy"),
    Option("planner", str, "A fitted planner folder: a bare `casmoe` policy runs with it.", axis=False),
    Option("capacity", str, "Cache per MoE layer in slots (4), of all GPUs in memory (6GB), or fit (the most the GPUs "
           "hold), repeatable; default: top_k, 2, 3 and 4 x top_k and the most that fits.", alias="capacities", parser="casmoe.options:capacity_text"),
    Option("global_capacity", str, "One pool for all layers: whole experts (60), memory (18GB) or fit, repeatable; "
           "placements (n-cpu-moe, ktransformers) take 0: every expert on the host.",
           alias="global_capacities", parser="casmoe.options:capacity_text"),
    Option("context", int, "Tokens of context each request is served at, repeatable: a request of n tokens "
           "continues a conversation of context - n earlier tokens (its attention reads them, its KV cache holds "
           "them); the KV cache of this context x the concurrency (--batch, --max-batch, --users) must fit the GPUs "
           "beside the dense part and the expert cache. Default: the trace's own request lengths.", minimum=1),
    Option("batch", int, "Requests whose decode tokens share a step, repeatable.", default=1, minimum=1),
    Option("prefill_batch", int, "Prompts prefilled together in one step (throughput-oriented serving, as "
           "MoE-Lightning batches them): their tokens share the step's expert work, the union of their experts per "
           "layer. Back to back: the prompts of each static --batch, at most --batch; served: up to N waiting "
           "prompts when no prompt is running (--schedule prefill-first). Default 1: each prompt alone.",
           default=1, axis=False, minimum=1),
    Option("miss_mode", str, "What a miss does, repeatable: load (stall), substitute (lossy) or cpu (computed on the "
           "host).", default="load", alias="miss_modes", parser="casmoe.options:parse_miss_mode"),
    Option("adaptive_gating", float, "AdapMoE's adaptive gating (lossy): a token whose top router weight is at least "
           "this share of its top-k weights runs that expert alone (0: every token one expert; above 1: no change). "
           "Default: off, the exact routing.", axis=False, minimum=0.0),
    Option("split", str, "Requests scored: heldout, train, all, or auto (all, unless a policy was fitted on some of "
           "them (a planner, static's profile): then only those it never saw).", default="auto", axis=False),
    Option("task", str, "Only requests of this task, repeatable.", axis=False, alias="tasks"),
    Option("span", str, "Only requests START:STOP of the trace (Python slice bounds, e.g. 0:100).", axis=False,
           alias="range", flags=("--span", "--range")),
    Option("requests", int, f"Only the first N selected requests (0: all); default: {SHIPPED_REQUESTS} of the "
           "shipped trace, else all.", axis=False, minimum=0),
    Option("hardware", str, "Hardware profile (`casmoe hardware list`) or TOML path, repeatable; variants: "
           "NAME@gpus=2,link=pcie5,host_ram_gib=64.", default="rtx4090x4", group="box"),
    Option("gpus", int, "GPUs in the box, repeatable: a variant of the profile with this many.", minimum=1,
           group="box"),
    Option("link", str, "Host-link generation, repeatable: pcie3, pcie4, pcie5 (casmoe/sim/box/links.toml); default: the "
           "profile's own.", alias="links", group="box"),
    Option("host_ram", float, "Host RAM in GiB, repeatable; default: the profile's.", minimum=0.0, group="box"),
    Option("cpu_threads", int, "Host threads the experts computed on the host run on, repeatable (llama.cpp -t, "
           "KTransformers --cpu_infer): FLOPs scale with the cores in use, bandwidth with the threads up to the "
           "sockets' (the profile's cpu_cores, cpu_thread_gbs); default: one per core.", minimum=1, group="box"),
    Option("numa", str, "Host weights per NUMA node, repeatable: copies (one copy on each socket, read at every "
           "socket's bandwidth: KTransformers' USE_NUMA=1) or one (a single copy, read at one socket's: llama.cpp's "
           "default); default: the stack's.", group="box", parser="casmoe.sim.cost.machine:parse_numa"),
    Option("devices", int, "GPUs the layers are split over, repeatable (0: every GPU of the box).", default=0,
           minimum=0, group="box"),
    Option("pinned", bool, "Copy from pinned host memory (--pageable: pageable).", default=True, axis=False,
           flags=("--pinned/--pageable",), group="box"),
    Option("host_cache", str, "RAM tier between storage and the GPUs, repeatable: memory (40GB), experts, or none; "
           "default: every expert in RAM if they fit the profile's host RAM less its reserve for the OS and "
           "runtime, else a RAM tier of all of that.", group="box", parser="casmoe.sim.passes.tiers:host_cache_text"),
    Option("host_policy", str, "Policy managing the RAM tier (any that does not read the future).", default="lru",
           axis=False, group="box", parser="casmoe.policies.spec:parse_policy"),
    Option("allow_overcommit", bool, "Simulate capacities, devices or RAM the box does not have (else refused).",
           default=False, axis=False, flags=("--allow-overcommit",), group="box"),
    Option("arrival", str, "Serve requests as they arrive: poisson (needs --rate) or trace (the trace's arrival "
           "times).", axis=False, group="serving"),
    Option("rate", float, "Poisson arrivals, requests per second, repeatable.", minimum=0.0, alias="rates",
           group="serving"),
    Option("users", int, "A closed loop of N users: each waits for its answer, thinks --think s, asks again.",
           axis=False, minimum=1, group="serving"),
    Option("think", float, "Closed loop: seconds between an answer and the next request.", default=0.0, axis=False,
           minimum=0.0, group="serving"),
    Option("max_batch", int, "Serving: most requests decoded together (continuous batching).", default=8, axis=False,
           minimum=1, group="serving"),
    Option("schedule", str, "Serving: prefill-first (a new prompt runs alone, first) or chunked (prompt chunks join "
           "decode steps).", default="prefill-first", axis=False, group="serving"),
    Option("chunk", int, "Serving, chunked: tokens per step (decode tokens + a prompt chunk).", default=512,
           axis=False, minimum=1, group="serving"),
    Option("seed", int, "Seed of the Poisson arrivals.", default=0, axis=False, group="serving"),
)
BY_NAME = {o.name: o for o in OPTIONS}
ALIASES = {o.alias: o.name for o in OPTIONS if o.alias}
