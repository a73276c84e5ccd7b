"""A `Grid` of run-option values, and the one function that builds runs from them.

A `Grid` holds the values given for the options of `casmoe.sim.run.options.OPTIONS` (from
flags, a sweep file, Python, or a file with flags on top); `Grid.specs` checks them once and
builds one `RunSpec` per combination of the axes, which every command then runs unchanged.

Adding an option: declare it in `run_options.OPTIONS`, give the value a field where the run
reads it (`RunSpec`, `Machine`, `Traffic`) and set it in `_Builder`, and use it there.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from casmoe.errors import CasmoeError
from casmoe.gating import check_threshold
from casmoe.options import FIT, CapacitySpec, parse_miss_mode, parse_quant
from casmoe.planner.cached import AUTO, cached_planner
from casmoe.policies import POLICIES, PolicySpec, parse_policies
from casmoe.presets import get_preset, preset_for, shape_preset
from casmoe.presets.gguf import read_gguf
from casmoe.selection import Scored, Selection
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.sim.box.hardware import HardwareProfile, load_profile, variant_spec
from casmoe.sim.cost.machine import Machine, parse_numa, presets_of_shape
from casmoe.sim.cost.stack import DEFAULT_STACK, Stack, load_stack
from casmoe.sim.passes.tiers import HostCache
from casmoe.sim.passes.traffic import Traffic
from casmoe.sim.run.fits import (
    MORE_GPUS,
    OVERCOMMIT,
    HostDemand,
    check_capacity,
    check_devices,
    check_kv,
    default_host_cache,
)
from casmoe.sim.run.options import ALIASES, BY_NAME, SHIPPED_REQUESTS, GridError
from casmoe.sim.run.runner import routing, whole_trace
from casmoe.sim.run.spec import RunSpec, TraceRef, file_digest
from casmoe.userfile import read_toml


@dataclass(frozen=True)
class Grid:
    """Option values as given: name -> the values (one for an option that is no axis).
    An option not given takes its declared default when the runs are built."""

    given: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    where: str = "options"

    @classmethod
    def of(cls, values: Mapping[str, Any], where: str = "options") -> Grid:
        """From a mapping of option names (or their aliases) to a value or a list of values;
        None means not given. Every value is checked against its option's declaration."""
        given: dict[str, tuple[Any, ...]] = {}
        for key, value in values.items():
            name = ALIASES.get(key, key)
            option = BY_NAME.get(name)
            if option is None:
                raise GridError(f"{where}: unknown option {key!r}; known: {', '.join(sorted(BY_NAME))}")
            if value is None:
                continue
            if name in given:
                raise GridError(f"{where}: {name} is given twice (as {key!r} and under another name)")
            many = isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0)
            items = list(value) if many else [value]
            if not items:  # not "the default": a list the caller meant to fill
                raise GridError(f"{where}: {name} is an empty list; give a value or leave it out")
            if many and not option.axis and name != "task":
                raise GridError(f"{where}: {name} takes one value, not a list")
            given[name] = tuple(option.check(v, where) for v in items)
        return cls(given, where)

    @classmethod
    def from_toml(cls, path: str | Path) -> Grid:
        """A sweep file: option names (or the older plural names: traces, policies,
        capacities, ...) as keys, a value or a list of values each; relative trace paths are
        read from the file's folder when they exist there."""
        raw = read_toml(path, "sweep file", GridError)
        grid = cls.of(raw, str(path))
        base = Path(path).parent
        traces = grid.given.get("trace")
        if traces:
            moved = tuple(str(base / t) if not Path(t).is_absolute() and (base / t).exists() else t for t in traces)
            grid = grid.with_values(trace=moved)
        return grid

    def with_flags(self, flags: Grid) -> Grid:
        """These values with the command line's on top: a flag given replaces the file's key."""
        return Grid({**self.given, **flags.given}, self.where if not flags.given else f"{self.where} and flags")

    def with_values(self, **values: Any) -> Grid:
        """A copy with these options given (None: back to not given)."""
        given = dict(self.given)
        for name, value in values.items():
            if value is None:
                given.pop(name, None)
            else:
                given[name] = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        return Grid(given, self.where)

    def values(self, name: str) -> tuple[Any, ...]:
        """The values of an axis: those given, else the default (or (None,))."""
        return self.given.get(name) or (BY_NAME[name].default,)

    def value(self, name: str) -> Any:
        """The one value of an option that is no axis (the last given), else its default."""
        given = self.given.get(name)
        return given[-1] if given else BY_NAME[name].default

    def specs(self, *, strict: bool = True, shape_ok: bool = False) -> Runs:
        """Check every value and build a `RunSpec` per combination of the axes. `strict`: a
        cache the box cannot hold is refused (simulate, the Python API); else its runs are
        recorded as skipped with the reason (sweeps). `shape_ok`: a trace of no known model is
        priced as its own shape (`shape_preset`: replay counts, it does not time)."""
        return _Builder(self, strict, shape_ok).build()


