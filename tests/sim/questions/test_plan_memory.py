"""The memory map of `casmoe plan`: it never exceeds the box it fits, it says what does not fit and
why, GPUs of different sizes are each filled to their own map, each engine's KV cache and reserve
are counted its own way, and the map is the simulator's own fit check (one definition: a placement
the map fits is one the simulator runs without overcommit, and one past it is refused)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe import engine_memory
from casmoe.cache import Capacity
from casmoe.presets import get_preset, load_presets
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.cost.stack import load_stack
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy.placement import first_layers, place
from casmoe.sim.run.fits import check_kv

ENGINES = {"llama.cpp": "llama.cpp", "ktransformers": "ktransformers", "vllm": "vllm", "casmoe": "ideal"}
PRESETS = ("qwen3-30b-a3b", "gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b", "deepseek-v2-lite", "olmoe-1b-7b")
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
BOX = "rtx4090x4@gpus=1,host_ram_gib=64"


def box(*gpus: float, ram: float = 64.0, nodes: int = 1) -> mem.Box:
    return mem.Box("test", tuple(gpus), ram, nodes, 12, "test", 2.0)


def machine(name: str, stack: str = "llama.cpp", devices: int = 1, quant: str | None = None,
            hardware: str = BOX) -> Machine:
    from casmoe.options import parse_quant

    return Machine(get_preset(name), load_profile(hardware), devices, parse_quant(quant), stack=load_stack(stack).resolved())


@FAST
@given(name=st.sampled_from(PRESETS), engine=st.sampled_from(sorted(ENGINES)),
       gpus=st.lists(st.sampled_from([8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 80.0]), min_size=1, max_size=3),
       ram=st.sampled_from([16.0, 32.0, 64.0, 128.0, 512.0]), nodes=st.integers(1, 2),
       context=st.sampled_from([512, 4096, 32768, 131072]), concurrency=st.integers(1, 4),
       unit=st.sampled_from(["layer", "expert"]), seed=st.integers(0, 3))
def test_a_placement_never_fills_a_gpu_past_its_memory(name, engine, gpus, ram, nodes, context, concurrency, unit, seed):
    m = machine(name, ENGINES[engine], len(gpus))
    base = mem.base(m, box(*gpus, ram=ram, nodes=nodes), context, concurrency)
    g = m.preset.geometry
    order = list(np.random.default_rng(seed).permutation(g.layers if unit == "layer" else g.total_experts))
    pl = place(base, g.experts, order, unit)
    mm = pl.memory
    for gm, room in zip(mm.gpus, base.expert_room()):
        assert gm.experts <= room  # experts only take what the rest left
        if base.gpus[gm.index].free >= 0:
            assert gm.used <= gm.total
    # every expert is somewhere, once
    assert pl.count + sum(h.expert_count for h in mm.host) == g.total_experts
    assert len({e for ids in pl.gpu for e in ids}) == pl.count
    # a map fits exactly when nothing is over
    paged = mm.mmap  # llama.cpp reads host experts beyond RAM from the drive: slow, not a failure
    over = any(x.free < 0 for x in mm.gpus) or any(
        h.free < 0 and not (paged and h.reserve + h.other <= h.total) for h in mm.host)
    assert mm.fits == (not over) and bool(mm.problems) == over
    assert any(n.startswith("host RAM: over by") for n in mm.notes) == (paged and any(h.free < 0 for h in mm.host))
    d = mm.to_dict()
    assert d["fits"] == mm.fits and len(d["gpus"]) == len(gpus) and len(d["host"]) == nodes


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v2-lite", "mixtral-8x7b"])
@pytest.mark.parametrize("engine", ["llama.cpp", "ktransformers", "vllm", "casmoe"])
@pytest.mark.parametrize("context", [4096, 32768])
def test_the_map_and_the_simulators_fit_check_are_one_definition(name, engine, context):
    """The GPU a plan fills to its last expert is, to the byte, what the simulator's own check holds:
    the map's placement passes `check_kv` (no overcommit), one more expert of its size does not."""
    m = machine(name, ENGINES[engine], quant="q4_k_m")
    base = mem.base(m, box(m.hardware.memory_gib), context, 1)
    g = m.preset.geometry
    free = m.free_bytes(0, range(g.layers)) - sum(m.kv_bytes(context, 1))
    assert base.gpus[0].free == pytest.approx(free, abs=2)  # the same bytes, by the same functions
    pl = place(base, g.experts, list(range(g.total_experts)), "expert")
    nbytes = list(base.gpu_expert_bytes)
    where = m.hardware.name
    if pl.rule != "all":
        assert check_kv(m, nbytes, Capacity(pl.count, per_layer=False), str(pl.count), context, 1, "--batch", where,
                        False) is None
        room = pl.memory.gpus[0].free
        nxt = nbytes[pl.count // g.experts]  # the next expert of the order: no room for it, by either count
        if room >= nxt:
            with pytest.raises(Exception, match="does not fit"):
                check_kv(m, nbytes, Capacity(pl.count + 1, per_layer=False), str(pl.count + 1), context, 1,
                         "--batch", where, False)


def test_what_does_not_fit_is_said_with_why():
    m = machine("gpt-oss-120b")
    tight = mem.base(m, box(8.0, ram=32.0), 131072, 8)
    assert not tight.fits and "runtime reserve, dense weights, embeddings and KV cache alone" in tight.problems[0]
    kt = machine("gpt-oss-120b", "ktransformers")
    pl = first_layers(mem.base(kt, box(24.0, ram=32.0), 4096, 1), m.preset.geometry.experts)
    assert not pl.memory.fits
    assert any(x.startswith("host node 0: over by") and "host experts" in x for x in pl.memory.problems)
    # llama.cpp memory-maps the model: what RAM does not hold is read from the drive, said and priced so
    paged = first_layers(mem.base(m, box(24.0, ram=32.0), 4096, 1), m.preset.geometry.experts)
    assert paged.memory.fits and any(n.startswith("host RAM: over by") for n in paged.memory.notes)


def test_gpus_of_different_sizes_are_each_filled_to_their_own_room():
    """llama.cpp #15136: --n-cpu-moe puts a layer's experts with its layer's GPU whatever room
    that GPU has; the plan fills each GPU to its own map, the small one too."""
    m = machine("qwen3-30b-a3b", devices=2)
    base = mem.base(m, box(24.0, 12.0, ram=128.0), 8192, 1)
    assert [len(g.layers) for g in base.gpus] == [32, 16]  # layers split as the memory is (-ts 24,12)
    g = m.preset.geometry
    pl = place(base, g.experts, list(range(g.layers - 1, -1, -1)), "layer")
    assert pl.memory.fits and all(gm.experts > 0 and gm.free >= 0 for gm in pl.memory.gpus)
    layer = base.gpu_expert_bytes[0] * g.experts
    assert max(gm.free for gm in pl.memory.gpus) < layer  # no GPU had room for one more layer
    assert base.gpus[0].embeddings == 0 and base.gpus[1].embeddings > 0  # llama.cpp: the head goes with the last layer


def test_kv_cache_as_each_engine_sizes_it():
    p = get_preset("gpt-oss-120b")  # 36 blocks, every second one a 128-token window
    values = 2 * 8 * 64
    full = 18 * 32768 * values * 2
    # llama.cpp: a window block keeps GGML_PAD(window + ubatch, 256) = 768 cells (memory.toml window_pad)
    assert sum(machine("gpt-oss-120b", "llama.cpp").kv_bytes(32768, 1)) == full + 18 * 768 * values * 2
    assert sum(machine("gpt-oss-120b", "vllm").kv_bytes(32768, 2)) == 2 * (full + 18 * 128 * values * 2)
    assert sum(machine("qwen3-30b-a3b", "ktransformers").kv_bytes(1000, 3)) == 3 * 48 * 1000 * 2 * 4 * 128 * 2
    assert p.blocks == 36


def test_sglangs_reserve_is_its_own_formula():
    """server_args.py at d2b3c7fb: 512 + 1.5 x 2048 + 2 x 24 + 128 MiB on a 24 GiB GPU."""
    total = 24 * mem.GIB
    assert mem.sglang_mem_fraction(total) == round((24 * 1024 - (512 + 3072 + 48 + 128)) / (24 * 1024), 3)
    assert mem.sglang_reserve(80 * mem.GIB) == (512 + 1.5 * 8192 + 2 * 256 + 128) * mem.MIB  # below 90 GiB
    kt = machine("qwen3-30b-a3b", "ktransformers").gpu_resident(0, range(48))
    assert kt.reserve == mem.sglang_reserve(24 * mem.GIB)


def test_the_engines_memory_habits_follow_the_stack_and_the_rest_keep_the_profiles():
    assert engine_memory.engine_of_stack("llama.cpp") == "llama.cpp"
    assert engine_memory.engine_of_stack("ktransformers") == "ktransformers"
    assert engine_memory.engine_of_stack("ideal") == engine_memory.PROFILE
    ideal = machine("qwen3-30b-a3b", "ideal")
    assert ideal.gpu_resident(0, range(48)).reserve == ideal.hardware.reserved_gib * mem.GIB
    assert ideal.free_bytes(0, range(48)) == pytest.approx(
        ideal.hardware.usable_bytes() - ideal.dense_weight_bytes(48) - ideal.table_bytes() - ideal.head_bytes(), abs=1)


def test_llama_cpp_keeps_the_embedding_table_on_the_host():
    llama = mem.base(machine("qwen3-30b-a3b", "llama.cpp"), box(24.0), 4096, 1)
    kt = mem.base(machine("qwen3-30b-a3b", "ktransformers"), box(24.0), 4096, 1)
    m = machine("qwen3-30b-a3b")
    table, head = m.table_bytes(), m.head_bytes()
    assert llama.gpus[0].embeddings == int(head) and llama.host[0].other == int(table)
    assert kt.gpus[0].embeddings == int(table + head) and kt.host[0].other == 0


def test_a_box_without_a_gpu_holds_the_whole_model_in_host_ram():
    from casmoe.sim.box.hardware import GPU_FIELDS

    cpu_only = load_profile(BOX).with_values({}, gpus=0, **{f: 0 for f in GPU_FIELDS})
    m = Machine(get_preset("qwen3-30b-a3b"), cpu_only, 1, stack=load_stack("llama.cpp").resolved())
    base = mem.base(m, box(ram=64.0), 4096, 1)
    assert base.gpus == () and base.host[0].dense > 0 and base.host[0].kv == int(sum(m.kv_bytes(4096, 1)))
    pl = place(base, 128, list(range(48)), "layer")
    assert pl.count == 0 and pl.memory.host[0].expert_count == 48 * 128


@pytest.mark.parametrize("name", sorted(load_presets()))
def test_every_preset_has_a_map_on_a_big_box(name):
    m = Machine(get_preset(name), load_profile("h200-sxm"), 2)
    base = mem.base(m, box(141.0, 141.0, ram=2048.0, nodes=2), 4096, 1)
    assert all(g.dense > 0 for g in base.gpus) and sum(g.kv for g in base.gpus) > 0
