"""Host compute as a runtime runs it: threads, per-thread bandwidth, matrix units (AMX) and
integer dot products (VNNI).

FLOPs scale with the cores in use, DRAM bandwidth with the threads until the sockets' is
reached, matrix units raise the FLOP peak of prefill-sized host experts, and integer dot
products that of ggml's quantised experts (`HardwareProfile.host_flop_scale`,
`host_int_flop_scale`, `host_thread_bw`, read by `Machine.compute`).
"""

from __future__ import annotations

import dataclasses

import pytest
from casmoe.sim.run.grid import Grid
from casmoe.sim.box.hardware import HardwareError, load_profile
from casmoe.sim.cost.machine import Machine
from support.builders import one_spec

from casmoe.precision import parse_precision
from casmoe.presets import get_preset

HW = load_profile("rtx4090x4").with_values(  # 2x Xeon Gold 6330: 56 cores, 3.58 TFLOPS, 375 GB/s
    cpu_int8_speedup=0.0, sources={"cpu_int8_speedup": "test: no integer dot products (the shipped profile's VNNI: 4)"})
MIXTRAL = get_preset("mixtral-8x7b")


def compute(hw, quant=None):
    machine = Machine(MIXTRAL, hw, 4, quant=None if quant is None else parse_precision(quant))
    return machine.compute(MIXTRAL.expert_bytes_per_layer(machine.quant))


def vnni(hw=HW, speedup=4.0):
    return hw.with_values(cpu_int8_speedup=speedup, sources={"cpu_int8_speedup": "test: AVX512-VNNI"})


def host_roofline(c, layer, tokens):
    """A host expert's roofline time: `cpu_expert` less its activations' transfers and the runtime's cost."""
    return c.cpu_expert(layer, tokens) - 2 * (c.cpu_hop + 2 * c.hidden * tokens / c.h2d) - c.host_expert_overhead


def test_flops_scale_with_the_cores_in_use_and_no_further():
    full = compute(HW)
    assert compute(HW.with_values(cpu_threads=56, sources={"cpu_threads": "test"})).cpu_flops == full.cpu_flops
    half = compute(HW.with_values(cpu_threads=28, sources={"cpu_threads": "test"}))
    assert half.cpu_flops == pytest.approx(full.cpu_flops / 2, rel=1e-12)
    smt = compute(HW.with_values(cpu_threads=112, sources={"cpu_threads": "test"}))  # two a core share its FMA units
    assert smt.cpu_flops == full.cpu_flops
    assert half.cpu_bw == full.cpu_bw  # no per-thread bandwidth given: the sockets' at any thread count


def test_bandwidth_grows_with_threads_until_the_sockets_saturate():
    """The kernels' share (the stack's host efficiency) of what the threads stream, STREAM's rate
    of as many threads, up to the sockets' peak."""
    per_thread = {"cpu_thread_gbs": "test: 10 GB/s a thread"}
    full = compute(HW)
    share = full.cpu_bw / (HW.cpu_mem_bw_gbs * 1e9)  # one copy of the weights on each socket: the sockets' sum
    for threads in (1, 4, 16, 56):
        hw = HW.with_values(cpu_threads=threads, cpu_thread_gbs=10.0, sources={**per_thread, "cpu_threads": "test"})
        assert compute(hw).cpu_bw == pytest.approx(min(full.cpu_bw, share * threads * 10e9), rel=1e-12)
    every_core = HW.with_values(cpu_thread_gbs=10.0, sources=per_thread)  # 56 threads: 560 GB/s, above the sockets'
    assert compute(every_core).cpu_bw == full.cpu_bw


def test_thread_scaling_predicts_llama_cpps_measured_sweep():
    """ggml-org/llama.cpp#34 (kiratp, M1 Max, LLaMA-7B q4_0 of 4017.27 MB): a token takes 198.9 ms
    on 1 thread, 102.1 ms on 2, 71.7 ms on 3. One thread's bandwidth fitted on the 1-thread row
    predicts the others (the weights are streamed once a token): 1.2% fast at 2 threads, 7.5%
    fast at 3 (the sweep's later rows flatten as the threads contend)."""
    model_bytes = 4017.27e6
    measured = {1: 198.93e-3, 2: 102.10e-3, 3: 71.71e-3}
    share = compute(HW).cpu_bw / (HW.cpu_mem_bw_gbs * 1e9)  # the stack's host efficiency
    one = model_bytes / measured[1] / 1e9 / share  # STREAM's GB/s a thread, fitted on the 1-thread row only
    box = HW.with_values(cpu_cores=8, cpu_thread_gbs=one, cpu_mem_bw_gbs=400.0,
                         sources={"cpu_cores": "M1 Max: 8 performance cores",
                                  "cpu_thread_gbs": "fitted: llama.cpp#34 1 thread",
                                  "cpu_mem_bw_gbs": "Apple M1 Max: 400 GB/s"})
    for threads, seconds in measured.items():
        hw = box.with_values(cpu_threads=threads, sources={"cpu_threads": "llama.cpp -t"})
        assert model_bytes / compute(hw).cpu_bw == pytest.approx(seconds, rel=0.08)


def test_matrix_units_speed_up_prefill_sized_host_experts_not_decode():
    """KTransformers' AMX backend docs: AMX tiles deliver 8x the theoretical throughput of
    AVX-512 (ktransformers.net, docs/optimization-techniques/amx)."""
    plain = compute(HW)
    amx = compute(HW.with_values(cpu_matrix_speedup=8.0,
                                 sources={"cpu_matrix_speedup": "KTransformers AMX: 8x AVX-512"}))
    assert amx.cpu_flops == pytest.approx(8 * plain.cpu_flops, rel=1e-12)
    assert amx.cpu_expert(0, 1) == plain.cpu_expert(0, 1)  # one decode token streams the weights
    prompt = 4096
    assert amx.cpu_expert(0, prompt) < plain.cpu_expert(0, prompt) / 4


