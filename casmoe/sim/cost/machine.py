"""`Machine`: what prices a token, the model at its precisions on a box under a software stack.

A run's timing depends on the model preset (its shapes and structure: attention type, KV bytes,
dense-only blocks), the precision of each part (the experts that move or sit on the GPUs, the
experts computed on the host, the dense part), the hardware profile and how many of its GPUs
the layers are split over, whether copies come from pinned memory, and the software stack (the
runtime's own costs, `casmoe.sim.cost.stack`). Those travel together as one value, so every driver
(the offline engine, the serving processes, calibration and validation) reads them from one
place, and a new part of the machine is a field here and its use in `compute`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Sequence

from casmoe import engine_memory
from casmoe.cache import Capacity
from casmoe.engine_memory import EngineMemory
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, split_layers
from casmoe.precision import Precision, ggml_types, parse_precision
from casmoe.presets import ModelPreset, load_presets
from casmoe.report import human_bytes
from casmoe.sim.box.hardware import GIB, HardwareProfile
from casmoe.sim.cost.stack import DEFAULT_STACK, Stack, load_stack

if TYPE_CHECKING:
    from casmoe.presets.weights import FileWeights
    from casmoe.sim.cost.compute import RooflineCompute
    from casmoe.trace import Trace


class SimConfigError(CasmoeError, ValueError):
    """A simulation that cannot be set up as asked (geometry mismatch, too many devices...)."""


@dataclass(frozen=True)
class GpuResident:
    """Bytes one GPU holds besides the KV cache and the experts (`Machine.gpu_resident`), and
    how its engine's reserve was counted."""

    reserve: float
    dense: float
    embeddings: float
    how: str = ""

    @property
    def total(self) -> float:
        return self.reserve + self.dense + self.embeddings


def _default_stack() -> Stack:
    return load_stack(DEFAULT_STACK)


def _kernel(named: Precision, types: Sequence[str]) -> Precision:
    """The precision whose kernel multiplies tensors stored as the ggml `types`: `named`, unless
    it names no integer kernel while every type of the mix has one (a Q4_K_M file's dense part,
    Q4_K and Q6_K, named only by its width): then its first type stands for the mix (only the
    kernel is read from it; the bytes come from the file)."""
    if named.int_dot:
        return named
    known = ggml_types()
    kinds = [known.get(t) for t in types]
    if kinds and all(k is not None and k.int_dot for k in kinds):
        return kinds[0]
    return named


