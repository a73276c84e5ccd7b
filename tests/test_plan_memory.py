"""The memory map of `casmoe plan` (issue 37): it never exceeds the box it fits, it says what does
not fit and why, GPUs of different sizes are each filled to their own map, and each engine's
KV cache and reserve are counted its own way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.presets import get_preset, load_presets
from casmoe.sim.questions.deploy import memory as mem
from casmoe.sim.questions.deploy.placement import first_layers, place

ENGINES = ("llama.cpp", "ktransformers", "vllm", "sglang", "casmoe")
PRESETS = ("qwen3-30b-a3b", "gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b", "deepseek-v2-lite", "olmoe-1b-7b")
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def box(*gpus: float, ram: float = 64.0, nodes: int = 1) -> mem.Box:
    return mem.Box("test", tuple(gpus), ram, nodes, 12, "test", 2.0)


@FAST
@given(name=st.sampled_from(PRESETS), engine=st.sampled_from(ENGINES),
       gpus=st.lists(st.sampled_from([8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 80.0]), min_size=1, max_size=3),
       ram=st.sampled_from([16.0, 32.0, 64.0, 128.0, 512.0]), nodes=st.integers(1, 2),
       context=st.sampled_from([512, 4096, 32768, 131072]), concurrency=st.integers(1, 4),
       unit=st.sampled_from(["layer", "expert"]), seed=st.integers(0, 3))
def test_a_placement_never_fills_a_gpu_past_its_memory(name, engine, gpus, ram, nodes, context, concurrency, unit, seed):
    p = get_preset(name)
    prec = mem.Precisions.of(p)
    base = mem.base(engine, p, box(*gpus, ram=ram, nodes=nodes), prec, context, concurrency)
    g = p.geometry
    order = list(np.random.default_rng(seed).permutation(g.layers if unit == "layer" else g.total_experts))
    pl = place(base, p, prec, order, unit)
    m = pl.memory
    for gm, room in zip(m.gpus, base.expert_room()):
        assert gm.experts <= room  # experts only take what the rest left
        if base.gpus[gm.index].free >= 0:
            assert gm.used <= gm.total
    # every expert is somewhere, once
    assert pl.count + sum(h.expert_count for h in m.host) == g.total_experts
    assert len({e for ids in pl.gpu for e in ids}) == pl.count
    # a map fits exactly when nothing is over
    over = any(x.free < 0 for x in (*m.gpus, *m.host))
    assert m.fits == (not over) and bool(m.problems) == over
    d = m.to_dict()
    assert d["fits"] == m.fits and len(d["gpus"]) == len(gpus) and len(d["host"]) == nodes


def test_what_does_not_fit_is_said_with_why():
    p = get_preset("gpt-oss-120b")
    prec = mem.Precisions.of(p)
    tight = mem.base("llama.cpp", p, box(8.0, ram=32.0), prec, 131072, 8)
    assert not tight.fits and "runtime reserve, dense weights, embeddings and KV cache alone" in tight.problems[0]
    pl = first_layers(mem.base("llama.cpp", p, box(24.0, ram=32.0), prec, 4096, 1), p, prec)
    assert not pl.memory.fits
    assert any(x.startswith("host node 0: over by") and "host experts" in x for x in pl.memory.problems)


def test_gpus_of_different_sizes_are_each_filled_to_their_own_room():
    """llama.cpp #15136: --n-cpu-moe puts a layer's experts with its layer's GPU whatever room
    that GPU has; the plan fills each GPU to its own map, the small one too."""
    p = get_preset("qwen3-30b-a3b")
    prec = mem.Precisions.of(p)
    base = mem.base("llama.cpp", p, box(24.0, 12.0, ram=128.0), prec, 8192, 1)
    assert [len(g.layers) for g in base.gpus] == [32, 16]  # layers split as the memory is (-ts 24,12)
    pl = place(base, p, prec, list(range(p.geometry.layers - 1, -1, -1)), "layer")
    assert pl.memory.fits and all(g.experts > 0 and g.free >= 0 for g in pl.memory.gpus)
    leftover = [g.free for g in pl.memory.gpus]
    layer = p.expert_bytes_per_layer(prec.gpu)[0] * p.geometry.experts
    assert max(leftover) < layer  # no GPU had room for one more layer


def test_kv_cache_as_each_engine_sizes_it():
    p = get_preset("gpt-oss-120b")  # 36 blocks, every second one a 128-token window
    values = 2 * 8 * 64
    full = 18 * 32768 * values * 2
    # llama.cpp: a window block keeps GGML_PAD(window + ubatch, 256) = 768 cells (verified.toml)
    assert mem.kv_bytes("llama.cpp", p, 32768, 1, "f16", 512) == full + 18 * 768 * values * 2
    assert mem.kv_bytes("vllm", p, 32768, 2, "auto", 512) == 2 * (full + 18 * 128 * values * 2)
    assert mem.kv_bytes("llama.cpp", p, 32768, 1, "q8_0", 512) == int((18 * 32768 + 18 * 768) * values * 8.5 / 8)
    q = get_preset("qwen3-30b-a3b")
    assert mem.kv_bytes("ktransformers", q, 1000, 3, "auto", 512) == 3 * 48 * 1000 * 2 * 4 * 128 * 2


def test_sglangs_reserve_is_its_own_formula():
    """server_args.py at d2b3c7fb: 512 + 1.5 x 2048 + 2 x 24 + 128 MiB on a 24 GiB GPU."""
    total = 24 * mem.GIB
    assert mem.sglang_mem_fraction(total) == round((24 * 1024 - (512 + 3072 + 48 + 128)) / (24 * 1024), 3)
    assert mem._sglang_reserve(80 * mem.GIB) == (512 + 1.5 * 8192 + 2 * 256 + 128) * mem.MIB  # below 90 GiB


def test_llama_cpp_keeps_the_embedding_table_on_the_host():
    p = get_preset("qwen3-30b-a3b")
    prec = mem.Precisions.of(p)
    llama = mem.base("llama.cpp", p, box(24.0), prec, 4096, 1)
    kt = mem.base("ktransformers", p, box(24.0), prec, 4096, 1)
    head = prec.dense.param_bytes(p.head_params)
    assert llama.gpus[0].embeddings == head and llama.host[0].other == head
    assert kt.gpus[0].embeddings == 2 * head and kt.host[0].other == 0


@pytest.mark.parametrize("name", sorted(load_presets()))
def test_every_preset_has_a_map_on_a_big_box(name):
    p = get_preset(name)
    prec = mem.Precisions.of(p)
    m = mem.base("casmoe", p, box(141.0, 141.0, ram=2048.0, nodes=2), prec, 4096, 1)
    assert all(g.dense > 0 for g in m.gpus) and sum(g.kv for g in m.gpus) > 0
