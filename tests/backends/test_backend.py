"""The offloaded torch runtime: exact logits, the replay's counts, pool invariants, bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import KINDS, one_thread, plain_batched, plain_greedy, tiny  # noqa: E402,F401  (one_thread: autouse)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from casmoe.backends.adapters import UnsupportedModel  # noqa: E402
from casmoe.backends.copier import EmulatedLink, Loader, Ticket  # noqa: E402
from casmoe.backends.expert_ops import UnsupportedExperts  # noqa: E402
from casmoe.backends.runtime import BackendError, OffloadedModel, Prompt  # noqa: E402
from casmoe.cache import CacheConfigError, Capacity, MissMode  # noqa: E402
from casmoe.errors import CasmoeError  # noqa: E402
from casmoe.policies import POLICIES, get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402
from casmoe.trace_io import load_trace, save_trace  # noqa: E402

STEPS = 5
LONG = [Prompt([1, 5, 9, 3, 7, 2], "a"), Prompt([4, 4, 8, 1], "b"), Prompt([9, 2, 2, 6, 30], "c")]
SHORT = [Prompt([1], "a"), Prompt([4], "b"), Prompt([9], "c")]

# Pools for the long prompts: one shared pool of E + 2 slots (every layer's experts fit at once),
# k + 1 slots per layer, and k slots per layer: every prefill routes more experts than that, so
# prefill layers stream through their slots in rounds.
CAPACITIES = {"global": Capacity(10, per_layer=False), "per-layer": Capacity(3), "streamed": Capacity(2)}


@pytest.fixture(scope="module")
def mixtral():
    model = tiny("mixtral")
    return model, [plain_greedy(copy.deepcopy(model), p.ids, STEPS) for p in LONG]


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return all(torch.equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _replay_matches(run, om: OffloadedModel, policy: str, capacity, batch: int = 1) -> None:
    """Every device's counters equal replay's on the trace this run recorded (its layers)."""
    for stats, layers in zip(run.device_stats, om.chunks, strict=True):
        sub = run.trace.layer_slice(layers)
        cache = get_policy(policy).create(sub.geometry, capacity, trace=sub)
        want = replay(sub, cache, batch).stats
        assert stats.hits + stats.late_hits == want.hits
        for f in ("accesses", "misses", "demand_loads", "prefetch_loads", "evictions", "prefetch_used",
                  "prefetch_wasted", "bytes_loaded"):
            assert getattr(stats, f) == getattr(want, f), f


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("cap", sorted(CAPACITIES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_load_mode_is_bit_identical_and_counts_match_replay(mixtral, policy, cap, devices):
    model, want = mixtral
    capacity = CAPACITIES[cap]
    if devices == 2 and not capacity.per_layer:
        capacity = Capacity(9, per_layer=False)  # each device's pool still holds a layer's experts
    om = OffloadedModel(copy.deepcopy(model), devices=["cpu"] * devices)
    run = om.run(LONG, get_policy(policy), capacity, max_new_tokens=STEPS, keep_logits=True)
    assert _same(run.logits, want)
    s = run.stats  # a placement whose memory holds no whole layer (n-cpu-moe) loads nothing: all on the host
    assert s.accesses > 0 and (s.loads > 0 or s.cpu_computed == s.accesses)
    _replay_matches(run, om, policy, capacity)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_every_family_is_bit_identical_streamed_or_not(kind, dtype):
    model = tiny(kind).to(dtype)
    want = [plain_greedy(copy.deepcopy(model), p.ids, STEPS) for p in LONG]
    om = OffloadedModel(model)
    k = om.geometry.top_k
    for slots in (k, k + 1):  # k: every prefill streams
        run = om.run(LONG, get_policy("lru"), slots, max_new_tokens=STEPS, keep_logits=True)
        assert _same(run.logits, want), slots
        _replay_matches(run, om, "lru", slots)


@pytest.mark.parametrize("kind, layers, shared", [("qwen2_moe", 2, 2), ("deepseek_v2", 2, 1), ("mixtral", 3, 0)])
def test_dense_layers_are_skipped_and_shared_experts_counted(kind, layers, shared):
    """Qwen2-MoE's shared MLP is twice a routed expert's width here (32 vs 16): 2 shared experts."""
    g = OffloadedModel(tiny(kind)).geometry
    assert (g.layers, g.shared_experts) == (layers, shared)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["eager", "batched_mm"])
def test_other_experts_implementations_are_reproduced(impl, dtype):
    model = tiny("mixtral").to(dtype)
    model.set_experts_implementation(impl)
    want = [plain_greedy(copy.deepcopy(model), p.ids, STEPS) for p in LONG]
    run = OffloadedModel(model).run(LONG, get_policy("lru"), 2, max_new_tokens=STEPS, keep_logits=True)
    assert _same(run.logits, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("policy", ["lru", "belady", "semoe"])
def test_batched_decode_is_bit_identical_and_counts_match_replay(mixtral, policy, batch, dtype):
    """Requests prefill alone, then decode together: the union of their experts per layer."""
    model = copy.deepcopy(mixtral[0]).to(dtype)
    want = plain_batched(copy.deepcopy(model), [p.ids for p in LONG], STEPS, batch)
    om = OffloadedModel(model)
    run = om.run(LONG, get_policy(policy), 2, max_new_tokens=STEPS, keep_logits=True, batch=batch)
    assert _same(run.logits, want)
    _replay_matches(run, om, policy, 2, batch)
    assert [len(t.new_tokens) for t in run.requests] == [STEPS] * len(LONG)


def test_pool_never_grows_and_slots_hold_their_expert_under_a_slow_link(mixtral):
    """The use-before-arrival stress on the CPU: prefetches and demand loads on a slow emulated
    link overlap compute at the smallest capacity; every layer checks that each arrived slot
    holds its expert's bytes and the logits stay exact."""
    model, want = mixtral
    om = OffloadedModel(copy.deepcopy(model), link=EmulatedLink(bandwidth=2e6, latency=2e-4))
    seen = {}

    def check(om_: OffloadedModel, layer: int) -> None:
        om_.check_residency()
        (d,) = om_.hooks.current.devices  # the open pass's device runtimes
        ptrs = {n: t.data_ptr() for n, t in d.pool.tensors.items()}
        assert ptrs == seen.setdefault("ptrs", ptrs)
        assert d.pool.nbytes == d.pool.slots * om_.geometry.layer_expert_bytes[0]
        seen["calls"] = seen.get("calls", 0) + 1

    om.on_layer = check
    run = om.run(LONG, get_policy("semoe"), 2, max_new_tokens=STEPS, keep_logits=True)
    assert _same(run.logits, want)
    assert seen["calls"] == len(LONG) * STEPS * om.geometry.layers
    assert run.stats.prefetch_loads > 0 and run.stall > 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=6), min_size=1, max_size=3),
    slots=st.integers(2, 8),
    policy=st.sampled_from(["lru", "lfu", "semoe", "ondemand"]),
    batch=st.integers(1, 3),
)
def test_random_prompts_capacities_and_batches_are_exact_and_match_replay(mixtral, ids, slots, policy, batch):
    model, _ = mixtral
    want = plain_batched(copy.deepcopy(model), ids, 3, batch)
    om = OffloadedModel(copy.deepcopy(model))
    run = om.run([Prompt(x) for x in ids], get_policy(policy), slots, max_new_tokens=3, batch=batch, keep_logits=True)
    assert _same(run.logits, want)
    _replay_matches(run, om, policy, slots, batch)
    assert run.trace.tokens == sum(len(x) + 2 for x in ids)


