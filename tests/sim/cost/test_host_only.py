"""A box without a GPU (llama.cpp on a laptop or a CPU server): the host computes every part of
the model from its own RAM, and what does not fit that RAM is read from storage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.policies import get_policy
from casmoe.precision import parse_precision
from casmoe.presets import get_preset
from casmoe.sim.box.hardware import GPU_FIELDS, HardwareProfile, load_profile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.assembly import Run
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.run.fits import FitError, HostDemand, check_capacity, default_host_cache
from casmoe.trace import Request, Trace


def host_box(ram_gib: float = 64.0, storage_gbs: float = 3.0) -> HardwareProfile:
    """The seed box's host alone: its CPU (without its integer dot products), its RAM, a drive; no GPU."""
    seed = load_profile("rtx4090x4")
    values = {name: 0 for name in GPU_FIELDS}
    return seed.with_values(
        name="cpu-box", gpus=0, host_ram_gib=ram_gib, storage_read_gbs=storage_gbs, storage_latency_us=80.0,
        cpu_int8_speedup=0.0, **values, sources={**{n: "test: no GPU" for n in (*values, "gpus")}, "host_ram_gib": "test",
                                                 "storage_read_gbs": "test", "storage_latency_us": "test",
                                                 "cpu_int8_speedup": "test: FMAs alone"})


def one_request(g: Geometry, tokens: int = 9, prefill: int = 4) -> Trace:
    rng = np.random.default_rng(0)
    topk = np.stack([np.stack([rng.choice(g.experts, g.top_k, replace=False) for _ in range(g.layers)])
                     for _ in range(tokens)]).astype(np.int16)
    return Trace(g, [Request(topk, np.full(topk.shape, 1 / g.top_k, np.float32), prefill=prefill, prompt="p")])


def test_the_host_prices_every_part_and_nothing_crosses_a_link():
    preset = get_preset("qwen3-30b-a3b")
    machine = Machine(preset, host_box())
    c = machine.compute(machine.preset.expert_bytes_per_layer())
    assert (c.flops, c.bw, c.expert_bw) == (c.cpu_flops, c.cpu_bw, c.cpu_bw)
    assert c.h2d == math.inf and c.cpu_hop == 0.0 and c.cpu_serial == 1.0
    assert machine.copy_seconds(1e6) == math.inf  # no link: a cost-based policy never copies
    assert machine.box() == "cpu-box (no GPU)"


def test_a_host_box_runs_ggml_types_with_integer_dot_products_in_every_part():
    """llama.cpp on a CPU: a Q4_K_M GGUF's dense part (Q4_K), head (Q6_K) and experts all meet
    int8 activations, at `cpu_int8_speedup` x the FP32 rate; a bf16 dense part keeps the FP32 rate."""
    preset = get_preset("qwen3-30b-a3b")
    vnni = host_box().with_values(cpu_int8_speedup=4.0, sources={"cpu_int8_speedup": "test: AVX512-VNNI"})
    q4, bf16 = parse_precision("q4_k_m"), parse_precision("bf16")

    def machine_head(quant, dense=None):
        return Machine(preset, vnni, quant=quant, dense_quant=dense).head_precision

    def compute(box, dense=None):
        machine = Machine(preset, box, quant=q4, dense_quant=dense)
        return machine.compute(preset.expert_bytes_per_layer(q4))

    plain, fast = compute(host_box()), compute(vnni)
    assert (fast.flops, fast.cpu_flops) == (pytest.approx(4 * plain.flops, rel=1e-12), fast.flops)
    assert machine_head(q4).int_dot  # the Q6_K head: the dense part's kind of kernel
    prompt = 8192  # compute-bound: a quarter of the time
    assert fast.head(prompt) - fast.layer_overhead == pytest.approx((plain.head(prompt) - plain.layer_overhead) / 4)
    assert fast.attn_flops == plain.flops and plain.attn_flops == 0.0  # attention reads the F16 cache with FMAs
    pairs = 10**9  # attention alone: the FP32 rate
    assert fast.dense(0, pairs, 0) == pytest.approx(plain.dense(0, pairs, 0), rel=1e-12)
    mixed = compute(vnni, bf16)
    assert mixed.flops == compute(host_box(), bf16).flops == plain.flops and mixed.attn_flops == 0.0  # FMAs
    assert mixed.cpu_flops == fast.cpu_flops and not machine_head(q4, bf16).int_dot  # --dense-quant bf16: the head too