def test_threads_are_a_variant_an_option_and_shown():
    eight = load_profile("rtx4090x4@cpu_threads=8")
    assert eight.cpu_threads == 8 and eight.name == "rtx4090x4@cpu_threads=8"
    specs = Grid.of({"policy": "lru", "capacity": "4", "requests": 2, "cpu_threads": [8, 56]}).specs().specs
    assert [s.machine.hardware.cpu_threads for s in specs] == [8, 56] and specs[0].key != specs[1].key
    assert one_spec().machine.hardware.cpu_threads == 0
    assert HW.describe_host() == "3.58 TFLOPS, 375 GB/s, 56 cores"
    assert "56 cores (8 threads)" in eight.describe_host()
    with pytest.raises(HardwareError, match="cpu_cores"):
        load_profile("rtx4090x4@cpu_threads=8").with_values(cpu_cores=0, sources={"cpu_cores": "test"})
    no_cores = dataclasses.replace(HW, cpu_cores=0)
    from casmoe.sim.box.hardware import variant

    with pytest.raises(HardwareError, match="does not say how many cores"):
        variant(no_cores, cpu_threads=4)
    with pytest.raises(HardwareError, match="cpu_matrix_speedup"):
        HW.with_values(cpu_matrix_speedup=0.5, sources={"cpu_matrix_speedup": "test"})


def test_integer_dot_products_speed_up_ggml_experts_where_compute_bound_only():
    """ggml multiplies Q4_K weights by int8 activations (vec_dot_type Q8_K); with AVX512-VNNI
    `vpdpbusd` does 4 multiply-adds a 32-bit lane where an FP32 FMA does 1."""
    plain, fast = compute(HW, "q4_k_s"), compute(vnni(), "q4_k_s")  # every expert tensor Q4_K
    assert fast.cpu_flops == pytest.approx(4 * plain.cpu_flops, rel=1e-12)
    prompt = 4096  # compute-bound at either rate: a quarter of the time
    assert host_roofline(fast, 0, prompt) == pytest.approx(host_roofline(plain, 0, prompt) / 4, rel=1e-9)
    assert fast.cpu_expert(0, 1) == plain.cpu_expert(0, 1)  # one decode token: bandwidth-bound at either rate
    assert host_roofline(fast, 0, 1) == pytest.approx(fast.expert_bytes[0] / fast.cpu_bw, rel=1e-12)
    q8_plain, q8_fast = compute(HW, "q8_0"), compute(vnni(), "q8_0")  # legacy Q8_0: integer dot products too
    assert q8_fast.cpu_flops == pytest.approx(4 * q8_plain.cpu_flops, rel=1e-12)


def test_float_experts_and_profiles_without_the_field_keep_the_fp32_rate():
    for quant in (None, "bf16", "fp8", "int4", "hqq2", "nf4", "gptq4"):  # None: Mixtral's bf16 checkpoint
        assert compute(vnni(), quant) == compute(HW, quant), quant
    assert HW.cpu_int8_speedup == 0 and HW.host_int_flop_scale == HW.host_flop_scale
    assert compute(load_profile("rtx4090x4"), "q4_k_m") == compute(vnni(), "q4_k_m")  # the shipped profile: VNNI
    one = vnni(speedup=1.0)
    assert compute(one, "q4_k_m") == compute(HW, "q4_k_m")


def test_matrix_units_and_integer_dot_products_do_not_multiply():
    """AMX tiles and VNNI are two routes to an int8 product: a kernel takes one, so ggml's
    types run at the larger speedup and float experts at the matrix units' alone."""
    amx = HW.with_values(cpu_matrix_speedup=8.0, sources={"cpu_matrix_speedup": "test"})
    both = vnni(amx)
    assert compute(both, "q4_k_m").cpu_flops == pytest.approx(8 * compute(HW, "q4_k_m").cpu_flops, rel=1e-12)
    assert compute(both).cpu_flops == compute(amx).cpu_flops
    wide = vnni(HW.with_values(cpu_matrix_speedup=2.0, sources={"cpu_matrix_speedup": "test"}))
    assert compute(wide, "q4_k_m").cpu_flops == pytest.approx(4 * compute(HW, "q4_k_m").cpu_flops, rel=1e-12)
    assert both.describe_host() == "3.58 TFLOPS, 375 GB/s, 56 cores, matrix units x8, int8 dot products x4"


@pytest.mark.parametrize("value, words", [(0.5, "cpu_int8_speedup must be >= 1"), (20.0, "beyond any real box")])
def test_an_int8_speedup_below_one_or_beyond_any_real_part_is_refused_in_one_line(value, words):
    with pytest.raises(HardwareError, match=words) as refused:
        vnni(speedup=value)
    assert "\n" not in str(refused.value) and "cpu_int8_speedup" in str(refused.value)


def test_bf16_dot_products_speed_up_bf16_weights_only():
    """AVX512_BF16 (`cpu_bf16_speedup`) doubles the host's rate on BF16 weights (ggml's BF16 kernels
    under __AVX512BF16__); ggml's block types keep their integer dot products' rate."""
    bf16 = HW.with_values(cpu_bf16_speedup=2.0, sources={"cpu_bf16_speedup": "test: AVX512_BF16"})
    assert compute(bf16, "bf16").cpu_flops == pytest.approx(2 * compute(HW, "bf16").cpu_flops, rel=1e-12)
    assert compute(bf16, "q4_k_m").cpu_flops == compute(HW, "q4_k_m").cpu_flops
    assert compute(bf16, "bf16").cpu_bw == compute(HW, "bf16").cpu_bw  # decode streams the same bytes
