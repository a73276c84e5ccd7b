"""Every run option changes what a run answers, or is refused in one line: the simulate family's
options (`casmoe.sim.run.options.OPTIONS`: simulate, sweep, search, leaderboard, replay and the
Python API) walked through `casmoe.sim.simulate`, each from a base where it matters. An option
accepted and ignored (the class of `--numa` on a profile that never said its sockets) fails here;
a new option fails until it says what it changes."""

from __future__ import annotations

import dataclasses

import pytest

from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.sim import simulate
from casmoe.sim.run.options import OPTIONS
from casmoe.trace_io import load_trace, save_trace

BASE = {"policy": "lru", "capacity": "4", "requests": 2}
"""Two requests of the shipped default trace, one policy and one cache size: about 0.1 s a run."""
POISSON = {"rate": 2.0}
ARRIVALS = "arrivals.npz"
"""The shipped default trace's first requests with arrival times (written by the fixture)."""

CHANGES = {
    "trace": ({}, str(shipped("synthetic-mixtral.npz"))),
    "quant": ({}, "int4"),
    "dense_quant": ({}, "int4"),
    "host_quant": ({"miss_mode": "cpu"}, "int4"),
    "stack": ({}, "mixtral-offloading"),
    "policy": ({}, "ondemand"),
    "capacity": ({}, "6"),
    "global_capacity": ({"capacity": None}, "60"),
    "context": ({}, 4096),
    "batch": ({}, 2),
    "prefill_batch": ({"batch": 2}, 2),
    "miss_mode": ({}, "substitute"),
    "adaptive_gating": ({}, 0.5),
    "split": ({}, "train"),
    "task": ({}, "docstring"),  # the base's two requests are quotes
    "span": ({}, "2:10"),
    "requests": ({}, 3),
    "hardware": ({}, "a100-80g"),
    "gpus": ({"capacity": "2"}, 2),
    "link": ({}, "pcie5"),
    "host_ram": ({}, 64.0),
    "cpu_threads": ({"miss_mode": "cpu"}, 4),
    "numa": ({"miss_mode": "cpu"}, "one"),  # the ideal stack keeps a copy per socket; rtx4090x4 has two
    "devices": ({"capacity": "1"}, 1),
    "pinned": ({}, False),
    "host_cache": ({}, "40GB"),
    "host_policy": ({"host_cache": "40GB"}, "lfu"),
    "allow_overcommit": ({"devices": 8}, True),  # the base is refused: 8 devices on a box of 4
    "arrival": ({"trace": ARRIVALS}, "trace"),
    "rate": (POISSON, 0.5),
    "users": ({}, 2),
    "think": ({"users": 2, "requests": 4}, 1.0),
    "max_batch": (POISSON, 1),
    "schedule": (POISSON, "chunked"),
    "chunk": ({**POISSON, "schedule": "chunked"}, 8),
    "seed": (POISSON, 1),
}
"""Each option: the base it matters in, and a value that must change the answer from that base's."""
MAKES_IT_RUN = {"allow_overcommit"}
"""Options whose base is refused: the option is what lets the run be made."""
REFUSED = {
    "model": ({}, "phi-3.5-moe", "does not match model preset 'phi-3.5-moe'"),  # the only preset of this shape is the default
    "planner": ({}, "planner-folder", "is unused"),  # a bare `casmoe` policy's: fitting one is tests/planner's
}
"""Options the base makes meaningless, refused in one line saying why."""
ANSWER = ("sim_time_s", "ttft_mean_s", "e2e_mean_s", "decode_tokens_per_s", "requests", "prefill_tokens",
          "decode_tokens", "hits", "misses", "bytes_loaded", "cpu_computed", "substitutions", "storage_bytes",
          "capacity_slots", "devices", "host_cache_gb")
"""What a run answers; the echoes of what was asked (labels, keys) are not it."""


@pytest.fixture(scope="module")
def arrivals(tmp_path_factory) -> str:
    trace = load_trace(shipped(DEFAULT_TRACE))
    trace.requests = [dataclasses.replace(r, arrival=1.5 * i) for i, r in enumerate(trace.requests[:4])]
    trace.meta["splits"] = trace.meta["splits"][:4]
    path = tmp_path_factory.mktemp("trace") / ARRIVALS
    save_trace(trace, path)
    return str(path)


def _answer(options: dict[str, object], arrivals: str) -> list[tuple[object, ...]]:
    given = {k: (arrivals if v == ARRIVALS else v) for k, v in options.items() if v is not None}
    return [tuple(record[k] for k in ANSWER) for record in simulate(**given).records]


def test_the_walk_names_every_option() -> None:
    assert {o.name for o in OPTIONS} == set(CHANGES) | set(REFUSED), "a new run option: say what it changes"


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_each_option_changes_the_answer(name: str, arrivals: str) -> None:
    context, value = CHANGES[name]
    changed = _answer({**BASE, **context, name: value}, arrivals)
    if name in MAKES_IT_RUN:
        with pytest.raises(CasmoeError):
            _answer({**BASE, **context}, arrivals)
        return
    assert changed != _answer({**BASE, **context}, arrivals), f"{name} = {value!r} changed nothing"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_option_the_run_cannot_use_is_refused(name: str, arrivals: str) -> None:
    context, value, says = REFUSED[name]
    with pytest.raises(CasmoeError, match=says):
        _answer({**BASE, **context, name: value}, arrivals)