@dataclass(frozen=True)
class Machine:
    """A model preset priced on `devices` GPUs of a hardware profile under a software stack.

    Precisions (None: the default): `quant`, the experts on the GPUs and the copies (default:
    the trace's measured bytes when it was recorded from this model's width, else the
    checkpoint's native precision); `host_quant`, the experts computed on the host (default: as
    `quant`); `dense_quant`, attention, shared experts, routers and embeddings (default: the
    checkpoint's). `weights`, the bytes a GGUF file stores part by part (`casmoe.presets.gguf`),
    replaces every estimate from precisions: the file is the truth."""

    preset: ModelPreset
    hardware: HardwareProfile
    devices: int = 1
    quant: Precision | None = None
    pinned: bool = True
    dense_quant: Precision | None = None
    host_quant: Precision | None = None
    stack: Stack = field(default_factory=_default_stack)
    numa: bool | None = None  # one copy of the host weights per NUMA node (None: the stack's own habit)
    weights: FileWeights | None = None

    def __post_init__(self) -> None:
        w = self.weights
        if w is not None:
            if self.quant is not None or self.dense_quant is not None:
                raise SimConfigError(f"{w.path} states every tensor's type: leave --quant and --dense-quant out")
            if w.layers != self.preset.geometry.layers:
                raise SimConfigError(f"{w.path} has {w.layers} MoE layers, the preset {self.preset.name} "
                                     f"{self.preset.geometry.layers}")

    def content(self) -> dict[str, Any]:
        """What a result depends on of this machine, as JSON-able data, for `RunSpec.key`: every
        field, read by field so that a new one is keyed without another edit (sources and fit
        records say where numbers came from, not what they are, and are left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "preset":
                out["preset"] = asdict(value)
            elif f.name == "hardware":
                out["profile"] = {k: v for k, v in value.to_dict().items() if k != "sources"}
            elif f.name == "stack":
                out["stack"] = {"name": value.name, **value.costs()}
            elif f.name == "weights" and value is not None:
                out["weights"] = {k: v for k, v in value.to_dict().items() if k not in ("path", "parts")}
            elif isinstance(value, Precision):
                out.setdefault("precisions", {})[f.name] = value.to_dict()
            elif value is not None or f.name in ("quant", "dense_quant", "host_quant"):
                out[f.name] = value
        return out

    def check_geometry(self, trace: Geometry) -> None:
        """The trace's layers and experts must be the preset's; the error names presets that fit.

        `top_k` may differ: the trace says which experts run (an engine can force fewer than the
        model's native k, as the shared real Qwen trace does); the preset prices them."""
        g = self.preset.geometry
        if (trace.layers, trace.experts) == (g.layers, g.experts):
            return
        fits = presets_of_shape(trace)
        hint = (
            f"pass --model {' or --model '.join(fits)}"
            if fits
            else "add a preset with that shape to casmoe/presets/models.toml, or record a trace of this model"
        )
        raise SimConfigError(
            f"trace geometry ({trace.describe()}) does not match model preset {self.preset.name!r} ({g.describe()}); "
            f"{hint}"
        )

    def measured_bytes(self, trace: Geometry) -> bool:
        """Whether experts are priced at the trace's measured bytes: no precision forced, and
        the trace recorded from this model's width (the shipped tiny models route like Mixtral
        but are priced as the preset being simulated)."""
        return (self.quant is None and self.weights is None and bool(trace.layer_expert_bytes)
                and trace.hidden in (0, self.preset.geometry.hidden))

    def expert_bytes(self, trace: Trace) -> list[int]:
        """Bytes per expert per layer on the GPUs: the file's (`weights`), the trace's measured
        ones (`measured_bytes`), else the preset's at the experts' precision."""
        if self.weights is not None:
            return list(self.weights.expert)
        g = trace.geometry
        if self.measured_bytes(g):
            if min(g.layer_expert_bytes) <= 0:
                raise SimConfigError(
                    f"the trace records 0 bytes for the experts of layer {g.layer_expert_bytes.index(0)}; pass --quant "
                    f"(bf16, int8, ...) to price experts from the {self.preset.name} preset instead"
                )
            return list(g.layer_expert_bytes)
        return self.preset.expert_bytes_per_layer(self.quant)

    def host_expert_bytes(self, expert_bytes: Sequence[int]) -> list[int]:
        """Bytes per host-computed expert per layer: at `host_quant`, else as on the GPUs."""
        return list(expert_bytes) if self.host_quant is None else self.preset.expert_bytes_per_layer(self.host_quant)

    def precision_label(self, trace: Geometry) -> str:
        """The experts' precision as a record names it: the forced one, `trace` (measured), or
        the checkpoint's."""
        if self.weights is not None:
            return self.weights.precision_name()
        if self.quant is not None:
            return self.quant.name
        return "trace" if self.measured_bytes(trace) else self.preset.expert_precision.name

    @property
    def dense_precision(self) -> Precision:
        """The dense part's precision: a llama.cpp file type's dense type (a GGUF quantises every
        tensor; `file_type`), else `dense_quant`, else the checkpoint's."""
        file_type = self.file_type
        if file_type is not None:
            return file_type.dense.fitted(self.preset.geometry.hidden)
        return self.dense_quant or self.preset.dense_precision

    @property
    def file_type(self) -> Precision | None:
        """The llama.cpp file type the non-expert tensors follow: `dense_quant` when it is one
        (experts of their own type, as gpt-oss's MXFP4 experts in a Q4_K_M file), else the
        experts' when no dense precision is named; None for a checkpoint's formats."""
        if self.dense_quant is not None:
            return self.dense_quant if self.dense_quant.is_file_type else None
        return self.quant if self.quant is not None and self.quant.is_file_type else None

    @property
    def head_precision(self) -> Precision:
        """The LM head's precision: a llama.cpp file type's output type (moved to its fallback
        when the model's width is not whole blocks, as llama.cpp does), else the dense part's."""
        file_type = self.file_type
        if file_type is not None:
            return file_type.head.fitted(self.preset.geometry.hidden)
        return self.dense_precision

    def head_bytes(self) -> float:
        """Bytes of the LM head (read whole by every forward pass)."""
        if self.weights is not None:
            return float(self.weights.head)
        return self.head_precision.param_bytes(self.preset.vocab * self.preset.geometry.hidden)

    def table_bytes(self) -> float:
        """Bytes of the token embedding table (the head itself when tied)."""
        if self.weights is not None:
            return float(self.weights.embedding)
        return self.dense_precision.param_bytes(self.preset.head_params)

    def host_weight_bytes(self) -> float:
        """Bytes of every weight but the routed experts: the dense part of every block, the
        embedding table and the LM head (one matrix when tied), at their precisions. A box
        without a GPU holds them in host RAM beside the experts (`fits.HostDemand`)."""
        preset = self.preset
        head = 0 if preset.tie_embeddings else self.head_bytes()
        if self.weights is not None:
            w = self.weights
            return float(sum(w.dense) + sum(w.dense_blocks) + w.other) + self.table_bytes() + head
        return self.dense_precision.param_bytes(preset.dense_params()) + self.table_bytes() + head

    def dense_weight_bytes(self, blocks: int) -> float:
        """Bytes of the dense part of `blocks` MoE blocks on a GPU: the file's average block, or
        the dense precision's."""
        if self.weights is not None:
            return sum(self.weights.dense) / len(self.weights.dense) * blocks
        return self.dense_precision.bits / 8 * self.preset.dense_params_per_layer * blocks

    def dense_block_bytes(self) -> float:
        """Bytes of one dense-only block (DeepSeek's first blocks): the file's average, or the
        dense precision's (0: the model has none)."""
        preset = self.preset
        if not preset.dense_layers:
            return 0.0
        if self.weights is not None and self.weights.dense_blocks:
            return sum(self.weights.dense_blocks) / len(self.weights.dense_blocks)
        return self.dense_precision.bits / 8 * preset.dense_layer_params

    @property
    def memory(self) -> EngineMemory:
        """What the run's engine keeps on a GPU besides the model and how it lays out its KV cache
        (`casmoe.engine_memory`, named by the stack): the one definition the plan's map reads too."""
        return engine_memory.of_stack(self.stack.name)

    def gpu_resident(self, device: int, layers: Sequence[int], total: float | None = None) -> GpuResident:
        """What one GPU of `total` bytes (default: the profile's memory) holds besides the KV cache
        and the experts: the engine's reserve, the dense part of its `layers` (MoE layers; the
        first device also runs the dense-only blocks), the token embedding table on the first
        device unless the engine keeps it on the host, the LM head on the last (one matrix with
        the table when tied)."""
        preset, g = self.preset, self.preset.geometry
        total = self.hardware.memory_gib * GIB if total is None else total
        mem = self.memory
        reserve, how = mem.reserve(int(total), preset.vocab, g.hidden, g.top_k, g.intermediate,
                                   self.hardware.reserved_gib)
        first, last = device == 0, device == self.devices - 1
        dense = self.dense_weight_bytes(len(layers)) + (self.dense_block_bytes() * preset.dense_layers if first else 0.0)
        table = self.table_bytes() if first and not mem.table_on_host else 0.0
        head = 0.0
        if last and not (preset.tie_embeddings and table):  # tied: the table is the head
            head = self.table_bytes() if preset.tie_embeddings else self.head_bytes()
        return GpuResident(float(reserve), dense, table + head, how)

    def free_bytes(self, device: int, layers: range) -> float:
        """Bytes of one GPU left for expert slots and the KV cache: its memory less what
        `gpu_resident` puts there (none on a box without a GPU: its one device is the host,
        which holds no slots)."""
        if self.hardware.host_only:
            return 0.0
        return self.hardware.memory_gib * GIB - self.gpu_resident(device, layers).total

    def max_slots(self, expert_bytes: Sequence[int], reserved: Sequence[float] = ()) -> int:
        """Most slots per layer the GPUs hold next to the dense weights (capped at all experts),
        and next to `reserved` bytes per device when given (the KV cache, `kv_bytes`)."""
        best = self.preset.geometry.experts
        for d, layers in enumerate(split_layers(self.preset.geometry.layers, self.devices)):
            free = self.free_bytes(d, layers) - (reserved[d] if reserved else 0.0)
            per_slot = sum(expert_bytes[layer] for layer in layers)
            if per_slot > 0:  # experts of no known size (a shape without a width) take no memory
                best = min(best, max(0, int(free // per_slot)))
        return best

    def max_pool_slots(self, expert_bytes: Sequence[int], reserved: Sequence[float] = ()) -> int:
        """Most whole experts one pool of all layers holds on the GPUs beside the dense weights
        (each device its share, an expert of its layers' average size), and beside `reserved`
        bytes per device when given (the KV cache); at most every expert."""
        g = self.preset.geometry
        total = 0
        for d, layers in enumerate(split_layers(g.layers, self.devices)):
            free = self.free_bytes(d, layers) - (reserved[d] if reserved else 0.0)
            mean = sum(expert_bytes[layer] for layer in layers) / len(layers)
            total += g.experts * len(layers) if mean <= 0 else max(0, int(free // mean))
        return min(total, g.total_experts)

    def slot_bytes(self, expert_bytes: Sequence[int], capacity: Capacity) -> list[float]:
        """Bytes each GPU spends on the expert cache `capacity`: per layer, its slots times its
        layers' expert sizes; a global pool, each device the share of whole experts the run
        gives it (`assembly.Setup._share`: in proportion to its layers), of its layers' average size."""
        g = self.preset.geometry
        cap = capacity.clamped(g)
        out = []
        for layers in split_layers(g.layers, self.devices):
            per_layer = sum(expert_bytes[layer] for layer in layers)
            share = cap.slots if self.devices == 1 else cap.slots * len(layers) // g.layers
            out.append(float(cap.slots * per_layer) if cap.per_layer else share * per_layer / len(layers))
        return out

    def kv_bytes(self, context: int, sequences: int, ranges: Sequence[Sequence[int]] | None = None) -> list[float]:
        """KV-cache bytes each GPU holds for `sequences` sequences of `context` tokens: each MoE
        layer's on its device (a windowed block keeps its window, or the cells its engine keeps
        for one: `ModelPreset.attended_tokens`, `EngineMemory.window_cells`), the dense-only
        blocks' (DeepSeek's first layers) on the first device. `ranges`: the MoE layers of each
        device when not the even split (`casmoe plan`'s GPUs of different sizes)."""
        preset = self.preset
        first = preset.dense_layers
        cells = self.memory.window_cells()
        out = []
        for d, layers in enumerate(ranges if ranges is not None else split_layers(preset.geometry.layers, self.devices)):
            blocks = [first + layer for layer in layers] + (list(range(first)) if d == 0 else [])
            out.append(float(sequences * preset.kv_bytes(context, blocks=blocks, window_cells=cells)))
        return out

    def compute(self, expert_bytes: Sequence[int]) -> RooflineCompute:
        """The roofline times of this model's parts on this box under this stack."""
        from casmoe.sim.cost.compute import RooflineCompute

        hw, preset, g = self.hardware, self.preset, self.preset.geometry
        stack = self.stack.resolved()  # a stack's zeros: the shared defaults (`casmoe/sim/cost/stacks/shared.toml`)
        host_bw_eff = hw.cpu_mem_efficiency or stack.host_efficiency
        host_flop_eff = hw.cpu_matmul_efficiency or stack.host_flops_efficiency
        copies = stack.numa_aware if self.numa is None else self.numa
        numa = 1.0 if copies or hw.sockets == 1 else 1.0 / hw.sockets
        peak = hw.cpu_tflops * 1e12 * host_flop_eff * numa
        float_flops, int_flops, bf16_flops = (peak * hw.host_flop_scale, peak * hw.host_int_flop_scale,
                                              peak * hw.host_bf16_flop_scale)

        def host_rate(p: Precision | None) -> float:
            """FLOP/s of the host's kernels on weights of precision `p`: integer dot products for
            ggml's block types (`Precision.int_dot`), BF16 dot products for BF16 weights, FMAs for
            the rest and the unknown."""
            if p is not None and p.int_dot:
                return int_flops
            return bf16_flops if p is not None and p.bf16_dot else float_flops

        # the kernels' share of what their threads can stream: of the sockets' peak, or of the threads' own
        # rate where fewer threads than that take (llama-bench on bench/llamacpp's box: decode doubles from 1
        # to 2 threads as STREAM does; the share, fitted there, is 0.55-0.67 at either count: bench/RESULTS.md)
        cpu_bw = host_bw_eff * min(hw.cpu_mem_bw_gbs * 1e9 * numa, hw.host_thread_bw())
        experts_p = self.quant or (None if self.measured_bytes(g) else preset.expert_precision)
        host_p = self.host_quant or experts_p
        cpu_flops, attn_flops = host_rate(self._host_expert_precision(host_p)), 0.0
        if hw.host_only:  # the host's kernels run every part, on the same cores; nothing crosses a link
            # the dense part's precision sets the rate of its blocks and of the head (a llama.cpp file type's head
            # type is a ggml block type as its dense type is, and a plain --dense-quant stores the head alike);
            # attention multiplies the F16 cache (llama.cpp's default cache type) with FMAs
            dense = host_rate(self._dense_kernel_precision())
            flops, bw, expert_bw, h2d, hop, serial = dense, cpu_bw, cpu_bw, math.inf, 0.0, 1.0
            attn_flops = 0.0 if dense == float_flops else float_flops
        else:
            flops, bw = hw.dense_tflops * 1e12 * hw.matmul_efficiency, hw.mem_bw_gbs * 1e9 * hw.mem_efficiency
            expert_bw, h2d, hop, serial = bw * stack.gpu_efficiency, hw.h2d_gbs(self.pinned) * 1e9, hw.cpu_hop_us * 1e-6, hw.cpu_serial
        full, windowed = self._kv_split()
        return RooflineCompute(
            flops=flops,
            bw=bw,
            cpu_flops=cpu_flops,
            attn_flops=attn_flops,
            cpu_bw=cpu_bw,
            h2d=h2d,
            cpu_hop=hop,
            dense_params=preset.dense_params_per_layer,
            attn_pair_flops=preset.attention_pair_flops,
            kv_bytes_per_token=full,
            head_params=preset.vocab * g.hidden,
            hidden=g.hidden,
            expert_params=g.expert_params,
            expert_bytes=tuple(int(b) for b in expert_bytes),
            layer_overhead=(hw.layer_overhead_us * stack.launch_share + stack.layer_us) * 1e-6,
            expert_overhead=(hw.expert_overhead_us * stack.launch_share + stack.expert_us) * 1e-6,
            handover_latency=hw.handover_us * 1e-6,
            p2p=hw.p2p_gbs * 1e9,
            expert_pass=hw.expert_pass_us * 1e-6,
            cpu_serial=serial,
            dense_bytes_per_param=(self.dense_precision.bits / 8 if self.weights is None
                                   else self.dense_weight_bytes(1) / preset.dense_params_per_layer),
            head_bytes=self.head_bytes(),
            dense_block_bytes=0.0 if self.weights is None else self.dense_block_bytes(),
            expert_bw=expert_bw,
            dequant_ops=experts_p.dequant_ops if experts_p is not None else 0.0,
            host_expert_bytes=tuple(self.host_expert_bytes(expert_bytes)) if self.host_quant else (),
            host_dequant_ops=host_p.dequant_ops if host_p is not None else 0.0,
            host_expert_overhead=stack.host_expert_us * 1e-6,
            kv_window_bytes_per_token=windowed,
            window=preset.sliding_window if windowed else 0,
            step_overhead=stack.step_us * 1e-6,
            dense_block_params=preset.dense_layer_params if preset.dense_layers else 0,
            dense_blocks=preset.dense_layers,
            moe_layer_overhead=stack.expert_loop_us * g.experts * 1e-6,
        )

    def _host_expert_precision(self, host_p: Precision | None) -> Precision | None:
        """The precision the host's expert kernels multiply: a GGUF file's experts (`weights`:
        their llama.cpp file type, their one ggml type, or their width when mixed past casmoe's
        rules), else `host_p` (`host_quant`, else the experts')."""
        if self.weights is not None and self.host_quant is None:
            return _kernel(parse_precision(self.weights.precision_name()), self.weights.expert_types)
        return host_p

    def _dense_kernel_precision(self) -> Precision:
        """The precision the dense part's kernels multiply: a GGUF file's (its one ggml type, or
        its width), else `dense_precision`."""
        if self.weights is None:
            return self.dense_precision
        return _kernel(parse_precision(self.weights.dense_precision_name()), self.weights.dense_types)

    def priced(self, trace: Trace) -> str:
        """What a run of `trace` prices, in words: the experts' precision and size ('experts at
        q4_k_m (2.65-3.06 MB each, by layer)', or the trace's measured bytes beside what the
        model's released checkpoint weighs), the host-computed experts' where they differ, the
        dense part's, and the routing's top-k (the trace's, said against the model's own where
        they differ)."""
        preset, g = self.preset, trace.geometry
        sizes = self.expert_bytes(trace)
        precision = self.precision_label(g)
        if precision != "trace":
            parts = [f"experts at {precision} ({_sizes(sizes)})"]
        else:
            released = preset.expert_bytes_per_layer()[0]
            name = preset.expert_precision.name if preset.expert_precision is not None else "bf16"
            params = preset.geometry.expert_params
            width = f", {_range([8 * b / params for b in sizes], '{:.2g}')} bits/weight" if params else ""
            parts = [f"experts at the trace's measured bytes ({_sizes(sizes)}{width}; {preset.name}'s released {name} "
                     f"experts are {human_bytes(released)}: --quant {name} prices those)"]
        if self.host_quant is not None and self.host_quant.name != precision:
            parts.append(f"host-computed experts at {self.host_quant.name} ({_sizes(self.host_expert_bytes(sizes))})")
        parts.append(f"dense part at {self.dense_precision.name}")
        k, native = g.top_k, preset.geometry.top_k
        parts.append(f"top-{k} of {g.experts}" if k == native else f"top-{k} of {g.experts} (the trace's routing; "
                     f"{preset.name} routes {native}: a trace recorded at top-{native} prices its own)")
        return ", ".join(parts)

    def _kv_split(self) -> tuple[float, float]:
        """KV bytes one token adds to an MoE layer, averaged over the layers: of those attending
        to the whole context, and of those attending to a window (gpt-oss's every other block)."""
        preset = self.preset
        per_token = preset.kv_bytes_per_token()
        if not preset.sliding_window:
            return per_token, 0.0
        L = preset.geometry.layers
        windowed = sum(1 for layer in range(L) if preset.window(preset.dense_layers + layer))
        return per_token * (L - windowed) / L, per_token * windowed / L

    def copy_rate(self) -> float:
        """Bytes/s an expert copy moves at: the link's rate as this stack's copies reach it."""
        return self.hardware.h2d_gbs(self.pinned) * 1e9 * self.stack.copy_efficiency

    def copy_latency(self) -> float:
        """Seconds one copy costs before its bytes move (the profile's per-copy issue and setup)."""
        return self.hardware.copy_latency_us * 1e-6

    def copy_seconds(self, nbytes: float) -> float:
        """Seconds one copy of `nbytes` takes over an idle link, as this stack's copies reach it:
        the one price of a copy that the links charge, that timeliness bounds stalls with, and
        that a cost-based policy (fiddler, hybrimoe) weighs against computing on the host. A box
        without a GPU has no link: a copy never ends, so no choice ever makes one."""
        if self.hardware.host_only:
            return math.inf
        return self.copy_latency() + nbytes / self.copy_rate()

    def box(self) -> str:
        """'rtx4090x4 (4 GPUs)', 'rtx4090x4, 2 of its 4 GPUs', or 'my-laptop (no GPU)'."""
        hw = self.hardware
        if hw.host_only:
            return f"{hw.name} (no GPU)"
        if self.devices == hw.gpus:
            return f"{hw.name} ({hw.gpus} GPU{'s' * (hw.gpus > 1)})"
        return f"{hw.name}, {self.devices} of its {hw.gpus} GPU{'s' * (hw.gpus > 1)}"


def _range(values: Sequence[float], fmt: str) -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _sizes(nbytes: Sequence[int]) -> str:
    """'352 MB each', or '2.65-3.06 MB each, by layer' where the layers differ (a llama.cpp mix)."""
    lo, hi = human_bytes(min(nbytes)), human_bytes(max(nbytes))
    if lo == hi:
        return f"{hi} each"
    if lo.split()[1] == hi.split()[1]:
        lo = lo.split()[0]
    return f"{lo}-{hi} each, by layer"


NUMA = {"copies": True, "one": False}
"""`--numa` words: whether the runtime keeps one copy of the host weights per NUMA node."""


def parse_numa(text: str | None) -> bool | None:
    """`--numa copies|one` as `Machine.numa` (None: the stack's habit)."""
    if text is None:
        return None
    key = str(text).strip().lower()
    if key not in NUMA:
        raise SimConfigError(f"--numa {text!r}: give copies (a copy of the host weights on each socket) or one")
    return NUMA[key]


def presets_of_shape(geometry: Geometry) -> list[str]:
    """Names of the presets with the layers and experts of `geometry`."""
    return [
        name
        for name, p in load_presets().items()
        if (p.geometry.layers, p.geometry.experts) == (geometry.layers, geometry.experts)
    ]
