"""Software stacks (`casmoe.sim.cost.stack`): shipped files complete and sourced, bad files refused in
one line, and each cost landing in a run's time by its closed form."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from casmoe.cache import Capacity, MissMode
from casmoe.policies import get_policy
from casmoe.shipped import shipped
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.cost.stack import Shared, Stack, StackError, load_shared, load_stack, stack_paths
from casmoe.sim.questions.validation import load_rows
from casmoe.trace import Trace
from casmoe.trace_io import load_trace
from support.builders import seed_box, shaped_preset

NUMERIC = Stack.numeric_fields()


@pytest.fixture(scope="module")
def two_requests() -> Trace:
    whole = load_trace(shipped("tiny-mixtral.npz"))
    return Trace(whole.geometry, whole.requests[:2])


def _run(trace: Trace, stack: Stack, policy: str = "lru", capacity: Capacity = Capacity(8), **kw):
    machine = Machine(shaped_preset(trace.geometry), seed_box(), stack=stack)
    return run_trace(Run(trace, get_policy(policy), capacity, machine, **kw))


# ---- the shipped files ----------------------------------------------------------------------------


FASTER_HIGHER = ("copy_efficiency", "gpu_efficiency", "host_efficiency", "host_flops_efficiency", "numa_aware")
"""Costs a stack is faster by having more of; the rest (microseconds, the launch share) it is faster by having less."""


@pytest.mark.parametrize("name", sorted(stack_paths()))
def test_no_shipped_stack_beats_the_ideal_one_on_any_cost(name: str) -> None:
    """`ideal` is the upper bound every figure on it is called, and the bound `casmoe validate published`
    holds measurements to: no runtime's fitted or stated number may be faster than its (once, ideal's
    host kernels took the shared median share, which ik_llama.cpp's and ktransformers' fits beat)."""
    ideal, stack = load_stack("ideal").resolved().costs(), load_stack(name).resolved().costs()
    for field, best in ideal.items():
        if field == "prefetch_early":  # when prefetches are issued, a behaviour, not a price
            continue
        beats = stack[field] > best if field in FASTER_HIGHER else stack[field] < best
        assert not beats, f"{name}: {field} = {stack[field]} is faster than ideal's {best}"


@pytest.mark.parametrize("name", sorted(stack_paths()))
def test_shipped_stack_loads_with_a_source_for_every_number(name: str) -> None:
    stack = load_stack(name)
    assert stack.name == name
    for field in [*NUMERIC, "numa_aware", "prefetch_early"]:
        assert stack.sources.get(field), f"{name}: {field} has no source"


def test_fitted_fields_name_published_rows_of_that_stack() -> None:
    rows = {r.id: r for r in load_rows()}
    for name in stack_paths():
        stack = load_stack(name)
        for field, ids in stack.fitted_on.items():
            assert field in NUMERIC
            for i in ids:
                assert i in rows, f"{name}.{field} fitted on unknown row {i}"
                assert rows[i].run is not None and rows[i].stack == name, f"{name}.{field}: row {i} runs another stack"


def test_shared_defaults_are_shares() -> None:
    shared = load_shared()
    assert 0 < shared.host_efficiency <= 1 and 0 < shared.host_flops_efficiency <= 1
    assert shared.sources["host_efficiency"]


def test_resolved_takes_the_shared_default_only_for_zeros() -> None:
    ideal = load_stack("ideal")
    shared = Shared(0.3, 0.2, {"host_efficiency": "test", "host_flops_efficiency": "test"})
    own = dataclasses.replace(ideal, host_efficiency=0.7, host_flops_efficiency=0.0)
    assert own.resolved(shared).host_efficiency == 0.7
    assert own.resolved(shared).host_flops_efficiency == 0.2
    zero = dataclasses.replace(ideal, host_efficiency=0.0, host_flops_efficiency=0.0)
    assert zero.resolved(shared).host_efficiency == 0.3
    assert "shared default" in zero.resolved(shared).sources["host_efficiency"]


def test_round_trip_through_toml(tmp_path) -> None:
    stack = dataclasses.replace(load_stack("mixtral-offloading"), name="mine", layer_us=123.5)
    path = stack.write(tmp_path / "mine.toml")
    back = load_stack(path)
    assert back == stack and back.sources == stack.sources and back.fitted_on == stack.fitted_on


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"layer_us": -1.0}, "layer_us must be a finite number >= 0"),
        ({"copy_efficiency": 1.5}, "copy_efficiency must be in (0, 1]"),
        ({"launch_share": 1.5}, "launch_share must be in [0, 1]"),
        ({"host_efficiency": 2.0}, "host_efficiency must be in [0, 1]"),
        ({"numa_aware": "yes"}, "numa_aware must be true or false"),
        ({"speed": 3.0}, "unknown stack fields ['speed']"),
    ],
)
def test_bad_stack_file_is_refused_in_one_line(tmp_path, edit, message) -> None:
    raw = {k: v for k, v in load_stack("ideal").to_dict().items()}
    raw.update(edit)
    with pytest.raises(StackError, match=None) as info:
        Stack.from_dict(raw, "mine.toml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_number_without_a_source_is_refused() -> None:
    raw = load_stack("ideal").to_dict()
    raw["sources"] = {k: v for k, v in raw["sources"].items() if k != "step_us"}
    with pytest.raises(StackError, match="no source given for step_us"):
        Stack.from_dict(raw, "mine.toml")


def test_unknown_stack_names_the_shipped_ones() -> None:
    with pytest.raises(StackError, match="unknown stack 'vllmm'.*llama.cpp"):
        load_stack("vllmm")


# ---- what each cost adds to a run ------------------------------------------------------------------


def test_step_cost_adds_once_per_forward_pass(two_requests) -> None:
    ideal = load_stack("ideal")
    base = _run(two_requests, ideal)
    slow = _run(two_requests, dataclasses.replace(ideal, step_us=1000.0))
    passes = base.decode_tokens + base.requests  # a prefill per request, a pass per decode token
    assert slow.sim_time_s - base.sim_time_s == pytest.approx(passes * 1e-3, rel=1e-9)


def test_layer_cost_adds_per_block_of_every_pass(two_requests) -> None:
    """Each MoE layer and the LM head (the module calls of a pass) pay `layer_us`."""
    ideal = load_stack("ideal")
    base = _run(two_requests, ideal)
    slow = _run(two_requests, dataclasses.replace(ideal, layer_us=1000.0))
    passes = base.decode_tokens + base.requests
    blocks = two_requests.geometry.layers + 1
    assert slow.sim_time_s - base.sim_time_s == pytest.approx(passes * blocks * 1e-3, rel=1e-9)


def test_launch_share_scales_the_profiles_launch_overheads(two_requests) -> None:
    """A runtime paying every launch pays the profile's per-block and per-expert overheads once
    each: the same time as those overheads charged as its own `layer_us` and `expert_us`."""
    ideal = load_stack("ideal")
    hw = seed_box()
    assert ideal.launch_share == 0.0
    launches = _run(two_requests, dataclasses.replace(ideal, launch_share=1.0))
    own = _run(two_requests, dataclasses.replace(ideal, layer_us=hw.layer_overhead_us, expert_us=hw.expert_overhead_us))
    half = _run(two_requests, dataclasses.replace(ideal, launch_share=0.5))
    base = _run(two_requests, ideal)
    assert launches.sim_time_s == pytest.approx(own.sim_time_s, rel=1e-12)
    assert base.sim_time_s < half.sim_time_s < launches.sim_time_s
    assert dataclasses.replace(ideal, launch_share=0.5).upper_bound is False and ideal.upper_bound


def test_a_stack_file_of_before_launch_share_pays_every_launch() -> None:
    raw = load_stack("hf-accelerate").to_dict()
    del raw["launch_share"]
    raw["sources"] = {k: v for k, v in raw["sources"].items() if k != "launch_share"}
    stack = Stack.from_dict(raw, "old.toml")
    assert stack.launch_share == 1.0 and "not stated in the file" in stack.sources["launch_share"]


def test_expert_loop_cost_adds_per_expert_of_every_moe_layer_passed(two_requests) -> None:
    """Routed or not: a runtime that walks all of a layer's experts pays for each."""
    ideal = load_stack("ideal")
    base = _run(two_requests, ideal)
    slow = _run(two_requests, dataclasses.replace(ideal, expert_loop_us=10.0))
    g = two_requests.geometry
    passes = base.decode_tokens + base.requests
    assert slow.sim_time_s - base.sim_time_s == pytest.approx(passes * g.layers * g.experts * 10e-6, rel=1e-9)