def test_substitute_mode_substitutes_and_reports_perplexity(mixtral):
    model, _ = mixtral
    om = OffloadedModel(copy.deepcopy(model))
    run = om.run(SHORT, get_policy("lru"), 2, max_new_tokens=8, miss_mode=MissMode.SUBSTITUTE)
    s = run.stats
    assert s.substitutions > 0
    assert s.misses == s.substitutions + s.demand_loads  # a miss is substituted or (no resident yet) loaded
    ref = om.perplexity(LONG)
    sub = om.offloaded_perplexity(LONG, get_policy("lru"), 2, miss_mode=MissMode.SUBSTITUTE)
    lossless = om.offloaded_perplexity(LONG, get_policy("lru"), 2, miss_mode=MissMode.LOAD)
    assert np.isfinite(sub) and sub > 1
    assert lossless == ref


@pytest.mark.parametrize("kind", ["mixtral", "deepseek_v2"])
def test_cpu_mode_computes_misses_on_the_host_to_float_tolerance(kind):
    """Fiddler-style: a miss is computed where its weights are; nothing is ever loaded on a
    miss. The host's eager arithmetic differs from grouped_mm only in rounding."""
    model = tiny(kind)
    want = [plain_greedy(copy.deepcopy(model), p.ids, STEPS) for p in LONG]
    om = OffloadedModel(model)
    run = om.run(LONG, get_policy("lru"), 2, max_new_tokens=STEPS, keep_logits=True, miss_mode=MissMode.CPU)
    s = run.stats
    assert s.cpu_computed == s.misses > 0 and s.demand_loads == 0
    assert run.host_expert_s > 0
    for ra, rb in zip(run.logits, want):
        for a, b in zip(ra, rb):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [t.new_tokens for t in run.requests] == [[int(x.argmax()) for x in r] for r in want]


