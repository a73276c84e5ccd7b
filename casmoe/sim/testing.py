"""The simulator's half of the policy contract: the policy, driven through `casmoe.sim`, makes
the decisions the count-only replay makes.

    from casmoe.sim.testing import check_policy

    def test_my_policy_keeps_the_contract():
        check_policy(MyPolicy)

(with the test extra installed: `pip install 'casmoe[test]'` brings hypothesis, which generates
the cases) runs every invariant of `casmoe.testing` (capacity, protection, counts, determinism, in every
miss mode) and then the same case through the simulator on a shipped hardware profile: its
counts equal the replay's (a hit on an expert still on the wire counts as a late hit there); in
`substitute` mode only an arrived expert can stand in, so there the simulator may load instead.
"""

from __future__ import annotations

from typing import Any

from casmoe.testing import Case, check_replay, checked, run_contract  # first: without the test extra, one clear error

from casmoe.cache import CacheStats, ExpertCache, MissMode  # noqa: I001
from casmoe.presets import shape_preset
from casmoe.sim.passes.decide import machine_costs
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.cost.machine import Machine

SAME_DECISIONS = ("accesses", "misses", "substitutions", "cpu_computed", "demand_loads", "prefetch_loads",
                  "prefetch_used", "prefetch_wasted", "evictions", "bytes_loaded")


def check_case(policy: type[ExpertCache], case: Case, options: dict[str, Any] | None = None) -> None:
    """The replay's contract on one case, then the simulator's decisions against the replay's
    (the replay given the simulator's prices, which a cost-based policy weighs)."""
    options = options or {}
    stats = check_replay(policy, case, options, machine_costs(_machine(case), case.trace))
    simulated = _simulate(checked(policy), case, options)
    assert simulated.hits + simulated.late_hits + simulated.misses == simulated.accesses == stats.accesses
    if case.miss_mode is MissMode.SUBSTITUTE:
        return  # a stand-in must have arrived, so in time the simulator may load where replay substitutes
    for field in SAME_DECISIONS:
        assert getattr(simulated, field) == getattr(stats, field), f"simulator {field}: {simulated} != replay {stats}"
    assert simulated.hits + simulated.late_hits == stats.hits + stats.late_hits


def _simulate(policy: type[ExpertCache], case: Case, options: dict[str, Any]) -> CacheStats:
    """The case through the simulator, on a shipped hardware profile with a preset of the
    case's own geometry; returns its cache counters."""
    result = run_trace(Run(case.trace, policy, case.capacity, _machine(case), options=options, miss_mode=case.miss_mode), compiled=False)
    return result.stats


def _machine(case: Case) -> Machine:
    """A shipped hardware profile with a preset of the case's own geometry."""
    return Machine(shape_preset(case.trace.geometry, "contract"), load_profile("rtx4090x4"))


def check_policy(policy: type[ExpertCache], *, max_examples: int = 60, options: dict[str, Any] | None = None) -> None:
    """The whole contract, replay and simulator, on `max_examples` generated cases; raise
    AssertionError on a violation."""
    run_contract(lambda case: check_case(policy, case, options), max_examples=max_examples)
