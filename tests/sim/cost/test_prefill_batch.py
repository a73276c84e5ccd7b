"""Batched prefill across requests: up to N prompts computed in one step (MoE-Lightning's setting).

Their tokens share the step's expert work (the union of their experts per layer, the tokens
routed to each summed); each prompt attends to its own tokens. The compiled and Python passes
agree on it (tests/sim/passes/test_compiled_timing.py, test_compiled_sim.py draw `prefill_batch` too).
"""

from __future__ import annotations

import numpy as np
import pytest
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.traffic import Arrival, Schedule, ServingError, Traffic
from support.builders import one_spec, sim_run

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.trace import Request, Trace

HW0 = load_profile("rtx4090x4").with_values(copy_latency_us=0.0, sources={"copy_latency_us": "test: instant copies"})
LAYER_S, EXPERT_S = 1e-3, 1e-4


def identical_prompts(n: int, decode: int = 0) -> Trace:
    """`n` requests of one layer: the same 3-token prompt over experts {0, 1, 2} (then `decode`
    tokens on expert 0), all arriving at time 0."""
    g = Geometry(1, 4, 2, hidden=8, intermediate=4)
    rows = [[[0, 1]], [[1, 2]], [[0, 1]]] + [[[0, 3]]] * decode
    topk = np.array(rows, np.int16)  # [T, L, k]
    return Trace(g, [Request(topk.copy(), np.full(topk.shape, 0.5, np.float32), prefill=3, prompt="p", arrival=0.0)
                     for _ in range(n)])


@pytest.mark.parametrize("compiled", [False, True])
def test_n_identical_prompts_take_one_step_instead_of_n(compiled):
    """Fixed compute (1 ms a layer, 0.1 ms an expert): a prompt step over experts {0, 1, 2}
    costs 1.3 ms, alone or with others; N prompts prefilled together are one such step."""
    n = 4
    step = LAYER_S + 3 * EXPERT_S
    compute = FixedCompute(layer_s=LAYER_S, expert_s=EXPERT_S)
    for together in (1, 2, 4):
        res = sim_run(identical_prompts(n), "lru", 4, HW0, compute=compute, batch=n, prefill_batch=together,
                      compiled=compiled)
        assert res.sim_time_s == pytest.approx(n // together * step, abs=1e-6)  # the first copies: tens of ns
        assert res.stats.misses == 3 and res.stats.hits == 3 * (n // together - 1)
    served = Traffic(Arrival.TRACE, max_batch=n, prefill_batch=n)
    res = sim_run(identical_prompts(n), "lru", 4, HW0, compute=compute, traffic=served, compiled=compiled)
    assert res.sim_time_s == pytest.approx(step, abs=1e-6)
    assert res.ttft_p50_s == pytest.approx(step, abs=1e-6)


def test_prompts_prefilled_together_are_one_step_of_their_summed_tokens():
    tr = identical_prompts(3, decode=2)
    alone, together = tr.steps(3), tr.steps(3, 2)
    assert [s.requests for s in alone] == [(0,), (1,), (2,), (0, 1, 2), (0, 1, 2)]
    assert [s.requests for s in together] == [(0, 1), (2,), (0, 1, 2), (0, 1, 2)]
    merged = together[0]
    assert merged.prefill and merged.tokens == 6
    # each prompt heaviest first (expert 1: 3 tokens, 0: 2, 2: 1), the counts of the two summed
    assert merged.experts == [[1, 0, 2]] and merged.counts == [[6, 4, 2]]
    with pytest.raises(ValueError):
        tr.steps(2, 3)


def test_served_prompts_decode_together_after_one_prefill_step():
    """Decoding too: four identical requests of 2 decode tokens, served with every prompt in
    one step, then two decode steps of the four (expert 3 of the decode tokens copied once)."""
    compute = FixedCompute(layer_s=LAYER_S, expert_s=EXPERT_S)
    res = sim_run(identical_prompts(4, decode=2), "lru", 4, HW0, compute=compute,
                  traffic=Traffic(Arrival.TRACE, max_batch=4, prefill_batch=4))
    prefill, decode = LAYER_S + 3 * EXPERT_S, LAYER_S + 2 * EXPERT_S
    assert res.sim_time_s == pytest.approx(prefill + 2 * decode, abs=1e-6)
    assert res.decode_tokens == 8 and res.token_latency_p50_s == pytest.approx(decode, abs=1e-6)


def test_the_option_is_checked_and_keyed():
    with pytest.raises(CasmoeError, match="at most --batch"):
        one_spec(prefill_batch=2)
    with pytest.raises(ServingError, match="prefill-first"):
        Traffic(Arrival.POISSON, rate=1.0, schedule=Schedule.CHUNKED, prefill_batch=2)
    plain, batched = one_spec(batch=2), one_spec(batch=2, prefill_batch=2)
    assert batched.prefill_batch == 2 and plain.prefill_batch == 1 and plain.key != batched.key
    served = one_spec(users=2, prefill_batch=2)
    assert served.prefill_batch == 1 and served.traffic.prefill_batch == 2
    assert served.key != one_spec(users=2).key
    assert "2 prompts a step" in served.traffic.describe()
