"""Adaptive gating in the torch backend: the offloaded run's logits equal the un-offloaded model
gated by AdapMoE's own rule, and `casmoe bench --adaptive-gating` reports its quality."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import one_thread, plain_greedy, tiny  # noqa: E402,F401  (one_thread: autouse)

from casmoe.backends.experts import find_moe_blocks  # noqa: E402
from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402
from casmoe.cache import Capacity  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.trace import NOT_COMPUTED  # noqa: E402

PROMPTS = [Prompt([1, 5, 9, 3, 7, 2], "a"), Prompt([4, 4, 8, 1], "b")]
STEPS = 5
THRESHOLD = 0.52  # the tiny random model's top expert takes 0.50-0.54 of the top-2 weight: about half the tokens gate


def adapmoe_gated(model, threshold: float):
    """The un-offloaded model with AdapMoE's rule on every router (benchmarks/modified_mixtral.py:
    a dropped expert keeps its index at weight 0, the kept one takes the top-k's weight), written
    independently of casmoe.gating."""
    model = copy.deepcopy(model)

    def hook(module, args, out):
        logits, weights, index = out
        total = weights.sum(-1, keepdim=True)
        best = weights.argmax(-1, keepdim=True)
        gate = (weights.gather(-1, best) / total >= threshold).squeeze(-1)
        gated = torch.zeros_like(weights).scatter(-1, best, total)
        return logits, torch.where(gate[:, None], gated, weights), index

    for block in find_moe_blocks(model):
        block.gate.register_forward_hook(hook)
    return model


@pytest.fixture(scope="module")
def mixtral():
    return tiny("mixtral")


def test_gated_offloaded_logits_equal_the_gated_reference(mixtral):
    om = OffloadedModel(copy.deepcopy(mixtral))
    run = om.run(PROMPTS, get_policy("lru"), Capacity(2), max_new_tokens=STEPS, keep_logits=True, gating=THRESHOLD)
    ref = om.reference(PROMPTS, STEPS, keep_logits=True, gating=THRESHOLD)
    independent = [plain_greedy(adapmoe_gated(mixtral, THRESHOLD), p.ids, STEPS) for p in PROMPTS]
    exact = [plain_greedy(copy.deepcopy(mixtral), p.ids, STEPS) for p in PROMPTS]
    for got, want, other, plain in zip(run.logits, ref.logits, independent, exact):
        for a, b, c in zip(got, want, other):
            assert torch.equal(a, b)  # offloaded = un-offloaded, both gated
            torch.testing.assert_close(a, c, rtol=0, atol=1e-5)  # = AdapMoE's zero-weight rule
        assert any(not torch.equal(a, p) for a, p in zip(got, plain))  # the gate did change something
    # the recorded routing is the gated one: fewer experts, as the simulator gates a trace
    dropped = sum(int((r.topk[:, :, 1:] == NOT_COMPUTED).sum()) for r in run.trace.requests)
    assert dropped > 0 and run.stats.accesses < om.run(PROMPTS, get_policy("lru"), Capacity(2), max_new_tokens=STEPS).stats.accesses


def test_a_threshold_above_one_is_the_exact_model(mixtral):
    om = OffloadedModel(copy.deepcopy(mixtral))
    run = om.run(PROMPTS, get_policy("lru"), Capacity(2), max_new_tokens=STEPS, keep_logits=True, gating=1.5)
    exact = [plain_greedy(copy.deepcopy(mixtral), p.ids, STEPS) for p in PROMPTS]
    assert all(torch.equal(a, b) for got, want in zip(run.logits, exact) for a, b in zip(got, want))


def test_gated_counts_match_a_replay_of_the_recorded_gated_routing(mixtral):
    """The cache saw the gated routing, and only it: replaying the run's own (gated) trace
    gives its counts, and at the first MoE layer (before gating changed any hidden state) that
    trace is the exact routing gated as `gate_trace` gates it."""
    from casmoe.gating import gate_trace
    from casmoe.replay import replay

    om = OffloadedModel(copy.deepcopy(mixtral))
    run = om.run(PROMPTS, get_policy("lru"), Capacity(3), max_new_tokens=STEPS, gating=THRESHOLD)
    want = replay(run.trace, get_policy("lru")(run.trace.geometry, Capacity(3))).stats
    for f in ("accesses", "misses", "demand_loads", "evictions"):
        assert getattr(run.stats, f) == getattr(want, f), f
    exact = om.reference(PROMPTS, STEPS).trace
    n = len(PROMPTS[0].ids)  # the prompt's first MoE layer sees the same hidden states gated or not
    first = gate_trace(exact, THRESHOLD).requests[0].topk[:n, 0]
    assert np.array_equal(run.trace.requests[0].topk[:n, 0], first)
    assert (first == NOT_COMPUTED).any()