@dataclass
class Group:
    """The runs of one trace on one machine, described as `casmoe simulate` prints them."""

    trace: Path
    scored: Scored
    tokens: int
    machine: Machine
    fit: int

    def describe(self) -> str:
        return (f"{self.trace.name}: {self.scored.describe()}, {self.tokens} tokens, model {self.machine.preset.name} "
                f"on {self.machine.box()}; up to {self.fit} experts per layer fit in GPU memory")


@dataclass
class Runs:
    """What a grid builds: the specs in order, the ones refused before running (with why), what
    the user should know before reading results, and each (trace, machine) group."""

    specs: list[RunSpec]
    refused: dict[RunSpec, str]
    notes: list[str]
    groups: list[Group]

    def describe(self) -> list[str]:
        return [g.describe() for g in self.groups]


def default_capacities(fit: int, pool_fit: int, top_k: int, where: str) -> list[CapacitySpec]:
    """top_k, 2, 3 and 4 x top_k and the most that fits (slots per layer); on a box that holds
    fewer than top_k per layer, the most that fits (the rest of a layer's experts pass through
    staging slots) and the largest pool of whole experts."""
    if fit < top_k:
        if not pool_fit:
            raise GridError(
                f"{where} holds no expert beside the dense weights; use {MORE_GPUS}, a smaller --quant or "
                "--dense-quant, bigger hardware, a placement that computes experts on the host (--policy n-cpu-moe "
                "--global-capacity 0), or --allow-overcommit for a what-if"
            )
        return [*([CapacitySpec(str(fit))] if fit else []), CapacitySpec(str(pool_fit), per_layer=False)]
    sizes = sorted({top_k, *(s for s in (2 * top_k, 3 * top_k, 4 * top_k) if s < fit), fit})
    return [CapacitySpec(str(s)) for s in sizes]


