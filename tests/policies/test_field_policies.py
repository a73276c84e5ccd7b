"""Closed forms for the field's methods: speculative, moe-infinity, least-stale.

The shared contract (`check_policy`, every miss mode) runs them in tests/policies/test_policies.py; here
each is held to what its method promises on cases whose answer is known in advance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity, CacheConfigError
from casmoe.geometry import Geometry
from casmoe.policies import get_policy
from casmoe.policies.moe_infinity import MoEInfinity
from casmoe.policies.speculative import Speculative
from casmoe.replay import replay
from casmoe.testing import traces
from casmoe.trace import Request, Trace, expert_counts

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def perfect_spec(trace: Trace, decode_only: bool = True) -> Trace:
    """The trace with spec[t, l] = the token's own routing at layer l+1 (a perfect guess)."""
    out = []
    for r in trace.requests:
        spec = np.full_like(r.topk, -1)
        spec[:, :-1] = r.topk[:, 1:]
        out.append(Request(r.topk, r.weights, 0 if decode_only else r.prefill, r.prompt, r.task, spec=spec))
    return Trace(trace.geometry, out, trace.meta)


class MissLayers(Speculative):
    """Speculative that notes the layer of every demand load."""

    def route(self, step, layer, experts, scores=None):
        acc = super().route(step, layer, experts, scores)
        self.missed_at = getattr(self, "missed_at", []) + [layer] * len(acc.loads)
        return acc


@FAST
@given(trace=traces(), extra=st.integers(0, 3))
def test_speculative_with_a_perfect_spec_misses_only_at_layer_zero(trace, extra):
    trace = perfect_spec(trace)
    g = trace.geometry
    cache = MissLayers.create(g, Capacity(g.top_k + extra), trace=trace)
    replay(trace, cache)
    assert set(getattr(cache, "missed_at", [])) <= {0}


def test_speculative_with_a_perfect_spec_and_a_fast_link_never_stalls_past_layer_zero():
    from casmoe.presets import ModelPreset
    from casmoe.sim.passes.driver import run_trace
    from casmoe.sim.passes.assembly import Run
    from casmoe.sim.cost.machine import Machine
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.stack import load_stack

    g = Geometry(4, 8, 2, hidden=64, intermediate=32)
    rng = np.random.default_rng(0)
    reqs = [Request(np.stack([[rng.choice(8, 2, replace=False) for _ in range(4)] for _ in range(30)]).astype(np.int16),
                    np.full((30, 4, 2), 0.5, np.float32), 0, f"p{i}") for i in range(3)]
    trace = perfect_spec(Trace(g, reqs))
    preset = ModelPreset("contract", "test", g, heads=1, kv_heads=1, head_dim=64, vocab=16)
    # a copy takes far less than a layer of an eager runtime (its kernel launches), yet a
    # demand load still waits for one
    hw = dataclasses.replace(load_profile("rtx4090x4"), h2d_pinned_gbs=2.0, copy_latency_us=0.0, gpus=1)
    eager = dataclasses.replace(load_stack("ideal"), launch_share=1.0)
    stalls = {}
    for name in ("lru", "speculative"):
        res = run_trace(Run(trace, get_policy(name), Capacity(2), Machine(preset, hw, stack=eager)), compiled=False)
        stalls[name] = res.stall_by_layer_s
    assert stalls["lru"][0] > 0 and sum(stalls["lru"][1:]) > 0  # the case does stall without the guess
    assert sum(stalls["speculative"][1:]) == 0


def test_speculative_without_spec_names_the_record_flag():
    g = Geometry(2, 4, 1)
    trace = Trace(g, [Request(np.zeros((3, 2, 1), np.int16), np.ones((3, 2, 1), np.float32), 1)])
    with pytest.raises(CacheConfigError, match="casmoe record --spec"):
        Speculative.create(g, Capacity(1), trace=trace)


def test_speculative_refuses_batched_steps():
    g = Geometry(2, 4, 1)
    reqs = [Request(np.zeros((3, 2, 1), np.int16), np.ones((3, 2, 1), np.float32), 1) for _ in range(2)]
    trace = perfect_spec(Trace(g, reqs), decode_only=False)
    with pytest.raises(CacheConfigError, match="batch 1"):
        replay(trace, Speculative.create(g, Capacity(1), trace=trace), batch=2)


class Matches(MoEInfinity):
    """MoE-Infinity that keeps every prediction it made."""

    def _match(self):
        super()._match()
        if self._eam.any():  # before the request routes anything there is nothing to match
            self.predictions = getattr(self, "predictions", []) + [np.array(self._pred)]


@FAST
@given(trace=traces(max_requests=3), data=st.data())
def test_moe_infinity_on_a_stored_request_predicts_its_experts_exactly(trace, data):
    g = trace.geometry
    target = data.draw(st.sampled_from(trace.requests))
    used = expert_counts(target.topk, g.experts)
    # distractors route only the experts the target never uses: any routed row tells them apart
    others = [np.where(used > 0, 0, expert_counts(r.topk, g.experts) + 1) for r in trace.requests if r is not target]
    cache = Matches(g, Capacity(g.top_k), collection=others + [used])
    replay(Trace(g, [target]), cache)
    for pred in getattr(cache, "predictions", []):
        assert np.array_equal(pred > 0, used.ravel() > 0)
        assert np.allclose(pred.reshape(used.shape).sum(axis=1), (used.sum(axis=1) > 0).astype(float))


def test_moe_infinity_collects_served_requests_online():
    g = Geometry(3, 4, 1)
    x = np.array([[[1], [2], [3]]] * 4, np.int16)
    y = np.array([[[0], [1], [2]]] * 4, np.int16)
    reqs = [Request(r, np.ones((4, 3, 1), np.float32), 0, f"p{i}") for i, r in enumerate((x, y, x))]
    cache = Matches(g, Capacity(1))
    replay(Trace(g, reqs), cache)
    # nothing is stored while the first request runs; the third is matched with the first
    assert cache._stored == 3
    assert np.array_equal(cache.predictions[-1] > 0, expert_counts(x, 4).ravel() > 0)
    assert cache.stats().prefetch_loads > 0


def cyclic(L: int, tokens: int) -> Trace:
    """Every token routes expert 0 of every layer: a loop over L experts."""
    g = Geometry(L, 2, 1)
    return Trace(g, [Request(np.zeros((tokens, L, 1), np.int16), np.ones((tokens, L, 1), np.float32), 0)])


@pytest.mark.parametrize(("L", "slots"), [(4, 2), (6, 3), (8, 5)])
def test_least_stale_keeps_a_loop_that_lru_thrashes(L, slots):
    trace = cyclic(L, 20)
    hits = {}
    for name in ("lru", "least-stale", "belady"):
        cache = get_policy(name).create(trace.geometry, Capacity(slots, per_layer=False), trace=trace)
        hits[name] = replay(trace, cache).stats.hits
    assert hits["lru"] == 0  # a loop longer than the pool: LRU evicts what comes next
    assert hits["least-stale"] == hits["belady"] > 0  # it evicts the layer just left: optimal on a loop


@FAST
@given(trace=traces(), extra=st.integers(0, 3))
def test_least_stale_is_lru_with_per_layer_pools(trace, extra):
    g = trace.geometry
    counts = [replay(trace, get_policy(n).create(g, Capacity(g.top_k + extra), trace=trace)).stats for n in ("lru", "least-stale")]
    assert counts[0] == counts[1]
