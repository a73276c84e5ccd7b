"""The trajectory stage, the confidence gate, the linear predictor, the updating casmoe policy and
the protocol's settings: closed forms and contracts, with no sentence model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.planner.gate import ConfidenceGate
from casmoe.planner.linear import LinearEAP
from casmoe.planner.trajectory import (
    FEATURES,
    PathMatcher,
    Trajectory,
    _logistic,
    decode_uses,
    fit_transitions,
    fit_trajectory,
    prefetch_depth,
    prefill_observation,
    request_prefill,
    transition_scores,
)
from casmoe.policies.casmoe import CasMoE
from casmoe.replay import replay
from casmoe.sim.testing import check_policy
from casmoe.testing import traces
from casmoe.trace import Request, Trace, prefill_step

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@FAST
@given(trace=traces(max_requests=2, max_tokens=10))
def test_prefill_observation_is_the_rank_order_the_cache_sees(trace) -> None:
    g = trace.geometry
    offsets = (np.arange(g.layers) * g.experts)[None, :, None]
    for r in trace.requests:
        if not r.prefill:
            assert not request_prefill(r, g).any()
            continue
        step = prefill_step(r.topk[: r.prefill], r.weights[: r.prefill], offsets, g.experts)
        np.testing.assert_allclose(request_prefill(r, g), prefill_observation(step.experts, g))


def test_path_match_finds_a_stored_request_and_can_leave_it_out() -> None:
    rng = np.random.default_rng(0)
    prefills, decodes = rng.random((6, 2, 4)), rng.random((6, 2, 4))
    paths = PathMatcher.build(prefills, decodes, neighbours=1)
    pred, conf = paths.match(prefills[3])
    assert conf == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(pred, decodes[3] / decodes[3].sum(-1, keepdims=True), rtol=1e-5)
    pred, conf = paths.match(prefills[3], exclude=3)
    assert conf < 1.0 and not np.allclose(pred, decodes[3] / decodes[3].sum(-1, keepdims=True))
    # the decode path so far weighs in: matching request 2's decode moves the match to it
    _, with_path = paths.match(prefills[3], decodes[2], tokens=1000, exclude=3)
    assert with_path > conf


def test_prefetch_depth_is_finemoe_rule() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert prefetch_depth(p, confidence=1.0, slots=3) == 1  # sure: the top expert only
    assert prefetch_depth(p, confidence=0.5, slots=3) == 1  # 1 - 0.5 = 0.5 reached by the top one
    assert prefetch_depth(p, confidence=0.3, slots=3) == 2  # 0.7 needs 0.5 + 0.3
    assert prefetch_depth(p, confidence=0.0, slots=3) == 3
    assert prefetch_depth(p, confidence=0.0, slots=2) == 2  # never beyond the budget
    assert prefetch_depth(np.zeros(3), confidence=0.0, slots=3) == 0


def test_confidence_gate_weighs_what_measured_right() -> None:
    rng = np.random.default_rng(1)
    truth, other = rng.random((40, 2, 3)), rng.random((40, 2, 3))
    sim = rng.random(40)
    assert np.allclose(ConfidenceGate.fit(truth, other, sim, truth, bins=2).weights, 1.0)
    assert np.allclose(ConfidenceGate.fit(other, truth, sim, truth, bins=2).weights, 0.0)
    half = ConfidenceGate.fit(truth + (truth - other), other, sim, truth, bins=2)
    np.testing.assert_allclose(half.weights, 0.5)
    # per bin: the matcher is right above the median similarity, the predictor below it
    high = (sim > np.median(sim))[:, None, None]
    gate = ConfidenceGate.fit(np.where(high, truth, other), np.where(high, other, truth), sim, truth, bins=2)
    assert gate.matcher_weight(np.array([0.0]))[0] == pytest.approx(0.0)
    assert gate.matcher_weight(np.array([1.0]))[0] == pytest.approx(1.0)
    back = ConfidenceGate.from_dict(gate.to_dict())
    np.testing.assert_array_equal(back.weights, gate.weights)
    np.testing.assert_array_equal(back.edges, gate.edges)


def test_linear_predictor_recovers_a_linear_map_and_stays_a_distribution(tmp_path) -> None:
    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 5))
    W = rng.random((5, 2 * 4)) * 0.1
    Y = (0.25 + X @ W - (X @ W).mean(0)).reshape(200, 2, 4)
    model = LinearEAP.fit(X, Y, l2=1e-6)
    pred = model.predict(X[:10])
    np.testing.assert_allclose(pred.sum(-1), 1.0, rtol=1e-5)
    target = Y[:10] / Y[:10].sum(-1, keepdims=True)
    np.testing.assert_allclose(pred, target, atol=1e-3)
    model.save(tmp_path)
    np.testing.assert_array_equal(LinearEAP.load(tmp_path, 2, 4, inputs=5).predict(X[:3]), model.predict(X[:3]))


def test_logistic_recovers_its_weights() -> None:
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.standard_normal((20000, 2)), np.ones(20000)])
    w = np.array([1.5, -2.0, 0.5])
    y = rng.random(20000) < 1 / (1 + np.exp(-(X @ w)))
    np.testing.assert_allclose(_logistic(X, y, l2=0.0), w, atol=0.1)


def _recency_trajectory(g: Geometry) -> Trajectory:
    """Weights that trust what the request just did over the prompt's guess."""
    weights = np.zeros(len(FEATURES))
    weights[FEATURES.index("recent_1")] = 5.0
    weights[FEATURES.index("prompt")] = 0.1
    one = np.ones((1, g.layers, g.experts))
    return Trajectory(weights, PathMatcher.build(one, one), np.full((g.layers, g.experts), 1 / g.experts, np.float32))