class _Builder:
    """`Grid.specs`, step by step: each input is parsed and checked once, then combined."""

    def __init__(self, grid: Grid, strict: bool, shape_ok: bool) -> None:
        self.grid = grid
        self.strict = strict
        self.shape_ok = shape_ok
        self.notes: list[str] = []

    def note(self, text: str | None) -> None:
        if text and text not in self.notes:
            self.notes.append(text)

    def build(self) -> Runs:
        g = self.grid

        gating = g.value("adaptive_gating")
        gating = None if gating is None else check_threshold(gating)
        if gating is not None:
            self.note(f"adaptive gating: a token whose top router weight is >= {gating:g} of its top-k weights runs "
                      "that expert alone (lossy; its quality: casmoe bench --adaptive-gating)")
        named = g.given.get("trace")
        paths = [Path(t) for t in named] if named else [shipped(DEFAULT_TRACE)]
        requests = g.value("requests")
        if requests is None:
            requests = 0 if named else SHIPPED_REQUESTS
        selection = Selection.of(g.value("split"), g.given.get("task", ()), g.value("span"), requests)
        miss_modes = list(dict.fromkeys(parse_miss_mode(m) for m in g.values("miss_mode")))
        traffics = self._traffics()
        batches = list(dict.fromkeys(g.values("batch")))
        contexts = [c or 0 for c in dict.fromkeys(g.values("context"))]
        prefill_batch = g.value("prefill_batch")
        if all(t is None for t in traffics) and prefill_batch > min(batches):
            raise GridError(f"--prefill-batch {prefill_batch} prefills the prompts of a static batch together: give at "
                            f"most --batch ({min(batches)}), a larger --batch, or serve arrivals (--users, --arrival)")
        if any(t is not None for t in traffics) and batches != [1]:
            raise GridError("--batch makes static batches of back-to-back requests; with --arrival or --users use "
                            "--max-batch")
        specs: list[RunSpec] = []
        refused: dict[RunSpec, str] = {}
        groups: list[Group] = []
        for path in paths:
            if not path.exists():
                raise GridError(f"trace {path} not found")
            digest = file_digest(path)

            whole = whole_trace(str(path), digest)
            policies = self._policies(routing(str(path), digest, gating))
            scored = selection.resolve(whole, policies)
            ref = TraceRef(str(path), digest, () if scored.everything else scored.indices, scored.describe(), gating)
            tr = scored.pick(whole)
            longest = max((r.tokens for r in tr.requests), default=0)
            short = [c for c in contexts if 0 < c < longest]
            if short:
                raise GridError(f"--context {short[0]} is below the longest scored request of {path.name} "
                                f"({longest} tokens); give --context {longest} or more, or leave it out to serve "
                                "each request at its own length")
            for traffic in traffics:
                if traffic is not None:
                    traffic.arrival_times(tr.requests)  # --arrival trace on a trace without times fails here
            for machine, hardware in self._machines(whole):
                for mm in miss_modes:
                    if mm.value == "cpu":
                        machine.hardware.check_host_compute(hardware)
                nbytes = machine.expert_bytes(whole)
                # the most that fits beside the KV cache of the grid's longest context and most sequences (the
                # default capacities, `fit`); a capacity given is checked beside the dense weights, then beside
                # its own run's KV cache (`_kv_fits`), whose refusal names a context and a concurrency too
                kv = machine.kv_bytes(max(contexts) or longest, max(self._sequences(t, b)[0]
                                                                   for t in traffics for b in batches))
                fit, pool_fit = machine.max_slots(nbytes, kv), machine.max_pool_slots(nbytes, kv)
                beside_dense = machine.max_slots(nbytes), machine.max_pool_slots(nbytes)
                groups.append(Group(path, scored, tr.tokens, machine, fit))
                where = machine.box() if machine.hardware.host_only else f"{machine.hardware.name} x{machine.devices}" \
                    if machine.devices != machine.hardware.gpus else machine.hardware.name
                capacities = self._capacities(whole, fit, pool_fit, beside_dense, nbytes, where,
                                              bool(g.value("allow_overcommit")))
                for (cap, why), traffic, batch, context, mm, policy in itertools.product(
                    capacities.items(), traffics, batches, contexts, miss_modes, policies
                ):
                    if machine.hardware.host_only and dict(policy.options).get("gpu_prefill") is not None:
                        if any("gpu_prefill" in str(p) for p in g.given.get("policy", ())):
                            raise GridError(f"{policy.label}: gpu_prefill copies host experts to a GPU for long "
                                            f"prompts, and {machine.box()} has none; leave it out")
                        continue  # a variant of the policy's that needs a GPU: none on this box
                    sequences = self._sequences(traffic, batch)[0]
                    kv = float(sum(machine.kv_bytes(context or longest, sequences)))
                    held = policy.cls.held_on_gpus(whole.geometry, cap.resolve(nbytes))
                    for host_cache in self._host_caches(machine, whole, nbytes, HostDemand.of(machine, nbytes, held, kv)):
                        if why is None:
                            why = self._kv_fits(machine, nbytes, cap, context or longest, batch, traffic, where)
                        spec = RunSpec(ref, policy, cap, machine, hardware, batch, mm, traffic, host_cache,
                                       bool(g.value("allow_overcommit")), policy.label in scored.starred, context,
                                       prefill_batch if traffic is None else 1)
                        if why is not None:
                            refused[spec] = why
                        specs.append(spec)
        unique = list({s.key: s for s in specs}.values())  # a combination listed twice runs and reports once
        if not unique:
            raise GridError(f"{g.where}: no run to build")
        if "host_quant" in g.given and not any(s.policy.cls.computes_on_host(s.miss_mode) for s in unique):
            raise GridError(f"{g.where}: --host-quant is unused: it is the precision of the experts computed on the "
                            "host, and no run computes one there; leave it out, or add a placement (n-cpu-moe, "
                            "ktransformers, ...) or --miss-mode cpu")
        if "host_policy" in g.given and all(s.host_cache is None for s in unique):
            raise GridError(f"{g.where}: --host-policy {g.value('host_policy')} is unused: it manages the RAM tier, "
                            "and no run has one (--host-cache none, or every expert fits the host RAM); leave it out "
                            "or give --host-cache SIZE")
        return Runs(unique, refused, self.notes, groups)

    def _traffics(self) -> list[Traffic | None]:
        g = self.grid
        common = dict(think=g.value("think"), max_batch=g.value("max_batch"), schedule=g.value("schedule"),
                      chunk=g.value("chunk"), seed=g.value("seed"), prefill_batch=g.value("prefill_batch"))
        return [Traffic.from_options(g.value("arrival"), rate, g.value("users"), **common) for rate in g.values("rate")]

    def _policies(self, routed: Any) -> list[PolicySpec]:
        """The policies given (a bare `casmoe` with --planner, else CasMoE's variants), or every
        policy; `casmoe[planner=auto]` is fitted here, once, so that parallel runs read it."""
        g = self.grid
        planner = g.value("planner")
        specs = parse_policies(g.given.get("policy"), POLICIES, planner=planner)
        if planner is not None and not any(dict(s.options).get("planner") == planner for s in specs):
            raise GridError(f"{g.where}: --planner {planner} is unused: it is the planner of a bare `casmoe` policy, "
                            "and none is run; add --policy casmoe, or name it in the policy: casmoe[planner=DIR]")

        out = []
        for spec in specs:
            if dict(spec.options).get("planner") == AUTO:
                fitted = cached_planner(routed)
                if fitted is None:
                    if g.given.get("policy"):
                        raise GridError("casmoe[planner=auto] fits a planner on the trace's prompts, and this trace "
                                        "has none; fit one on a trace with prompts (casmoe planner fit) and give "
                                        "casmoe[planner=DIR]")
                    continue
                self.note(fitted.describe())
            out.append(spec)
        return out

    def _machines(self, whole: Any) -> Iterable[tuple[Machine, str]]:
        """Each model x hardware variant x devices x precision, checked."""
        g = self.grid
        overcommit = bool(g.value("allow_overcommit"))
        axes = ("model", "hardware", "gpus", "link", "host_ram", "cpu_threads", "devices", "quant", "dense_quant",
                "host_quant", "stack", "numa")
        for (model, hw_name, gpus, link, ram, threads, devices, quant, dense_quant, host_quant,
             stack, numa) in itertools.product(*(g.values(a) for a in axes)):
            weights = None
            if model is not None and str(model).lower().endswith(".gguf"):  # the user's own file: its bytes
                file_preset, weights = read_gguf(model)
            name = None if weights is not None else preset_for(whole, model)
            if name is None and weights is None and not self.shape_ok:
                fits = ", ".join(presets_of_shape(whole.geometry)) or "none"
                raise GridError(f"no model preset has the shape of the trace ({whole.geometry.describe()}; presets "
                                f"of its layers and experts: {fits}); pass --model, or add a preset to "
                                "casmoe/presets/models.toml")
            preset = file_preset if weights is not None else shape_preset(whole.geometry) if name is None \
                else get_preset(name)
            spec = variant_spec(hw_name, link or "", ram, gpus, threads)
            hw: HardwareProfile = load_profile(spec)
            n = devices or max(1, min(hw.gpus, whole.geometry.layers))  # every GPU, one layer each; a GPU-less box: its host
            check_devices(hw, n, overcommit)
            runtime = stack if isinstance(stack, Stack) else load_stack(stack or DEFAULT_STACK).resolved()
            machine = Machine(preset, hw, n, parse_quant(quant), bool(g.value("pinned")), parse_quant(dense_quant),
                              parse_quant(host_quant), runtime, parse_numa(numa), weights)
            machine.check_geometry(whole.geometry)
            yield machine, spec

    def _capacities(self, whole: Any, fit: int, pool_fit: int, beside_dense: tuple[int, int], nbytes: Sequence[int],
                    where: str, overcommit: bool) -> dict[CapacitySpec, str | None]:
        """Capacity -> None, or why the box cannot hold it (refused when strict). `fit` and
        `pool_fit` count the KV cache too (defaults, `fit`); `beside_dense` does not (the
        slots per layer and whole experts of a pool the GPUs hold beside the dense weights)."""
        g = self.grid
        geo = whole.geometry
        def spec(text: str, per_layer: bool) -> CapacitySpec:
            if text.strip().lower() == FIT:  # the most the box holds
                return CapacitySpec(str(fit if per_layer else pool_fit), per_layer)
            return CapacitySpec(text, per_layer)

        given = [spec(c, True) for c in g.given.get("capacity", ())]
        given += [spec(c, False) for c in g.given.get("global_capacity", ())]
        if not given:
            return dict.fromkeys(default_capacities(fit, pool_fit, geo.top_k, where))
        out: dict[CapacitySpec, str | None] = {}
        for c in given:
            try:
                self.note(check_capacity(c.resolve(nbytes), *beside_dense, geo.experts, geo.layers, c.label, where,
                                         overcommit))
                out[c] = None
            except CasmoeError as exc:
                if self.strict:
                    raise
                out[c] = str(exc)
        return out

    @staticmethod
    def _sequences(traffic: Traffic | None, batch: int) -> tuple[int, str]:
        """Requests whose KV cache the run holds at once, and the flag that sets it."""
        return (batch, "--batch") if traffic is None else traffic.sequences

    def _kv_fits(self, machine: Machine, nbytes: Sequence[int], cap: CapacitySpec, context: int, batch: int,
                 traffic: Traffic | None, where: str) -> str | None:
        """None when the KV cache of `context` tokens times the run's concurrency (the static
        batch, or the requests the server runs at once) fits beside the dense part and the
        cache `cap`; else why not (refused when strict)."""
        sequences, flag = self._sequences(traffic, batch)
        try:
            self.note(check_kv(machine, nbytes, cap.resolve(nbytes), cap.label, context, sequences, flag, where,
                               bool(self.grid.value("allow_overcommit"))))
        except CasmoeError as exc:
            if self.strict:
                raise
            return str(exc)
        return None

    def _host_caches(self, machine: Machine, whole: Any, nbytes: Sequence[int],
                     demand: HostDemand) -> list[HostCache | None]:
        """The RAM tiers of a run whose host RAM must hold `demand`: each --host-cache given, or
        by default none when it fits and a tier of what the RAM has left when it does not."""
        g = self.grid
        out: list[HostCache | None] = []
        tier, note = default_host_cache(machine, demand, bool(g.value("allow_overcommit")))
        for text in g.values("host_cache"):
            if text is None:
                text = tier
                self.note(note)
            if text is None or str(text).strip().lower() == "none":
                if text is not None and tier is not None:  # every expert in RAM, on a box whose RAM is smaller
                    short = demand.shortfall(machine)
                    raise GridError(f"--host-cache none keeps every expert in host RAM, but {short}; give "
                                    f"--host-cache {tier} (the default) or {OVERCOMMIT} for a what-if")
                out.append(None)
                continue
            tier = HostCache.parse(text, g.value("host_policy"), nbytes)
            tier.build(whole.geometry, nbytes, machine.hardware, whole)  # a RAM tier that cannot work fails here
            out.append(tier)
        return list(dict.fromkeys(out))
