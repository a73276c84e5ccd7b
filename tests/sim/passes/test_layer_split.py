"""One layer split, one layer slicing and one stats sum, shared by the simulator and the backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from casmoe.cache import CacheStats
from casmoe.geometry import Geometry, GeometryError, split_layers
from casmoe.sim.passes.assembly import TraceSteps
from casmoe.synthetic import SynthConfig, generate


def _trace(g: Geometry, requests: int, seed: int):
    return generate(g, SynthConfig(requests=requests, prefill=(2, 5), decode=(3, 6), seed=seed))


@given(st.integers(1, 80), st.integers(1, 80))
def test_split_partitions_layers_near_equally_earlier_devices_first(layers, devices):
    if devices > layers:
        with pytest.raises(GeometryError, match="devices"):
            split_layers(layers, devices)
        return
    ranges = split_layers(layers, devices)
    assert [i for r in ranges for i in r] == list(range(layers))  # contiguous, in order, complete
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the first devices


def test_sixteen_layers_over_three_devices():
    assert [len(r) for r in split_layers(16, 3)] == [6, 5, 5]


def test_layer_slice_keeps_each_layers_routing_and_bytes():
    g = Geometry(5, 4, 2, hidden=8, intermediate=4, layer_expert_bytes=(10, 20, 30, 40, 50))
    tr = _trace(g, requests=3, seed=1)
    part = tr.layer_slice(range(2, 4))
    assert part.geometry.layers == 2 and part.geometry.layer_expert_bytes == (30, 40)
    assert dataclasses.replace(part.geometry, layers=5, layer_expert_bytes=g.layer_expert_bytes) == g
    for whole, sub in zip(tr.requests, part.requests, strict=True):
        np.testing.assert_array_equal(sub.topk, whole.topk[:, 2:4])
        np.testing.assert_array_equal(sub.weights, whole.weights[:, 2:4])
    # steps of the slice equal the slice of the steps (flat ids renumbered from layer 2)
    assert [s.experts for s in part.steps()] == [s.layer_slice(range(2, 4), 4).experts for s in tr.steps()]


def test_step_plan_shards_are_the_device_split():
    g = Geometry(7, 4, 2, hidden=8, intermediate=4)
    tr = _trace(g, requests=2, seed=2)
    plan = TraceSteps.build(tr, devices=3, cache_per_device=True)
    assert plan.shards == split_layers(7, 3)
    assert [t.geometry.layers for t in plan.shard_traces] == [3, 2, 2]


def test_stats_total_sums_every_counter():
    fields = CacheStats.__dataclass_fields__
    a = CacheStats(**{f: i + 1 for i, f in enumerate(fields)})
    b = CacheStats(**{f: 10 * (i + 1) for i, f in enumerate(fields)})
    total = CacheStats.total([a, b])
    assert all(getattr(total, f) == 11 * (i + 1) for i, f in enumerate(fields))
    assert CacheStats.total([a]) is a