def test_loader_honours_the_emulated_link_cap():
    src = {"w": torch.ones(1000)}
    dst = {"w": torch.zeros(1000)}
    loader = Loader(torch.device("cpu"), link=EmulatedLink(bandwidth=200_000.0, latency=0.001))  # 4 kB: 21 ms
    t = Ticket(0, 0, True, dst, 4000, src=src)
    loader.submit(t)
    loader.wait(t)
    loader.close()
    assert t.finished - t.submitted >= 0.021
    assert torch.equal(dst["w"], src["w"])


def test_recorded_trace_is_a_valid_trace(mixtral, tmp_path):
    model, _ = mixtral
    om = OffloadedModel(copy.deepcopy(model))
    run = om.reference(LONG, 4)
    save_trace(run.trace, tmp_path / "t.npz")
    back = load_trace(tmp_path / "t.npz")
    assert [r.prefill for r in back.requests] == [len(p.ids) for p in LONG]
    assert back.tokens == sum(len(p.ids) + 3 for p in LONG)
    assert back.geometry == om.geometry


# ---- bad input ---------------------------------------------------------------------------


def test_an_unsupported_family_is_one_line_naming_the_supported_ones():
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(UnsupportedModel,
                       match=r"'llama' is not a supported MoE model \(supported: mixtral, .*deepseek_v3"):
        OffloadedModel(dense)


def test_an_experts_implementation_that_cannot_be_reproduced_is_refused(mixtral):
    model = copy.deepcopy(mixtral[0])
    model.config._experts_implementation_internal = "sonicmoe"
    with pytest.raises(UnsupportedExperts, match="'sonicmoe' cannot be offloaded exactly"):
        OffloadedModel(model)


def test_capacity_below_top_k_is_a_clear_error(mixtral):
    om = OffloadedModel(copy.deepcopy(mixtral[0]))
    with pytest.raises(CacheConfigError, match="below the 2 experts"):
        om.run(SHORT, get_policy("lru"), 1)


def test_trace_of_another_geometry_is_a_clear_error(mixtral, tmp_path):
    om = OffloadedModel(copy.deepcopy(mixtral[0]))
    other = OffloadedModel(tiny("olmoe", layers=2)).reference(SHORT, 2).trace
    with pytest.raises(BackendError, match="does not match the model"):
        om.run(SHORT, get_policy("static"), 2, trace=other)