def test_expert_cost_adds_per_expert_run(two_requests) -> None:
    """Per (pass, layer, distinct routed expert): a prefill runs each expert its prompt routes once."""
    ideal = load_stack("ideal")
    base = _run(two_requests, ideal)
    slow = _run(two_requests, dataclasses.replace(ideal, expert_us=1000.0))
    runs = 0
    for r in two_requests.requests:
        prompt, decode = r.topk[: r.prefill], r.topk[r.prefill:]
        runs += sum(len(np.unique(prompt[:, layer])) for layer in range(prompt.shape[1]))
        runs += int((decode >= 0).sum())
    assert slow.sim_time_s - base.sim_time_s == pytest.approx(runs * 1e-3, rel=1e-9)


def test_host_expert_cost_adds_per_host_computed_expert(two_requests) -> None:
    ideal = load_stack("ideal")
    kw = {"policy": "ondemand", "capacity": Capacity(2), "miss_mode": MissMode.CPU}
    base = _run(two_requests, ideal, **kw)
    slow = _run(two_requests, dataclasses.replace(ideal, host_expert_us=1000.0), **kw)
    assert base.stats.cpu_computed > 0
    grew = slow.sim_time_s - base.sim_time_s
    # host experts of one layer run one after another on the host (cpu_serial) or side by side
    assert 0 < grew <= base.stats.cpu_computed * 1e-3 * (1 + 1e-9)


