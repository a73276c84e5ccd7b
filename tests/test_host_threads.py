"""Host compute as a runtime runs it: threads, per-thread bandwidth and matrix units (AMX).

FLOPs scale with the cores in use, DRAM bandwidth with the threads until the sockets' is
reached, and matrix units raise the FLOP peak of prefill-sized host experts
(`HardwareProfile.host_flop_scale`, `host_thread_bw`, read by `Machine.compute`).
"""

from __future__ import annotations

import dataclasses

import pytest
from casmoe.sim.run.grid import Grid
from casmoe.sim.box.hardware import HardwareError, load_profile
from casmoe.sim.cost.machine import Machine
from conftest import one_spec

from casmoe.presets import get_preset

HW = load_profile("rtx4090x4")  # 2x Xeon Gold 6330: 56 cores, 3.58 TFLOPS, 375 GB/s
MIXTRAL = get_preset("mixtral-8x7b")


def compute(hw):
    return Machine(MIXTRAL, hw, 4).compute(MIXTRAL.expert_bytes_per_layer(None))


def test_flops_scale_with_the_cores_in_use_and_no_further():
    full = compute(HW)
    assert compute(HW.with_values(cpu_threads=56, sources={"cpu_threads": "test"})).cpu_flops == full.cpu_flops
    half = compute(HW.with_values(cpu_threads=28, sources={"cpu_threads": "test"}))
    assert half.cpu_flops == pytest.approx(full.cpu_flops / 2, rel=1e-12)
    smt = compute(HW.with_values(cpu_threads=112, sources={"cpu_threads": "test"}))  # two a core share its FMA units
    assert smt.cpu_flops == full.cpu_flops
    assert half.cpu_bw == full.cpu_bw  # no per-thread bandwidth given: the sockets' at any thread count


def test_bandwidth_grows_with_threads_until_the_sockets_saturate():
    per_thread = {"cpu_thread_gbs": "test: 10 GB/s a thread"}
    full = compute(HW)
    for threads in (1, 4, 16, 56):
        hw = HW.with_values(cpu_threads=threads, cpu_thread_gbs=10.0, sources={**per_thread, "cpu_threads": "test"})
        assert compute(hw).cpu_bw == pytest.approx(min(full.cpu_bw, threads * 10e9), rel=1e-12)
    every_core = HW.with_values(cpu_thread_gbs=10.0, sources=per_thread)  # 56 threads: 560 GB/s, above the sockets'
    assert compute(every_core).cpu_bw == full.cpu_bw


def test_thread_scaling_predicts_llama_cpps_measured_sweep():
    """ggml-org/llama.cpp#34 (kiratp, M1 Max, LLaMA-7B q4_0 of 4017.27 MB): a token takes 198.9 ms
    on 1 thread, 102.1 ms on 2, 71.7 ms on 3. One thread's bandwidth fitted on the 1-thread row
    predicts the others (the weights are streamed once a token): 1.2% fast at 2 threads, 7.5%
    fast at 3 (the sweep's later rows flatten as the threads contend)."""
    model_bytes = 4017.27e6
    measured = {1: 198.93e-3, 2: 102.10e-3, 3: 71.71e-3}
    one = model_bytes / measured[1] / 1e9  # GB/s a thread, fitted on the 1-thread row only
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
