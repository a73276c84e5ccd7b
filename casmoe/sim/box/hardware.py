"""Hardware profiles: the numbers the simulator prices time with, loaded from TOML data files.

A profile is data (STYLE principle 5): a new GPU box is a TOML file, not a class. Every number
in a profile carries a `source` (a datasheet, a measurement, or an explicit assumption) in the
file's `[sources]` table; the loader refuses a profile with an unsourced number, so a what-if
answer can always be traced back to where its inputs came from.

Shipped profiles live in `casmoe/sim/box/profiles/`; a user passes the path of their own file anywhere a
profile name is accepted. `HardwareProfile.to_toml` writes one back, which is what a
calibration run uses to record measured numbers.
"""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.output import write_text
from casmoe.tables import read_table
from casmoe.userfile import read_text

PROFILES_DIR = Path(__file__).with_name("profiles")

GIB = 1024**3


class HardwareError(CasmoeError, ValueError):
    """An unknown profile name or a profile file that is incomplete or inconsistent."""



FASTEST_REAL: dict[str, tuple[float, str]] = {
    "h2d_pinned_gbs": (450.0, "NVLink-C2C of the GH200, 900 GB/s both ways (NVIDIA GH200 datasheet)"),
    "h2d_pageable_gbs": (450.0, "NVLink-C2C of the GH200, 900 GB/s both ways (NVIDIA GH200 datasheet)"),
    "host_cap_gbs": (450.0, "NVLink-C2C of the GH200, 900 GB/s both ways (NVIDIA GH200 datasheet)"),
    "p2p_gbs": (900.0, "NVLink 5 of the B200, 1.8 TB/s both ways (NVIDIA Blackwell datasheet)"),
    "mem_bw_gbs": (8000.0, "HBM3e of the B200 and MI355X, 8 TB/s (NVIDIA and AMD datasheets)"),
    "memory_gib": (288.0, "HBM3e of the MI355X, 288 GB (AMD datasheet)"),
    "dense_tflops": (2500.0, "dense BF16 of the MI355X, 2.5 PFLOPS (AMD datasheet; B200: 2.25)"),
    "cpu_mem_bw_gbs": (1230.0, "two sockets of 12-channel DDR5-6400 (2 x 12 x 51.2 GB/s, Xeon 6900P / EPYC 9005)"),
    "storage_read_gbs": (14.0, "one PCIe 5.0 x4 NVMe drive (Samsung 9100 PRO datasheet, 14.8 GB/s)"),
    "gpus": (72.0, "the GPUs of one NVLink domain, the GB200 NVL72 rack (NVIDIA GB200 NVL72 datasheet)"),
    "cpu_tflops": (90.9, "two AMD EPYC 9965: 2 x 192 cores x 3.7 GHz boost (AMD datasheet) x 64 FP32 FLOP a cycle "
                         "(Zen 5: two 512-bit FMA pipes, 2 x 16 x 2)"),
    "cpu_cores": (384.0, "two AMD EPYC 9965 of 192 cores (AMD datasheet)"),
    "cpu_threads": (768.0, "two AMD EPYC 9965, 384 threads each (AMD datasheet)"),
    "cpu_sockets": (8.0, "8-socket 4th-generation Xeon Scalable systems (Intel Xeon Platinum 8490H: 8S scalability, ARK)"),
    "host_ram_gib": (32768.0, "32 TB of one 8-socket server (HPE Compute Scale-up Server 3200: up to 32 TB)"),
    "host_reserved_gib": (32768.0, "every GiB of the largest host RAM above"),
    "cpu_thread_gbs": (365.0, "one core can take at most 64 bytes a cycle into L1 (Intel optimization manual: the "
                              "L1 data cache's fill width) at the fastest clock shipped, 5.7 GHz (i9-14900K, ARK)"),
    "cpu_matrix_speedup": (16.0, "Intel AMX: 1024 BF16 FLOP a cycle and core against AVX-512's 64 FP32 (Intel, "
                                 "'Accelerate AI Workloads with Intel AMX')"),
    "cpu_int8_speedup": (4.0, "AVX512-VNNI / AVX-VNNI vpdpbusd (Intel intrinsics guide, _mm512_dpbusd_epi32, "
                              "_mm256_dpbusd_avx_epi32: 'Multiply groups of 4 adjacent pairs of unsigned 8-bit "
                              "integers ... with corresponding signed 8-bit integers ... Sum these 4 results with the "
                              "corresponding 32-bit integer'): 4 multiply-adds per 32-bit lane in one instruction, "
                              "against 1 for an FP32 FMA of the same width; x86 has no wider integer dot product "
                              "(AMX tiles are cpu_matrix_speedup)"),
    "cpu_bf16_speedup": (2.0, "AVX512_BF16 vdpbf16ps (Intel intrinsics guide, _mm512_dpbf16_ps: 'Compute dot-product "
                              "of BF16 (16-bit) floating-point pairs in a and b, accumulating the intermediate "
                              "single-precision (32-bit) floating-point elements'): 2 multiply-adds per 32-bit lane in "
                              "one instruction, against 1 for an FP32 FMA (AMX tiles are cpu_matrix_speedup)"),
}
"""The fastest real part of each kind, with its source: a profile may go up to `WHAT_IF` times
it (a what-if of the next generation); beyond that the number is a typo or a wrong unit (24,000
GB/s of PCIe, a speed-up of 800 meant as 8x), refused instead of simulated without a word."""
UNBOUNDED = {
    "reserved_gib": "below memory_gib (checked)", "matmul_efficiency": "in (0, 1] (checked)",
    "mem_efficiency": "in (0, 1] (checked)", "cpu_mem_efficiency": "in [0, 1] (checked)",
    "cpu_matmul_efficiency": "in [0, 1] (checked)", "cpu_serial": "in [0, 1] (checked)",
    "resume_per_stall": "a multiple of a stall a slow runtime may well exceed",
    **{n: "a time: a slow part, a slow runtime or a slow drive is real, however slow" for n in (
        "copy_latency_us", "layer_overhead_us", "expert_overhead_us", "handover_us", "storage_latency_us", "load_host_us",
        "load_layer_us", "wake_us", "copy_beside_us", "decide_us", "decide_load_us", "cpu_hop_us", "expert_pass_us")},
}
"""Numbers with no fastest real part, and why: a time has no fastest and any slowness is real;
a share or a reserve is checked against its own range. Every number is here or in
`FASTEST_REAL` (tests/sim/box/test_sim_hardware.py holds the two to cover every field)."""
WHAT_IF = 4.0

