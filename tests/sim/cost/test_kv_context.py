"""The served context: its KV cache checked against the GPUs, its KV read priced.

`--context C` serves each request as the continuation of a conversation of C tokens: its
attention reads the earlier ones (`timing.histories`), and the KV cache of C tokens times the
run's concurrency must fit beside the dense part and the expert slots (`fits.check_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.run.fits import FitError, check_kv
from casmoe.sim.run.grid import Grid
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.traffic import Arrival, Traffic
from casmoe.sim.passes.timing import histories, work_for
from support.builders import one_spec, sim_run

from casmoe.cache import Capacity
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.presets import get_preset
from casmoe.trace import Request, Trace

HW = load_profile("rtx4090x4")


@dataclass(frozen=True)
class KVCompute(FixedCompute):
    """Dense time proportional to the cached tokens read, nothing else: the KV read alone."""

    per_kv_token: float = 1e-3

    def dense(self, tokens: int, attn_pairs: int, kv_tokens: int, requests: int = 1) -> float:
        return self.per_kv_token * kv_tokens

    def dense_many(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens: np.ndarray,
                   requests: int = 1) -> np.ndarray:
        return self.per_kv_token * kv_tokens


def test_kv_bytes_per_device_sum_to_the_presets_closed_form():
    for name, devices in (("mixtral-8x7b", 4), ("gpt-oss-120b", 1), ("deepseek-v3", 1)):
        preset = get_preset(name)
        m = Machine(preset, load_profile("h200-sxm") if devices == 1 else HW, devices)
        for context in (1, 100, 32768):
            assert sum(m.kv_bytes(context, 3)) == 3 * preset.kv_bytes(context)
    assert Machine(get_preset("mixtral-8x7b"), HW, 4).kv_bytes(1000, 1) == [8 * 1000 * 4096] * 4


def test_histories_and_the_prefill_and_decode_prices_read_the_earlier_context():
    reqs = [Request(np.zeros((n, 1, 1), np.int16), np.ones((n, 1, 1), np.float32), prefill=2) for n in (3, 10)]
    assert histories(reqs, 0) == [0, 0]
    assert histories(reqs, 10) == [7, 0]
    compute = KVCompute()
    pos = histories(reqs, 100)  # 97, 90
    prefill = work_for(True, 2, (0,), pos, compute)
    assert prefill.dense == pytest.approx(1e-3 * (2 + 97)) and pos[0] == 99
    decode = work_for(False, 2, (0, 1), pos, compute)  # request 1 never prefilled here: 91
    assert decode.dense == pytest.approx(1e-3 * (100 + 91))


@pytest.mark.parametrize("served", [False, True])
def test_a_longer_context_adds_exactly_its_kv_read(served):
    """One request of P prompt and D decode tokens on L layers, every KV token read costing
    1 ms: at context C its prefill reads P + h and its i-th decode token h + P + i (h = C - P - D)."""
    L, P, D = 2, 3, 4
    g = Geometry(L, 2, 1, hidden=8, intermediate=4)
    topk = np.zeros((P + D, L, 1), np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=P, prompt="p")])
    hw = HW.with_values(copy_latency_us=0.0, sources={"copy_latency_us": "test: instant copies"})
    traffic = Traffic(Arrival.CLOSED, users=1, max_batch=1) if served else None
    for context in (0, P + D, 50, 4000):
        h = max(0, context - P - D)
        want = L * 1e-3 * ((P + h) + sum(h + P + i for i in range(1, D + 1)))
        res = sim_run(trace, "lru", 2, hw, compute=KVCompute(), context=context, traffic=traffic)
        assert res.sim_time_s == pytest.approx(want, abs=1e-6)  # the first copies: tens of ns


def test_a_kv_cache_that_does_not_fit_is_refused_naming_configurations_that_fit():
    with pytest.raises(FitError) as exc:
        Grid.of({"policy": "lru", "capacity": "7", "context": 32768, "batch": 8}).specs()
    text = str(exc.value)
    assert "\n" not in text and "8 sequences of 32768 tokens" in text and "--allow-overcommit" in text
    fixes = dict(part.split(" ", 1) for part in text.split("give ")[1].split(" (or less)")[0].split(" or "))
    assert set(fixes) == {"--context", "--capacity", "--batch"}
    context, capacity, batch = (int(fixes[f]) for f in ("--context", "--capacity", "--batch"))
    # each named configuration fits, and one more of it does not
    assert Grid.of({"policy": "lru", "capacity": "7", "context": context, "batch": 8}).specs().specs
    assert Grid.of({"policy": "lru", "capacity": str(capacity), "context": 32768, "batch": 8}).specs().specs
    assert Grid.of({"policy": "lru", "capacity": "7", "context": 32768, "batch": batch}).specs().specs
    for over in ({"context": context + 1}, {"capacity": str(capacity + 1)}, {"batch": batch + 1}):
        with pytest.raises(FitError):
            Grid.of({"policy": "lru", "capacity": "7", "context": 32768, "batch": 8, **over}).specs()


def test_overcommit_notes_it_sweeps_record_it_and_serving_counts_its_running_requests():
    runs = Grid.of({"policy": "lru", "capacity": "7", "context": 32768, "batch": 8, "allow_overcommit": True}).specs()
    assert runs.specs and any("KV cache" in n and "simulated anyway" in n for n in runs.notes)
    lenient = Grid.of({"policy": "lru", "capacity": "7", "context": [4096, 32768], "batch": 8}).specs(strict=False)
    assert [s.context for s in lenient.specs] == [4096, 32768]
    assert list(lenient.refused) == [lenient.specs[1]] and "KV cache" in lenient.refused[lenient.specs[1]]
    with pytest.raises(FitError, match="--max-batch"):
        Grid.of({"policy": "lru", "capacity": "7", "context": 32768, "users": 20, "max_batch": 8}).specs()
    with pytest.raises(FitError, match="--users"):
        Grid.of({"policy": "lru", "capacity": "7", "context": 65536, "users": 6, "max_batch": 8}).specs()
    assert Traffic(Arrival.CLOSED, users=3, max_batch=8).sequences == (3, "--users")
    assert Traffic(Arrival.POISSON, rate=1.0, max_batch=8).sequences == (8, "--max-batch")


def test_the_context_is_keyed_checked_against_the_trace_and_the_default_is_the_traces_own():
    plain, served = one_spec(), one_spec(context=8192)
    assert plain.context == 0 and served.context == 8192 and plain.key != served.key
    assert "context" not in plain.describe() and served.describe()["context"] == 8192
    with pytest.raises(CasmoeError, match="below the longest scored request"):
        one_spec(context=2)


def test_check_kv_counts_the_pool_of_a_global_capacity():
    m = Machine(get_preset("mixtral-8x7b"), load_profile("h200-sxm"), 1)
    nbytes = m.preset.expert_bytes_per_layer(None)
    pool = m.max_pool_slots(nbytes)
    assert sum(m.slot_bytes(nbytes, Capacity(pool, per_layer=False))) == pool * nbytes[0]
    assert check_kv(m, nbytes, Capacity(pool, per_layer=False), str(pool), 1, 1, "--batch", "box", False) is None
    with pytest.raises(FitError, match="--global-capacity"):
        check_kv(m, nbytes, Capacity(pool, per_layer=False), str(pool), 131072, 8, "--batch", "box", False)


def test_fit_and_the_default_capacities_leave_room_for_the_kv_cache():
    (spec,) = Grid.of({"policy": "lru", "capacity": "fit", "context": 32768, "batch": 8}).specs().specs
    # 8 beside the dense weights alone (the token table on the first GPU, the LM head on the last:
    # each was once charged to both, `Machine.gpu_resident`)
    assert spec.capacity.text == "5"
    defaults = Grid.of({"policy": "lru", "context": 32768, "batch": 8}).specs().specs
    assert max(int(s.capacity.text) for s in defaults) == 5