def test_updating_policy_never_pins_a_stale_guess() -> None:
    """The prompt-level guess names experts 0 and 1; the request uses 2 and 3 in turn. The
    static policy keeps the guess and thrashes; the updating one follows the evidence."""
    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    topk = np.array([[[2]], [[3]]] * 10, dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0, prompt="p")])
    guess = lambda request: np.array([[1.0, 1.0, 0.0, 0.0]])  # noqa: E731
    static = replay(trace, CasMoE(g, Capacity(2), predictor=guess)).stats
    updating = replay(trace, CasMoE(g, Capacity(2), predictor=guess, trajectory=_recency_trajectory(g))).stats
    assert static.hits == 0
    assert updating.hits == len(topk) - 2  # only the first use of each misses


def test_transitions_count_what_the_next_token_routes() -> None:
    u = np.zeros((3, 1, 3), dtype=bool)  # tokens route 0, then 1, then 1
    u[0, 0, 0] = u[1, 0, 1] = u[2, 0, 1] = True
    T = fit_transitions([u])
    counts = np.ones((3, 3))
    counts[0, 1] += 1
    counts[1, 1] += 1
    np.testing.assert_allclose(T[0], counts / counts.sum(1, keepdims=True) * 3 - 1)
    np.testing.assert_allclose(fit_transitions([u[:1]])[0], 0.0)  # no pair: no information
    cur = np.array([[True, True, False]])
    np.testing.assert_allclose(transition_scores(T, cur)[0], T[0, :2].mean(0))
    assert not transition_scores(T, np.zeros((1, 3), bool)).any()


def test_updating_policy_keeps_the_expert_that_follows_the_running_token() -> None:
    """Every token routes expert 0 and one of 1, 2, 3 in turn, with room for two of those
    three: recency (LRU) evicts the one the next token needs, every time; the fit data's
    transitions (b is followed by b + 1) keep it, and every other token hits."""
    g = Geometry(layers=1, experts=4, top_k=2, hidden=8, intermediate=4)
    topk = np.array([[[0, 1 + t % 3]] for t in range(30)], dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0, prompt="p")])
    guess = lambda request: np.full((1, 4), 0.25)  # noqa: E731
    hits = {}
    for w in (0.0, 5.0):
        traj = _recency_trajectory(g)
        traj.weights[FEATURES.index("prompt")] = 0.0
        traj.weights[FEATURES.index("transition")] = w
        traj.transitions = fit_transitions([decode_uses(trace.requests[0], g)])
        hits[w] = replay(trace, CasMoE(g, Capacity(3), predictor=guess, trajectory=traj)).stats.hits
    # the request-start prefetch (experts 0, 1, 2) serves the first two tokens; after that LRU
    # order keeps expert 0 and loses every cycling one, the transitions keep every other one
    assert hits[0.0] == len(topk) + 2
    assert hits[5.0] >= hits[0.0] + (len(topk) - 3) // 2


class FittedCasMoE(CasMoE):
    """casmoe with a trajectory stage fitted on the very trace it serves (a contract check,
    not a fair score) and a uniform prompt guess."""

    @classmethod
    def create(cls, geometry, capacity, *, trace=None, **kw):
        traj = fit_trajectory(trace, None, horizon=2, cadence=2)
        uniform = np.full((geometry.layers, geometry.experts), 1.0 / geometry.experts)
        return cls(geometry, capacity, predictor=lambda request: uniform, trajectory=traj, **kw)


class FallbackCasMoE(FittedCasMoE):
    @classmethod
    def create(cls, geometry, capacity, *, trace=None, **kw):
        return super().create(geometry, capacity, trace=trace, fallback=True, **kw)


@pytest.mark.parametrize("policy", [FittedCasMoE, FallbackCasMoE])
def test_updating_policy_keeps_the_contract(policy) -> None:
    check_policy(policy, max_examples=30)


def test_updating_policy_has_no_compiled_twin_and_static_keeps_it() -> None:
    from casmoe.compiled import has_twin

    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    guess = lambda request: np.ones((1, 4))  # noqa: E731
    assert has_twin(CasMoE(g, Capacity(2), predictor=guess))
    assert not has_twin(CasMoE(g, Capacity(2), predictor=guess, trajectory=_recency_trajectory(g)))