def test_zero_new_tokens_is_a_clear_error_and_leaves_the_model_usable(mixtral):
    om = OffloadedModel(copy.deepcopy(mixtral[0]))
    with pytest.raises(CasmoeError, match="max_new_tokens"):
        om.run(SHORT, get_policy("lru"), 2, max_new_tokens=0)
    assert om.hooks.current is None  # no pass left open: a later forward is un-offloaded
    assert om.run(SHORT, get_policy("lru"), 2, max_new_tokens=1).generated == len(SHORT)


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-olmoe"])
def test_shipped_tiny_models_are_bit_identical(name):
    from casmoe.backends.models import ModelError, load_model

    try:
        model, tokenizer = load_model(name)
    except ModelError:
        pytest.skip(f"{name} is not shipped in this checkout")
    want = [plain_greedy(copy.deepcopy(model), [t], 4) for t in (5, 77)]
    om = OffloadedModel(model)
    run = om.run([Prompt([5]), Prompt([77])], get_policy("lru"), om.geometry.top_k + 1, max_new_tokens=4,
                 keep_logits=True)
    assert _same(run.logits, want)
    _replay_matches(run, om, "lru", om.geometry.top_k + 1)
    assert om.store.expert_bytes(0) == om.geometry.layer_expert_bytes[0]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_every_policy_family_dtype_batch_and_capacity_is_bit_identical(kind, dtype, batch):
    """The full cross product (the default suite samples it above)."""
    model = tiny(kind).to(dtype)
    want = plain_batched(copy.deepcopy(model), [p.ids for p in LONG], STEPS, batch)
    om = OffloadedModel(model)
    k = om.geometry.top_k
    for policy in sorted(POLICIES):
        for slots in (k, k + 1):
            if policy == "speculative" and batch > 1:  # it follows one request at a time: a refusal, before any work
                with pytest.raises(CacheConfigError, match="one request at a time"):
                    om.run(LONG, get_policy(policy), slots, max_new_tokens=STEPS, keep_logits=True, batch=batch)
                continue
            run = om.run(LONG, get_policy(policy), slots, max_new_tokens=STEPS, keep_logits=True, batch=batch)
            assert _same(run.logits, want), (policy, slots)
            _replay_matches(run, om, policy, slots, batch)


def test_decision_cost_fits_a_line_per_load_and_times_a_replay():
    from casmoe.backends.calibrate import DecisionCost, decision_cost
    from casmoe.geometry import Geometry
    from casmoe.trace import Request, Trace

    line = DecisionCost.fit([1.0, 3.0, 5.0, 3.0], [0, 1, 2, 1])
    assert (line.per_visit, line.per_load, line.measured_s) == pytest.approx((1.0, 2.0, 12.0))
    assert DecisionCost.fit([2.0, 4.0], [3, 3]) == DecisionCost(3.0, 0.0, 6.0)  # one load count: a mean per visit
    assert DecisionCost.fit([], []) == DecisionCost(0.0, 0.0)
    assert line.excess(DecisionCost(0.4, 9.0)).per_visit == pytest.approx(0.6)  # the baseline's visits only
    assert line.excess(DecisionCost(5.0, 0.0)).per_visit == 0.0
    g = Geometry(3, 4, 2, layer_expert_bytes=(1000,) * 3)
    rng = np.random.default_rng(0)
    topk = np.stack([[rng.choice(4, 2, replace=False) for _ in range(3)] for _ in range(12)]).astype(np.int16)
    trace = Trace(g, [Request(topk, np.full(topk.shape, 0.5, np.float32), 2, prompt="p")])
    od = decision_cost(trace, get_policy("ondemand"), Capacity(2))
    assert od.per_visit >= 0 and od.per_load >= 0 and od.measured_s > 0  # the replay's visits, timed