GPU_FIELDS = ("memory_gib", "reserved_gib", "dense_tflops", "mem_bw_gbs", "matmul_efficiency", "mem_efficiency",
              "h2d_pinned_gbs", "h2d_pageable_gbs", "copy_latency_us", "host_cap_gbs", "handover_us", "p2p_gbs")
"""The numbers that describe a GPU and its host link: all 0 in a profile of a box without one
(`gpus = 0`, a CPU-only llama.cpp box), so that a half-described GPU is refused, not priced."""


_SOCKETS = re.compile(r"\s*(\d+)\s*x\s")


def sockets_in(cpu: str) -> int:
    """Sockets a profile's `cpu` text leads with ('2x Intel Xeon Gold 6330 ...'); 1 when it names no count."""
    m = _SOCKETS.match(cpu)
    return int(m.group(1)) if m else 1


@dataclass(frozen=True)
class HardwareProfile:
    """One machine: `gpus` identical accelerators, each with its own host-to-device link (0: a box
    without a GPU, whose `GPU_FIELDS` are all 0).

    Bandwidths are in GB/s (1e9 bytes/s), compute in TFLOPS (1e12 FLOP/s), times in
    microseconds, memory in GiB (how vendors size GPU memory). `host_cap_gbs = 0` means the
    host side never limits the links together.

    The fields after `cpu_mem_bw_gbs` are optional in a TOML file (0 when absent, sourced as
    such): the storage tier under host RAM (`storage_read_gbs`, `storage_latency_us`: one NVMe
    device or array shared by every GPU), the host RAM size (`host_ram_gib`), the costs of the thread
    that runs the model: issuing loads takes `load_host_us` per load plus `load_layer_us` once
    per burst (the loads of one cache event; the first wakes the copy thread), compute-thread
    time during which the copies already run; a layer that waits for a copy resumes `wake_us`
    after it lands (the blocked thread's wake-up, part of the stall) and then computes
    `resume_per_stall` x its stall longer (what the compute loses after blocking: more the
    longer it idled); a copy that runs beside the compute (a prefetch or background
    load, not waited for where it is issued) costs the compute thread `copy_beside_us` (the
    copy thread's own work competes with it). The cache policy's own decisions run on the same
    thread: `decide_us` per layer visit beyond those of the all-resident baseline the resident
    step was measured with (a Python policy's bookkeeping), plus `decide_load_us` per load the
    visit asks for (choosing a victim, recording the load); both delay the layer's loads, and
    they depend on the policy's code (`casmoe validate` times each policy's replay). In the cpu miss mode,
    `cpu_hop_us` is the fixed cost of moving one expert's activations between the GPU and the
    host (each way), and `cpu_serial` says how the host's experts add to the device's: 0, beside
    them (a GPU box: the layer takes the longer), 1, on the same thread (a CPU-only backend: the
    sum). `expert_pass_us` is the fixed cost of a layer's routed-experts pass on the device (one
    call of the experts function: launches, gathers), paid when any of its experts runs there:
    a layer whose experts all run on the host skips it.

    The host: `cpu_tflops` and `cpu_mem_bw_gbs` are the peaks of all `cpu_sockets` sockets
    together (0: one); `cpu_mem_efficiency` and `cpu_matmul_efficiency` are the shares of those
    peaks this box's host expert kernels reach when it was measured (a calibrated CPU backend: 1,
    its rates are achieved ones); 0 leaves them to the run's software stack and the shared
    default (`casmoe.sim.cost.stack`), never to the GPU's efficiencies. `host_reserved_gib` is the
    host RAM kept for the operating system and the runtime (`HOST_RESERVED_GIB` with its source
    when a profile with `host_ram_gib` leaves it out): experts get the rest, `host_ram_bytes`,
    and what does not fit there is read from storage.

    Host threads, as a runtime runs them (llama.cpp `-t`, KTransformers `--cpu_infer`):
    `cpu_cores` are the physical cores of all sockets, `cpu_threads` those the expert kernels
    run on (0: one per core). FLOPs scale with the cores in use (`cpu_tflops` is the peak of
    all cores; a second hardware thread on a core shares its FMA units), and DRAM bandwidth
    with the threads until the sockets' is reached: one thread streams `cpu_thread_gbs` (0:
    not limiting). llama.cpp's thread sweeps show both: decode time halves from 1 to 2
    threads and stops improving once the channels are saturated (ggml-org/llama.cpp#34).
    `cpu_matrix_speedup` is how many times matrix units (Intel AMX) raise the FLOP peak of
    `cpu_tflops` (AVX-512 FMA) for kernels that use them (0: none): it speeds up prefill-sized
    host experts, not decode, which streams weights. `cpu_int8_speedup` is how many times the
    host's integer dot-product instructions raise the multiply-add rate of `cpu_tflops` for
    kernels that multiply int8-quantised activations by quantised weights (ggml's block types,
    `Precision.int_dot`; 0: none, 1x): 4 with AVX512-VNNI or AVX-VNNI (`vpdpbusd`: 4 int8
    multiply-adds per 32-bit lane in one instruction), 2 with AVX2 alone (`vpmaddubsw` then
    `vpmaddwd`: two instructions for those 4). A kernel takes the integer dot products or the
    matrix units, not both: such kernels run at the larger of the two (`host_int_flop_scale`).
    `cpu_bf16_speedup` is the same for BF16 weights: 2 with AVX512_BF16 (`vdpbf16ps`: 2 BF16
    multiply-adds per 32-bit lane), which ggml's BF16 kernels use (`host_bf16_flop_scale`).
    """

    name: str
    description: str
    gpu: str
    gpus: int
    memory_gib: float
    reserved_gib: float
    dense_tflops: float
    mem_bw_gbs: float
    matmul_efficiency: float
    mem_efficiency: float
    h2d_pinned_gbs: float
    h2d_pageable_gbs: float
    copy_latency_us: float
    host_cap_gbs: float
    layer_overhead_us: float
    expert_overhead_us: float
    handover_us: float
    p2p_gbs: float
    cpu: str
    cpu_tflops: float
    cpu_mem_bw_gbs: float
    storage_read_gbs: float = 0.0
    storage_latency_us: float = 0.0
    host_ram_gib: float = 0.0
    load_host_us: float = 0.0
    load_layer_us: float = 0.0
    wake_us: float = 0.0
    resume_per_stall: float = 0.0
    copy_beside_us: float = 0.0
    decide_us: float = 0.0
    decide_load_us: float = 0.0
    cpu_hop_us: float = 0.0
    expert_pass_us: float = 0.0
    cpu_serial: float = 0.0
    cpu_sockets: int = 0
    cpu_mem_efficiency: float = 0.0
    cpu_matmul_efficiency: float = 0.0
    host_reserved_gib: float = 0.0
    cpu_cores: int = 0
    cpu_threads: int = 0
    cpu_thread_gbs: float = 0.0
    cpu_matrix_speedup: float = 0.0
    cpu_int8_speedup: float = 0.0
    cpu_bf16_speedup: float = 0.0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        numbers = self.numeric_fields()
        missing = [n for n in numbers if not self.sources.get(n)]
        if missing:
            raise HardwareError(f"profile {self.name!r}: no source given for {', '.join(missing)} (add them to [sources])")
        unknown = sorted(set(self.sources) - set(numbers))
        if unknown:
            raise HardwareError(f"profile {self.name!r}: [sources] names unknown fields {unknown}")
        infinite = [n for n in numbers if not math.isfinite(getattr(self, n))]
        if infinite:
            raise HardwareError(f"profile {self.name!r}: {', '.join(infinite)} must be finite numbers (not nan or inf)")
        if self.gpus < 0:
            raise HardwareError(f"profile {self.name!r}: gpus must be >= 0 (0: a box without a GPU)")
        if self.gpus == 0:
            described = [n for n in GPU_FIELDS if getattr(self, n)]
            if described:
                raise HardwareError(f"profile {self.name!r}: gpus = 0 (no GPU), but {', '.join(described)} describe "
                                    "one; set them to 0 or give the GPU count")
        positive = ("memory_gib", "dense_tflops", "mem_bw_gbs", "h2d_pinned_gbs", "h2d_pageable_gbs", "p2p_gbs")
        for n in positive if self.gpus else ():
            if getattr(self, n) <= 0:
                raise HardwareError(f"profile {self.name!r}: {n} must be > 0")
        for n in numbers:
            if getattr(self, n) < 0:
                raise HardwareError(f"profile {self.name!r}: {n} must be >= 0")
        if self.cpu_serial > 1:
            raise HardwareError(f"profile {self.name!r}: cpu_serial must be in [0, 1]")
        for n in ("cpu_mem_efficiency", "cpu_matmul_efficiency"):
            if getattr(self, n) > 1:
                raise HardwareError(f"profile {self.name!r}: {n} must be in [0, 1] (0: the software stack's)")
        for n, zero in (("cpu_matrix_speedup", "no matrix units"),
                        ("cpu_int8_speedup", "no integer dot products modelled, the FP32 rate"),
                        ("cpu_bf16_speedup", "no BF16 dot products modelled, the FP32 rate")):
            if 0 < getattr(self, n) < 1:
                raise HardwareError(f"profile {self.name!r}: {n} must be >= 1 (0: {zero})")
        if self.cpu_threads and not self.cpu_cores:
            raise HardwareError(f"profile {self.name!r}: cpu_threads needs cpu_cores (the cores cpu_tflops counts)")
        if self.host_ram_gib and self.host_reserved_gib >= self.host_ram_gib:
            raise HardwareError(
                f"profile {self.name!r}: host_reserved_gib ({self.host_reserved_gib:g} GiB kept for the OS and the "
                f"runtime) must be below host_ram_gib ({self.host_ram_gib:g}); give more host RAM or a smaller reserve"
            )
        for n in ("matmul_efficiency", "mem_efficiency") if self.gpus else ():
            if not 0 < getattr(self, n) <= 1:
                raise HardwareError(f"profile {self.name!r}: {n} must be in (0, 1]")
        if self.gpus and self.reserved_gib >= self.memory_gib:
            raise HardwareError(f"profile {self.name!r}: reserved_gib must be below memory_gib")
        for n, (fastest, source) in FASTEST_REAL.items():
            if getattr(self, n) > WHAT_IF * fastest:
                raise HardwareError(
                    f"profile {self.name!r}: {n} = {getattr(self, n):g} is beyond any real box (the fastest: {fastest:g}, "
                    f"{source}; a what-if may go up to {WHAT_IF:g}x that); check the number and its unit"
                )
        fastest, source = FASTEST_REAL["cpu_sockets"]
        if not self.cpu_sockets and sockets_in(self.cpu) > WHAT_IF * fastest:  # the count `sockets` reads off the text
            raise HardwareError(f"profile {self.name!r}: its cpu text {self.cpu!r} counts {sockets_in(self.cpu)} sockets, "
                                f"beyond any real box (the most: {fastest:g}, {source}); give cpu_sockets")

    @classmethod
    def numeric_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.type in ("int", "float")]

    def check_host_compute(self, where: str | None = None) -> None:
        """The cpu miss mode prices a missed expert with cpu_tflops and cpu_mem_bw_gbs: refuse
        a profile without them before any run (a 0 would divide by zero mid-simulation)."""
        if min(self.cpu_tflops, self.cpu_mem_bw_gbs) <= 0:
            raise HardwareError(
                f"{where or f'profile {self.name!r}'}: miss mode cpu computes missed experts on the host, but "
                f"cpu_tflops = {self.cpu_tflops:g} and cpu_mem_bw_gbs = {self.cpu_mem_bw_gbs:g}; give both (> 0)"
            )

    def h2d_gbs(self, pinned: bool = True) -> float:
        return self.h2d_pinned_gbs if pinned else self.h2d_pageable_gbs

    @property
    def host_only(self) -> bool:
        """A box without a GPU (`gpus = 0`): the host computes every part of the model, the
        dense part, the head and every expert, on its own cores and from its own RAM."""
        return self.gpus == 0

    @property
    def sockets(self) -> int:
        """The host's sockets (NUMA nodes): `cpu_sockets`, else the count the `cpu` text leads with
        ('2x Intel Xeon Gold 6330 ...'), else one. The simulator's host bandwidth under `--numa one`
        and the plan's `--numa distribute` / `--kt-threadpool-count` both read this."""
        return self.cpu_sockets or sockets_in(self.cpu)

    @property
    def host_flop_scale(self) -> float:
        """The share of `cpu_tflops` the host's expert kernels can reach by their thread count
        and instructions: the cores in use of all cores (threads beyond the cores add no FMA
        units), times the matrix units' speedup."""
        return self._host_cores_share * (self.cpu_matrix_speedup or 1.0)

    @property
    def host_int_flop_scale(self) -> float:
        """`host_flop_scale` for kernels that multiply int8-quantised activations by quantised
        weights (`Precision.int_dot`): the integer dot products' speedup or the matrix units',
        whichever is larger, never their product (one kernel uses VNNI or AMX tiles, not both);
        without `cpu_int8_speedup`, `host_flop_scale` itself."""
        return self._dot_product_scale(self.cpu_int8_speedup)

    @property
    def host_bf16_flop_scale(self) -> float:
        """`host_flop_scale` for kernels that multiply BF16 weights with BF16 dot products (ggml's
        `ggml_vec_dot_bf16` and its tinyBLAS GEMM under `__AVX512BF16__`): that speedup or the
        matrix units', whichever is larger; without `cpu_bf16_speedup`, `host_flop_scale` itself."""
        return self._dot_product_scale(self.cpu_bf16_speedup)

    def _dot_product_scale(self, speedup: float) -> float:
        return self._host_cores_share * max(self.cpu_matrix_speedup or 1.0, speedup or 1.0)

    @property
    def _host_cores_share(self) -> float:
        return min(self.cpu_threads, self.cpu_cores) / self.cpu_cores if self.cpu_threads else 1.0

    def describe_host(self) -> str:
        """The host's expert compute in a few words: '3.58 TFLOPS, 375 GB/s, 56 cores (16
        threads), 20 GB/s a thread, matrix units x8, int8 dot products x4'."""
        parts = [f"{self.cpu_tflops:g} TFLOPS, {self.cpu_mem_bw_gbs:g} GB/s"]
        if self.cpu_cores:
            parts.append(f"{self.cpu_cores} cores" + (f" ({self.cpu_threads} threads)" if self.cpu_threads else ""))
        if self.cpu_thread_gbs:
            parts.append(f"{self.cpu_thread_gbs:g} GB/s a thread")
        if self.cpu_matrix_speedup:
            parts.append(f"matrix units x{self.cpu_matrix_speedup:g}")
        if self.cpu_int8_speedup:
            parts.append(f"int8 dot products x{self.cpu_int8_speedup:g}")
        if self.cpu_bf16_speedup:
            parts.append(f"bf16 dot products x{self.cpu_bf16_speedup:g}")
        return ", ".join(parts)

    def host_thread_bw(self) -> float:
        """Bytes/s the host's threads stream at most, as STREAM measures them (inf: not limiting);
        a stack's kernels get their `host_efficiency` share of it, as of the sockets' peak."""
        if not self.cpu_thread_gbs:
            return math.inf
        return (self.cpu_threads or self.cpu_cores or 1) * self.cpu_thread_gbs * 1e9

    def host_ram_bytes(self) -> float:
        """Host RAM the experts may use: all of it but the reserve for the OS and runtime (0: the
        profile does not say how much RAM it has). The dense part and the KV cache take none of
        it: every simulated placement keeps them on the GPUs (`Machine.max_slots` charges them
        there)."""
        return (self.host_ram_gib - self.host_reserved_gib) * GIB if self.host_ram_gib else 0.0

    def usable_bytes(self) -> int:
        """Memory per GPU left for model weights and the expert cache."""
        return int((self.memory_gib - self.reserved_gib) * GIB)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_toml(self) -> str:
        """The profile as TOML text that `from_toml` reads back unchanged."""
        lines = []
        for f in fields(self):
            if f.name != "sources":
                lines.append(f"{f.name} = {json.dumps(getattr(self, f.name))}")
        lines.append("")
        lines.append("[sources]")
        for name in self.numeric_fields():
            lines.append(f"{name} = {json.dumps(self.sources[name])}")
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path) -> Path:
        return write_text(path, self.to_toml())

    @classmethod
    def from_toml(cls, text: str, where: str = "<toml>") -> HardwareProfile:
        try:
            raw = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise HardwareError(f"{where}: not valid TOML: {exc}") from exc
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "<dict>") -> HardwareProfile:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise HardwareError(f"{where}: unknown profile fields {unknown}")
        missing = sorted(n for n, f in known.items() if n not in raw and n != "sources" and n not in OPTIONAL)
        if missing:
            raise HardwareError(f"{where}: missing profile fields {missing}")
        absent = {n: v for n, v in OPTIONAL.items() if n not in raw}
        raw = {**raw, **absent}
        if isinstance(raw.get("sources"), dict):
            raw["sources"] = {**raw["sources"], **{n: ABSENT for n in absent}}
            if "host_reserved_gib" in absent and raw.get("host_ram_gib"):  # RAM stated: the OS keeps some of it
                raw["host_reserved_gib"] = HOST_RESERVED_GIB
                raw["sources"]["host_reserved_gib"] = HOST_RESERVED_SOURCE
        values: dict[str, Any] = {}
        for n, f in known.items():
            v = raw.get(n, {})
            want = {"int": int, "float": (int, float), "str": str}.get(str(f.type))
            if want is not None and (not isinstance(v, want) or isinstance(v, bool)):
                raise HardwareError(f"{where}: field {n} must be {f.type}, got {v!r}")
            values[n] = float(v) if f.type == "float" else v
        if not isinstance(values["sources"], dict):
            raise HardwareError(f"{where}: [sources] must be a table")
        try:
            return cls(**values)
        except HardwareError as exc:  # name the user's file, not the `name` it copied from a shipped one
            msg, subject = str(exc), f"profile {values['name']!r}: "
            raise HardwareError(f"{where}: {msg.removeprefix(subject)}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> HardwareProfile:
        return cls.from_toml(read_text(path, "hardware profile", HardwareError), str(path))

    def with_values(self, sources: dict[str, str] | None = None, **values: Any) -> HardwareProfile:
        """A copy with some numbers replaced (e.g. measured ones), each with its new source."""
        fresh = dict(self.sources)
        fresh.update(sources or {})
        d = self.to_dict()
        d.update(values)
        d["sources"] = fresh
        return type(self)(**d)


OPTIONAL = {
    "storage_read_gbs": 0.0, "storage_latency_us": 0.0, "host_ram_gib": 0.0, "load_host_us": 0.0, "load_layer_us": 0.0,
    "wake_us": 0.0, "resume_per_stall": 0.0, "copy_beside_us": 0.0, "decide_us": 0.0, "decide_load_us": 0.0,
    "cpu_hop_us": 0.0, "expert_pass_us": 0.0, "cpu_serial": 0.0, "cpu_sockets": 0, "cpu_mem_efficiency": 0.0,
    "cpu_matmul_efficiency": 0.0, "host_reserved_gib": 0.0, "cpu_cores": 0, "cpu_threads": 0, "cpu_thread_gbs": 0.0,
    "cpu_matrix_speedup": 0.0, "cpu_int8_speedup": 0.0, "cpu_bf16_speedup": 0.0,
}
"""Fields a profile file may leave out (older files, calibrated ones): 0, sourced as `ABSENT`."""
ABSENT = "not given in the profile (0: not modelled)"
HOST_RESERVED_GIB = 4.0
"""Host RAM kept for the OS and the runtime when a profile states its RAM but no reserve."""
HOST_RESERVED_SOURCE = (
    "default when a profile gives host_ram_gib but no reserve (assumption): a headless Linux server uses 1-2 GiB, "
    "a CUDA process's host side (driver, context, PyTorch or llama.cpp runtime, pinned staging buffers) 1-2 GiB more; "
    "4 GiB keeps both out of the experts' RAM"
)


PUBLISHED_DIR = Path(__file__).parents[1] / "trust" / "published" / "profiles"
"""Profiles of the boxes of the published measurements (`bench/published_profiles.py`)."""


def profile_paths(published: bool = False) -> dict[str, Path]:
    """Shipped profiles by name; with `published`, the published boxes' too."""
    out = {p.stem: p for p in sorted(PROFILES_DIR.glob("*.toml"))}
    if published:
        out.update({p.stem: p for p in sorted(PUBLISHED_DIR.glob("*.toml")) if p.stem not in out})
    return out


LINKS_FILE = Path(__file__).with_name("links.toml")
VARIANT_KEYS = ("gpus", "link", "host_ram_gib", "cpu_threads")
"""What a hardware spec `NAME@key=value,...` may vary (`casmoe search`'s GPU, link and host-RAM
axes, and the host threads a runtime is told to use)."""


def link_generations() -> dict[str, dict[str, Any]]:
    """The host-link generations a variant can take (`casmoe/sim/box/links.toml`): pinned rate, source."""
    return read_table(LINKS_FILE)


def variant(profile: HardwareProfile, link: str = "", host_ram_gib: float | None = None,
            gpus: int | None = None, cpu_threads: int | None = None) -> HardwareProfile:
    """`profile` with another GPU count, host-link generation (its pinned host-to-device rate,
    the pageable one scaled alike), host RAM size and/or host threads for the expert kernels;
    named `NAME@gpus=...,link=...,host_ram_gib=...,cpu_threads=...` so that a stored result's
    key and a record tell it apart."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    spec = []
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise HardwareError(f"a box has a whole number of GPUs >= 1, got {gpus!r}")
        values["gpus"] = gpus
        sources["gpus"] = f"variant: {gpus} of the profile's GPU, each with its own host link"
        spec.append(f"gpus={gpus}")
    if link:
        links = link_generations()
        if link not in links:
            raise HardwareError(f"unknown link generation {link!r}; one of {', '.join(links)} (casmoe/sim/box/links.toml)")
        rate = float(links[link]["pinned_gbs"])
        values["h2d_pinned_gbs"] = rate
        values["h2d_pageable_gbs"] = profile.h2d_pageable_gbs * rate / profile.h2d_pinned_gbs
        sources["h2d_pinned_gbs"] = f"{link} variant: {links[link]['source']}"
        sources["h2d_pageable_gbs"] = f"{link} variant: the profile's pageable rate scaled as its pinned rate"
        spec.append(f"link={link}")
    if host_ram_gib is not None:
        if isinstance(host_ram_gib, bool) or not isinstance(host_ram_gib, (int, float)) or not (
                math.isfinite(host_ram_gib) and host_ram_gib > 0):
            raise HardwareError(f"host RAM must be a finite number of GiB > 0, got {host_ram_gib!r}")
        if not profile.host_ram_gib and not profile.host_reserved_gib:  # RAM now stated: the OS keeps some of it
            values["host_reserved_gib"] = HOST_RESERVED_GIB
            sources["host_reserved_gib"] = HOST_RESERVED_SOURCE
        if host_ram_gib <= values.get("host_reserved_gib", profile.host_reserved_gib):
            raise HardwareError(
                f"host RAM of {host_ram_gib:g} GiB leaves nothing beside the "
                f"{values.get('host_reserved_gib', profile.host_reserved_gib):g} GiB that "
                f"{profile.name!r} keeps for the OS and the runtime (host_reserved_gib); give more than that"
            )
        values["host_ram_gib"] = float(host_ram_gib)
        sources["host_ram_gib"] = "variant: the host RAM size searched over"
        spec.append(f"host_ram_gib={host_ram_gib:g}")
    if cpu_threads is not None:
        if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 1:
            raise HardwareError(f"host threads are a whole number >= 1, got {cpu_threads!r}")
        if not profile.cpu_cores:
            raise HardwareError(f"profile {profile.name!r} does not say how many cores its host has (cpu_cores); "
                                "add it (with a source) to run its experts on fewer threads")
        values["cpu_threads"] = cpu_threads
        sources["cpu_threads"] = f"variant: the expert kernels run on {cpu_threads} host threads (llama.cpp -t)"
        spec.append(f"cpu_threads={cpu_threads}")
    if not spec:
        return profile
    name = f"{profile.name}@{','.join(spec)}"
    return profile.with_values(sources, name=name, description=f"{profile.description} ({', '.join(spec)})", **values)


VARIANT_FLAGS = {"gpus": "--gpus", "link": "--link", "host_ram_gib": "--host-ram", "cpu_threads": "--cpu-threads"}
"""The run option that asks for each variant key besides a `NAME@...` spec."""


def split_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME@key=value,...` (a variant of a variant too: `NAME@gpus=2@link=pcie5`) as the base
    name or path and the variant's values as written; a key given twice is refused, so that no
    value silently replaces another."""
    text, options = spec, {}
    hint = f"write NAME@{','.join(f'{k}=...' for k in VARIANT_KEYS)}, e.g. rtx4090x4@gpus=2,link=pcie5,host_ram_gib=64"
    while "@" in text and not Path(text).exists():
        text, _, tail = text.rpartition("@")
        for item in tail.split(","):
            key, eq, value = (part.strip() for part in item.partition("="))
            if key not in VARIANT_KEYS or not eq or not value:
                raise HardwareError(f"bad hardware variant {item.strip()!r} in {spec!r}; {hint}")
            if key in options:
                raise HardwareError(f"{key} is given twice in hardware variant {spec!r} ({value} and {options[key]}); "
                                    "give it once")
            options[key] = value
    return text, options


def _variant_value(key: str, text: str, spec: str) -> Any:
    """One variant value as its type (gpus, cpu_threads: int; host_ram_gib: float; link: str)."""
    if key == "link":
        return text
    try:
        return float(text) if key == "host_ram_gib" else int(text)
    except ValueError:
        what = "a number of GiB" if key == "host_ram_gib" else "a whole number"
        raise HardwareError(f"{key} must be {what}, got {text!r} in {spec!r}") from None


def variant_spec(base: str, link: str = "", host_ram_gib: float | None = None, gpus: int | None = None,
                 cpu_threads: int | None = None) -> str:
    """The hardware spec `load_profile` turns into `variant(load_profile(base), ...)`. `base`
    may be a variant already (`rtx4090x4@gpus=2`): a value asked here that it gives otherwise is
    refused naming both (the same value twice is one value)."""
    name, written = split_variant(base)
    values = {k: _variant_value(k, v, base) for k, v in written.items()}
    asked = {"gpus": gpus, "link": link or None, "host_ram_gib": host_ram_gib, "cpu_threads": cpu_threads}
    for key, value in asked.items():
        if value is None:
            continue
        if key in values and values[key] != value:
            shown = f"{value:g}" if key == "host_ram_gib" else value
            raise HardwareError(f"hardware {base!r} gives {key}={written[key]}, and {VARIANT_FLAGS[key]} {shown} "
                                f"another; give one of them")
        values[key] = value
    parts = [f"{k}={values[k]:g}" if k == "host_ram_gib" else f"{k}={values[k]}" for k in VARIANT_KEYS if k in values]
    return f"{name}@{','.join(parts)}" if parts else name


def load_profile(spec: str | Path) -> HardwareProfile:
    """A shipped profile name (`rtx4090x4`) or the path of a user's TOML file, optionally with
    a variant: `NAME@link=pcie5,host_ram_gib=64` (`variant`)."""
    text = str(spec)
    base, options = split_variant(text)
    if options:
        values = {k: _variant_value(k, v, text) for k, v in options.items()}
        return variant(load_profile(base), values.get("link", ""), values.get("host_ram_gib"), values.get("gpus"),
                       values.get("cpu_threads"))
    shipped = profile_paths(published=True)
    if str(spec) in shipped:
        return HardwareProfile.from_file(shipped[str(spec)])
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise HardwareError(f"hardware profile file {path} not found")
        return HardwareProfile.from_file(path)
    raise HardwareError(
        f"unknown hardware profile {str(spec)!r}; shipped: {', '.join(profile_paths())} (and the published boxes of "
        "`casmoe hardware list --published`); or pass the path of your own "
        "TOML file (see `casmoe hardware list`)"
    )