def test_trajectory_round_trips(tmp_path) -> None:
    rng = np.random.default_rng(4)
    g = Geometry(layers=2, experts=4, top_k=1, hidden=8, intermediate=4)
    reqs = [Request(rng.integers(0, 4, (8, 2, 1)).astype(np.int16), np.ones((8, 2, 1), np.float32), prefill=3) for _ in range(5)]
    traj = fit_trajectory(Trace(g, reqs), None, horizon=2)
    traj.save(tmp_path)
    back = Trajectory.load(tmp_path, g.layers, g.experts)
    np.testing.assert_array_equal(back.weights, traj.weights)
    np.testing.assert_array_equal(back.paths.decode, traj.paths.decode)
    np.testing.assert_array_equal(back.transitions, traj.transitions)
    assert (back.horizon, back.cadence) == (traj.horizon, traj.cadence)


@given(st.integers(0, 3))
@settings(max_examples=4, deadline=None, database=None)
def test_protocol_settings_never_fit_on_what_they_score(seed) -> None:
    from casmoe.planner.config import PlannerConfig
    from casmoe.planner.protocol import settings as protocol_settings

    rng = np.random.default_rng(seed)
    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    tasks = ["a", "b", "c"]
    reqs = [
        Request(rng.integers(0, 4, (4, 1, 1)).astype(np.int16), np.ones((4, 1, 1), np.float32), 1, prompt=f"p{i}", task=tasks[i % 3])
        for i in range(30)
    ]
    trace = Trace(g, reqs, {"splits": ["heldout" if i % 5 == 4 else "train" for i in range(30)]})
    found = {s.name: s for s in protocol_settings(trace, PlannerConfig())}
    assert set(found) == {"insplit", "loto:a", "loto:b", "loto:c", "mixed:a", "mixed:b", "mixed:c"}
    for s in found.values():
        fitted = {id(trace.requests[i]) for i in s.fit}
        assert not fitted & {id(r) for r in s.scored.requests}
    for t in tasks:
        assert all(trace.requests[i].task != t for i in found[f"loto:{t}"].fit)
        stream = [r.task for r in found[f"mixed:{t}"].scored.requests]
        assert stream[0] == t and stream[1] != t and t in stream[2:]  # the unseen task alternates with seen ones


def test_start_prefetch_off_leaves_an_eviction_policy() -> None:
    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    topk = np.array([[[2]], [[3]]] * 4, dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0, prompt="p")])
    guess = lambda request: np.array([[0.1, 0.2, 0.3, 0.4]])  # noqa: E731
    on = CasMoE(g, Capacity(2), predictor=guess)
    off = CasMoE(g, Capacity(2), predictor=guess, start_prefetch=False)
    assert replay(trace, on).stats.prefetch_loads == 2  # experts 3 and 2, the guess's best two
    stats = replay(trace, off).stats
    assert stats.prefetch_loads == 0 and stats.hits == len(topk) - 2  # first uses miss, then both stay
    assert CasMoE.twin.runs(on) and not CasMoE.twin.runs(off)  # the twin always prefetches


def test_fallback_turns_to_lfu_order_when_the_map_misleads() -> None:
    """Tokens route 0, 1, 2, 0, 1, 3, ... with room for three: LFU's order keeps 0 and 1 and
    misses only the alternating 2 / 3. A map that evicts the expert this request has used most
    (a negative weight on its share: features that mislead on this request) thrashes; with `fallback`
    the first victims it chose that the request routed again turn the request to LFU's order."""
    from casmoe.policies.lfu import LFU

    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    topk = np.array([[[e]] for e in [0, 1, 2, 0, 1, 3] * 10], dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0, prompt="p")])
    flat = lambda request: np.full((1, 4), 0.25)  # noqa: E731

    def hits(**kw) -> int:
        traj = _recency_trajectory(g)
        traj.weights[FEATURES.index("recent_1")] = 0.0
        traj.weights[FEATURES.index("request_share")] = -5.0  # evict what the request uses most
        return replay(trace, CasMoE(g, Capacity(3), predictor=flat, trajectory=traj, start_prefetch=False, **kw)).stats.hits

    lfu = replay(trace, LFU(g, Capacity(3))).stats.hits
    misled, fallback = hits(), hits(fallback=True)
    assert lfu == 2 * (len(topk) // 3) - 2  # every 0 and 1 but the first ones
    assert misled < lfu - 10
    assert fallback >= lfu - 3  # a disagreement or two before the first regret


def test_fallback_without_the_updating_policy_is_refused() -> None:
    """The fallback checks the updating policy's learned map; the static form has none to check,
    so asking for it there is an error, not an option silently dropped."""
    from casmoe.cache import CacheConfigError

    g = Geometry(layers=1, experts=4, top_k=1, hidden=8, intermediate=4)
    with pytest.raises(CacheConfigError, match="fallback"):
        CasMoE.create(g, Capacity(2), predictor="exact", fallback=True)
    with pytest.raises(CacheConfigError, match="fallback"):
        CasMoE(g, Capacity(2), predictor=lambda request: np.ones((1, 4)), fallback=True)
