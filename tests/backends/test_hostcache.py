"""The RAM tier: its decisions against a reference LRU, any non-oracle policy, and the copy
thread's handling of a row refilled before an earlier copy out of it ran."""

from __future__ import annotations

from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from casmoe.backends.copier import EmulatedLink, Loader, Ticket  # noqa: E402
from casmoe.backends.hostcache import HostTier  # noqa: E402
from casmoe.backends.store import TensorStore  # noqa: E402
from casmoe.cache import CacheConfigError  # noqa: E402
from casmoe.geometry import Geometry  # noqa: E402
from casmoe.policies import POLICIES, get_policy  # noqa: E402

G = Geometry(layers=3, experts=6, top_k=2)


def _store(layers: int = 3, experts: int = 6) -> TensorStore:
    torch.manual_seed(0)
    return TensorStore([{"w": torch.randn(experts, 4, 8), "v": torch.randn(experts, 8)} for _ in range(layers)])


@settings(max_examples=30, deadline=None)
@given(accesses=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=1, max_size=60),
       rows=st.integers(2, 10))
def test_lru_ram_tier_decides_like_a_reference_lru(accesses, rows):
    """One access per device load; a hit reads its row, a miss fills the row it frees."""
    host = HostTier(_store(), G, rows, get_policy("lru"))
    ref: OrderedDict[int, None] = OrderedDict()
    row_of: dict[int, int] = {}
    for step, (layer, e) in enumerate(accesses):
        flat = layer * 6 + e
        row, fill = host.plan(step, layer, e)
        assert fill == (flat not in ref)
        if fill:
            if len(ref) == rows:
                victim, _ = ref.popitem(last=False)
                assert row == row_of.pop(victim)
            row_of[flat] = row
        assert row == row_of[flat]
        ref[flat] = None
        ref.move_to_end(flat)
    s = host.stats()
    assert s.accesses == len(accesses) and s.misses == sum(1 for _ in row_of) + s.evictions


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_any_policy_that_does_not_read_the_future_manages_the_ram_tier(name):
    policy = get_policy(name)
    if policy.needs_future:
        with pytest.raises(CacheConfigError, match="reads the future"):
            HostTier(_store(), G, 4, policy)
        return
    if name in ("n-cpu-moe", "ktransformers", "fiddler", "hybrimoe", "routed-placement"):  # computed on the host, never cached there
        with pytest.raises(CacheConfigError, match="placement|profile"):
            HostTier(_store(), G, 4, policy)
        return
    options = {"predictor": "exact"} if name == "casmoe" else {}
    try:
        host = HostTier(_store(), G, 4, policy, options)
    except CacheConfigError:
        pytest.skip(f"{name} needs a profile trace")
    for step, (layer, e) in enumerate([(0, 1), (1, 2), (0, 1), (2, 5), (0, 3), (1, 4), (0, 1)]):
        row, _ = host.plan(step, layer, e)
        assert 0 <= row < 4
    assert host.stats().accesses == 7


def test_a_row_refilled_before_an_earlier_copy_out_of_it_is_read_again_from_the_store():
    """The copy thread runs demand loads before queued prefetches: a prefetch planned as a RAM
    hit can find its row refilled by a later demand load. It must not copy the newcomer."""
    store = _store()
    host = HostTier(store, G, 2, get_policy("lru"))
    loader = Loader(torch.device("cpu"), store, EmulatedLink(bandwidth=1e5), host)

    def ticket(layer: int, e: int, demand: bool) -> Ticket:
        t = Ticket(layer * 6 + e, 0, demand, store.empty_rows(), 4000, layer, e)
        t.ram, t.fill = host.plan(0, layer, e)
        return t

    first = [ticket(0, 0, True), ticket(0, 1, True)]  # fill both rows (slow link: ~40 ms each)
    for t in first:
        loader.submit(t)
    hit = ticket(0, 0, False)  # a prefetch: a RAM hit on (0, 0)'s row, queued behind the link
    refill = ticket(0, 2, True)  # LRU evicts (0, 1)... then (0, 0) for the next one
    other = ticket(0, 3, True)
    assert not hit.fill and refill.fill and other.fill and other.ram == hit.ram
    for t in (hit, refill, other):
        loader.submit(t)
    for t in (*first, hit, refill, other):
        loader.wait(t)
    loader.close()
    for t in (*first, hit, refill, other):
        for name, row in t.dst.items():
            assert torch.equal(row, store.tensors[t.layer][name][t.index]), (t.index, name)
    assert host.bypassed == 1


def test_request_start_prefetches_of_the_ram_policy_are_read_into_ram():
    """What the RAM tier admits at request start it reads from the store, so its later hits are
    real hits (no second read) and the logits stay exact."""
    import copy

    from support.backend_models import plain_greedy, tiny

    from casmoe.backends.hostcache import HostCache
    from casmoe.backends.runtime import OffloadedModel, Prompt
    from casmoe.policies.lru import LRU

    class Warm(LRU):  # prefetches layer 0's first four experts into RAM at every request start
        name = "warm"

        def prefetch_request(self, request):
            return [0, 1, 2, 3]

    model = tiny("mixtral")
    prompts = [Prompt([1, 5, 9, 3, 7, 2]), Prompt([4, 4, 8, 1])]
    want = [plain_greedy(copy.deepcopy(model), p.ids, 4) for p in prompts]
    om = OffloadedModel(model)
    # 24 rows hold all 3 x 8 experts, so no row is ever refilled: a bypass (a second store read)
    # could only come from a device copy that hit a row whose queued fill had not run yet
    with om.session(get_policy("lru"), 2, prompts, max_new_tokens=4, host=HostCache(24, Warm)) as s:
        s.serve(prompts, 4, keep_logits=True)
        run = s.result()
        bypassed = s.host.bypassed
    assert all(torch.equal(a, b) for ra, rb in zip(run.logits, want) for a, b in zip(ra, rb))
    assert run.host_stats.prefetch_loads >= 4 and run.host_stats.prefetch_used > 0
    assert bypassed == 0
