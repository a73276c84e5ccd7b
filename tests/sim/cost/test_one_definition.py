"""Each quantity the simulator prices is defined in one place, and every pass uses that one.

Two definitions of one number drift apart: the copy price was once computed with the stack's
copy efficiency where the links charged it and without it where a cost-based policy decided on
it, so under `--stack deepspeed` fiddler and hybrimoe chose on a copy price 2.2x below what they
were then charged. This test reads the source and fails when the shape of a quantity's formula
appears outside the one module allowed to hold it: a second definition is then a failing test,
not a review comment.
"""

from __future__ import annotations

import re

import pytest
from support.paths import REPO

ROOT = REPO / "casmoe"

ONE_PLACE = {
    "the copy price (the link's rate, the stack's efficiency, the per-copy latency)": (
        r"h2d_gbs\(|copy_latency_us\s*\*|copy_efficiency\s*\*|\*\s*[\w.]*copy_efficiency",
        {"sim/cost/machine.py", "sim/box/hardware.py", "sim/cost/stack.py"},
    ),
    "attention at a context ((query, key) pairs of a span of tokens)": (
        r"\(\s*\w+\s*\+\s*1\s*\)\s*//\s*2|\*\s*\(\s*\w+\s*\+\s*1\s*\)\s*-\s*\w+\s*\*",
        {"sim/cost/compute.py"},
    ),
    "the KV cache's size (values per token x cached tokens per block)": (
        r"kv_values_per_token\b(?!\s*\(self)|\.attended_tokens\(",
        {"presets/__init__.py"},
    ),
    "the layer split over devices": (r"def split_layers\b|divmod\(\s*layers\s*,", {"geometry.py"}),
    "reading a TOML table (shipped ones by `tables.read_table`, a user's by `userfile.read_toml`)": (
        r"tomllib\.loads?\(", {"tables.py", "userfile.py", "sim/box/hardware.py"},
    ),
}
"""quantity -> (the pattern of its formula, the files that may hold it). A use goes through the
one function (`Machine.copy_seconds`, `compute.attention_span`, `ModelPreset.kv_bytes`,
`geometry.split_layers`)."""


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("quantity", sorted(ONE_PLACE))
def test_a_quantity_is_defined_in_one_place(quantity):
    pattern, allowed = ONE_PLACE[quantity]
    found = sorted(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                   for name, text in sources().items() if name not in allowed
                   for m in re.finditer(pattern, text))
    assert not found, f"{quantity} is defined again outside {sorted(allowed)}:\n" + "\n".join(found)


def test_each_pattern_finds_its_one_definition():
    """Guards the guard: a pattern that matches nothing, even where the quantity lives, would
    let a second definition through unseen."""
    texts = sources()
    for quantity, (pattern, allowed) in ONE_PLACE.items():
        assert any(re.search(pattern, texts[name]) for name in allowed if name in texts), quantity


@pytest.mark.parametrize("copy", [
    "rate = hw.h2d_gbs(pinned) * 1e9",
    "pairs += n * (n + 1) // 2 + n * before",
    "total += values * self.attended_tokens(block, context)",
    "base, extra = divmod(layers, devices)",
])
def test_a_second_definition_is_caught(copy):
    assert any(re.search(pattern, copy) for pattern, _ in ONE_PLACE.values())


def test_a_cost_based_policy_weighs_the_copy_the_link_charges():
    """Under a stack whose copies reach part of the link's rate (DeepSpeed's), fiddler chooses
    between copying and computing on the host at the price its run's links then charge."""
    from casmoe.cache import Capacity
    from casmoe.policies import get_policy
    from casmoe.presets import get_preset
    from casmoe.shipped import shipped
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine
    from casmoe.sim.cost.stack import load_stack
    from casmoe.sim.passes.assembly import Run, Setup
    from casmoe.trace_io import load_trace

    trace = load_trace(shipped("tiny-mixtral.npz")).subset([0])
    machine = Machine(get_preset("mixtral-8x7b"), load_profile("rtx4090x4@gpus=1"), stack=load_stack("deepspeed"))
    assert machine.stack.copy_efficiency < 1
    nbytes = machine.expert_bytes(trace)
    run = Run(trace, get_policy("fiddler"), Capacity(4), machine)
    layers = range(trace.geometry.layers)
    state = Setup(run, [layers], [layers], [trace], nbytes, machine.compute(nbytes), None, False).start(None)
    link, cache = state.links[0], state.shards[0].cache
    for layer in (0, 5):
        charged = link.latency + nbytes[layer] / link.rate
        assert cache.costs.copy(layer) == pytest.approx(charged, rel=1e-12)
        assert charged > machine.hardware.copy_latency_us * 1e-6 + nbytes[layer] / (machine.hardware.h2d_gbs(True) * 1e9)