def test_decode_on_a_host_box_is_the_sum_of_its_parts():
    preset = get_preset("qwen3-30b-a3b")
    machine = Machine(preset, host_box())
    g = preset.geometry
    trace = one_request(g)
    res = run_trace(Run(trace, get_policy("n-cpu-moe"), Capacity(0, per_layer=False), machine))
    c = machine.compute(machine.expert_bytes(trace))
    decode = trace.requests[0].tokens - trace.requests[0].prefill
    per_token = []
    for i in range(decode):  # the i-th decode token reads prefill + i + 1 cached tokens per layer
        p = trace.requests[0].prefill + i + 1
        per_token.append(g.layers * (c.dense(1, p, p) + g.top_k * c.cpu_expert(0, 1)) + c.head(1) + c.step_fixed(1))
    assert res.decode_tokens_per_s == pytest.approx(decode / sum(per_token), rel=1e-9)
    assert res.link_bytes == 0


def test_a_cache_is_refused_on_a_box_without_a_gpu():
    with pytest.raises(FitError, match="no GPU to hold an expert cache.*--global-capacity 0"):
        check_capacity(Capacity(8), 0, 0, 128, 48, "8", "cpu-box (no GPU)", False)
    assert check_capacity(Capacity(0, per_layer=False), 0, 0, 128, 48, "0", "cpu-box (no GPU)", False) is None


def test_the_rest_of_the_model_and_its_kv_take_host_ram_on_a_box_without_a_gpu():
    preset = get_preset("qwen3-30b-a3b")
    experts = sum(preset.expert_bytes_per_layer()) * preset.geometry.experts
    rest = Machine(preset, host_box()).host_weight_bytes()
    ram = (experts + 4 * 2**30 + rest / 2) / 2**30  # the experts fit beside the reserve, the rest does not
    machine = Machine(preset, host_box(ram_gib=ram))
    demand = HostDemand.of(machine, preset.expert_bytes_per_layer(), kv=1e8)
    assert demand.other == pytest.approx(rest + 1e8)
    tier, note = default_host_cache(machine, demand, overcommit=False)
    assert tier is not None and "the rest of the model with its KV cache" in note and "page cache" in note
    left = float(tier.removesuffix("GiB"))
    assert left == pytest.approx((machine.hardware.host_ram_bytes() - demand.other) / 2**30, rel=1e-3)


def test_experts_a_placement_keeps_on_the_gpus_are_not_counted_against_host_ram():
    preset = get_preset("qwen3-30b-a3b")
    nbytes = preset.expert_bytes_per_layer()
    total = sum(nbytes) * preset.geometry.experts
    hw = load_profile("rtx4090x4@gpus=1").with_values(host_ram_gib=(0.6 * total + 4 * 2**30) / 2**30,
                                                        sources={"host_ram_gib": "test"})
    machine = Machine(preset, hw)
    half = preset.geometry.total_experts // 2
    assert HostDemand.of(machine, nbytes, held_on_gpus=half).shortfall(machine) is None  # half on the GPU: fits
    assert "do not fit" in HostDemand.of(machine, nbytes).shortfall(machine)  # a cache copies from all of them


def test_a_mix_of_block_types_runs_at_its_types_kernel_not_the_fp32_rate():
    """A Q4_K_M file's dense part is Q4_K and Q6_K, a mix casmoe has no name for: read as a bare
    width, which names no kernel, it was priced at the FP32 rate (K-quant prefill on the
    llama.cpp box came out at 0.4-0.6 of the measured). Every type of the mix multiplies with
    integer dot products, so the mix does; a mix with a float type keeps the FP32 rate."""
    from casmoe.precision import parse_precision
    from casmoe.sim.cost.machine import _kernel

    width = parse_precision("4.7014bpw")
    assert not width.int_dot
    assert _kernel(width, ("Q4_K", "Q6_K")).int_dot
    assert _kernel(width, ("Q4_0", "Q8_0")).int_dot
    assert not _kernel(width, ("Q4_K", "F16")).int_dot
    assert _kernel(parse_precision("bf16"), ("BF16",)).name == "bf16"
