"""Host RAM is a budget: the profile keeps some for the OS and the runtime, a RAM tier never takes
more than the rest, and experts that fit neither the GPUs nor that budget are read from storage at
storage's price in every mode, the host-computed ones of the placements too."""

from __future__ import annotations

import numpy as np
import pytest
from support.builders import sim_run

import casmoe.sim
from casmoe.cache import Capacity
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.policies import get_policy
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.box.hardware import GIB, HOST_RESERVED_GIB, HardwareError, load_profile
from casmoe.sim.passes.tiers import HostCache
from casmoe.trace import Request, Trace

HW = load_profile("rtx4090x4")
MIXTRAL = dict(model="mixtral-8x7b", global_capacities=["fit"], requests=2)  # bf16 experts: about 90 GB
LRU_FIT = dict(MIXTRAL, policies=["lru"])


def _box(ram: float) -> str:
    return f"rtx4090x4@gpus=1,host_ram_gib={ram:g}"


def test_shipped_profiles_keep_a_sourced_reserve_for_the_os_and_runtime():
    assert HW.host_reserved_gib == HOST_RESERVED_GIB > 0 and "server" in HW.sources["host_reserved_gib"]
    assert HW.host_ram_bytes() == (HW.host_ram_gib - HOST_RESERVED_GIB) * GIB
    assert load_profile(_box(16)).host_ram_bytes() == (16 - HOST_RESERVED_GIB) * GIB  # a variant keeps the reserve
    with pytest.raises(HardwareError, match="leaves nothing beside the 4 GiB .* for the OS"):
        load_profile(_box(3))


@pytest.mark.parametrize("policy", ["ktransformers", "n-cpu-moe", "fiddler", "hybrimoe", "routed-placement"])
def test_a_host_computing_placement_slows_down_as_host_ram_shrinks_below_its_experts(policy):
    speed, storage = {}, {}
    for ram in (16, 64, 96, 256):
        res = casmoe.sim.simulate(hardware=_box(ram), policies=[policy], **MIXTRAL)
        (rec,) = [r for r in res.records if r["policy"] == policy]
        speed[ram], storage[ram] = rec["decode_tokens_per_s"], rec["stall_storage_s"]
    assert speed[96] == speed[256] and storage[96] == storage[256] == 0  # 92 GiB of budget: every expert fits
    assert speed[16] < speed[64] < speed[96]  # the rest is read from storage, more of it with less RAM
    assert storage[16] > storage[64] > 0


def test_the_ram_tier_never_exceeds_host_ram_less_the_reserve():
    for ram in (16, 48, 64):
        res = casmoe.sim.simulate(hardware=_box(ram), **LRU_FIT)
        (rec,) = res.records
        assert 0 < rec["host_cache_gb"] * 1e9 <= (ram - HOST_RESERVED_GIB) * GIB
        left = f"the {ram - HOST_RESERVED_GIB:g} GiB of host RAM"
        assert any(left in n and "kept for the OS" in n for n in res.notes)
    with pytest.raises(CasmoeError, match="exceeds the 60 GiB .* give --host-cache 60GiB or less"):
        casmoe.sim.simulate(hardware=_box(64), host_cache="61GiB", **LRU_FIT)
    casmoe.sim.simulate(hardware=_box(64), host_cache="60GiB", **LRU_FIT)


def _alternating(tokens: int, b: int) -> Trace:
    """One layer of 4 experts, top-1: decode tokens routing experts 0, 1, 0, 1, ..."""
    g = Geometry(1, 4, 1, hidden=8, intermediate=4, layer_expert_bytes=(b,))
    topk = np.array([[[t % 2]] for t in range(tokens)], np.int16)  # [T, L, k]
    return Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0)])


@pytest.mark.parametrize("rows,reads", [(1, 4), (2, 2)])
def test_host_experts_missing_from_ram_stall_on_a_storage_read_each(rows, reads):
    """Every expert on the host (n-cpu-moe, no GPU slot), a RAM tier of `rows` experts: with one
    row the alternating experts miss every token, with two only the first two. Each miss waits
    storage latency + bytes / read rate before the host computes it (the drive is idle)."""
    b, c = 64_000_000, 1e-3
    tier = HostCache(rows, get_policy("lru"), chunk_bytes=2**20)
    res = sim_run(_alternating(4, b), "n-cpu-moe", Capacity(0, per_layer=False), HW,
                  compute=FixedCompute(cpu_expert_s=c), host_cache=tier)
    read = HW.storage_latency_us * 1e-6 + b / (HW.storage_read_gbs * 1e9)
    assert res.stall_storage_s == pytest.approx(reads * read, rel=1e-12)
    assert res.stall_demand_s == pytest.approx(reads * read, rel=1e-12)
    assert res.sim_time_s == pytest.approx(4 * c + reads * read, rel=1e-12)
    assert (res.host_misses, res.host_hits, res.storage_bytes) == (reads, 4 - reads, reads * b)
    assert res.host_storage_reads == reads  # the record says the host's experts came from storage
    assert res.link_bytes == 0  # nothing crossed the GPU link
    whole = sim_run(_alternating(4, b), "n-cpu-moe", Capacity(0, per_layer=False), HW,
                    compute=FixedCompute(cpu_expert_s=c))
    assert whole.stall_s == 0 and whole.sim_time_s == pytest.approx(4 * c)  # every expert in RAM: no read


def test_the_cpu_miss_mode_reads_its_host_experts_through_the_tier_too():
    from casmoe.cache import MissMode

    b = 64_000_000
    res = sim_run(_alternating(4, b), "lru", 1, HW, compute=FixedCompute(cpu_expert_s=1e-3), miss_mode=MissMode.CPU,
                  host_cache=HostCache(1, get_policy("lru"), chunk_bytes=2**20))
    assert res.stall_storage_s > 0 and res.storage_bytes >= b


def test_no_ram_tier_when_the_experts_do_not_fit_is_refused_naming_the_default():
    args = dict(hardware=_box(64), policies=["lru"], global_capacities=["fit"], requests=2, model="mixtral-8x7b")
    with pytest.raises(CasmoeError, match="--host-cache none keeps every expert in host RAM, but .* give "
                                          "--host-cache 60GiB .* or --allow-overcommit"):
        casmoe.sim.simulate(host_cache="none", **args)
    (rec,) = casmoe.sim.simulate(host_cache="none", allow_overcommit=True, **args).records  # a what-if
    assert rec["host_cache_gb"] == 0 and rec["storage_bytes"] == 0


def test_served_one_user_prices_host_experts_from_storage_as_back_to_back():
    from casmoe.sim.passes.traffic import Arrival, Traffic

    b = 64_000_000
    kw = dict(compute=FixedCompute(cpu_expert_s=1e-3))
    tier = HostCache(1, get_policy("lru"), chunk_bytes=2**20)
    offline = sim_run(_alternating(4, b), "n-cpu-moe", Capacity(0, per_layer=False), HW, host_cache=tier, **kw)
    served = sim_run(_alternating(4, b), "n-cpu-moe", Capacity(0, per_layer=False), HW, host_cache=tier,
                     traffic=Traffic(Arrival.CLOSED, users=1, max_batch=1), **kw)
    assert offline.stall_storage_s > 0
    assert served.stall_storage_s == pytest.approx(offline.stall_storage_s, rel=1e-12)
    assert served.sim_time_s == pytest.approx(offline.sim_time_s, rel=1e-12)