def test_copy_efficiency_slows_copies_in_proportion(two_requests) -> None:
    ideal = load_stack("ideal")
    hw = load_profile("rtx4090x4")
    half = dataclasses.replace(ideal, copy_efficiency=0.5)
    g = two_requests.geometry
    assert Machine(shaped_preset(g), hw, stack=half).copy_rate() == pytest.approx(0.5 * Machine(shaped_preset(g), hw).copy_rate())
    base = _run(two_requests, ideal, policy="ondemand", capacity=Capacity(2))
    slow = _run(two_requests, half, policy="ondemand", capacity=Capacity(2))
    assert slow.link_bytes == base.link_bytes
    # on demand, every copy is waited for: each byte takes twice as long
    rate = Machine(shaped_preset(g), hw).copy_rate()
    assert slow.sim_time_s - base.sim_time_s == pytest.approx(base.link_bytes / rate, rel=1e-9)


def test_numa_unaware_stack_reads_one_socket() -> None:
    hw = dataclasses.replace(load_profile("rtx4090x4"), cpu_sockets=2)
    g = load_trace(shipped("tiny-mixtral.npz")).geometry
    preset = shaped_preset(g)
    nbytes = [1 << 20] * g.layers
    aware = Machine(preset, hw, stack=dataclasses.replace(load_stack("ideal"), numa_aware=True)).compute(nbytes)
    unaware = Machine(preset, hw, stack=dataclasses.replace(load_stack("ideal"), numa_aware=False)).compute(nbytes)
    assert unaware.cpu_bw == pytest.approx(aware.cpu_bw / 2)


def test_host_efficiency_comes_from_the_profile_before_the_stack() -> None:
    hw = load_profile("rtx4090x4")
    g = load_trace(shipped("tiny-mixtral.npz")).geometry
    preset = shaped_preset(g)
    nbytes = [1 << 20] * g.layers
    stack = dataclasses.replace(load_stack("ideal"), host_efficiency=0.5)
    from_stack = Machine(preset, dataclasses.replace(hw, cpu_mem_efficiency=0.0), stack=stack).compute(nbytes)
    from_profile = Machine(preset, dataclasses.replace(hw, cpu_mem_efficiency=0.25), stack=stack).compute(nbytes)
    assert from_stack.cpu_bw == pytest.approx(hw.cpu_mem_bw_gbs * 1e9 * 0.5)
    assert from_profile.cpu_bw == pytest.approx(hw.cpu_mem_bw_gbs * 1e9 * 0.25)


def test_early_prefetch_is_never_slower_for_a_guessing_policy(two_requests) -> None:
    """Speculative loading issued once the previous layer routed overlaps more of that layer."""
    ideal = load_stack("ideal")
    late = _run(two_requests, ideal, policy="speculative", capacity=Capacity(4))
    early = _run(two_requests, dataclasses.replace(ideal, prefetch_early=True), policy="speculative", capacity=Capacity(4))
    same = dataclasses.replace(early.stats, hits=late.stats.hits, late_hits=late.stats.late_hits)
    assert same == late.stats  # the same decisions (a late hit may land in time) ...
    assert early.stats.hits + early.stats.late_hits == late.stats.hits + late.stats.late_hits
    assert early.sim_time_s <= late.sim_time_s  # ... issued sooner
    assert early.stall_late_s < late.stall_late_s


def test_a_stack_is_told_apart_by_what_it_charges_not_its_name(tmp_path) -> None:
    """A user's file named like a shipped stack is that stack only if it charges the same: an
    edited `ideal` is no upper bound, an edited mixtral-offloading is not the validated one, and
    two stacks of one name in one run stay two rows."""
    shipped = load_stack("ideal")
    copy = tmp_path / "ideal.toml"
    copy.write_text(shipped.to_toml())
    same = load_stack(str(copy))
    assert same.shipped and same.label == "ideal" and same.upper_bound
    copy.write_text(dataclasses.replace(shipped, layer_us=500.0).to_toml())
    edited = load_stack(str(copy))
    assert not edited.shipped and edited.label == "ideal (ideal.toml)" and not edited.upper_bound
    mixoff = tmp_path / "mine.toml"
    mixoff.write_text(dataclasses.replace(load_stack("mixtral-offloading"), layer_us=1.0).to_toml())
    assert load_stack(str(mixoff)).label == "mixtral-offloading (mine.toml)"
    assert load_stack("mixtral-offloading").label == "mixtral-offloading" and not load_stack("mixtral-offloading").upper_bound
