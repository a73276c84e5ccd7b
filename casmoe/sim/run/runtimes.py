"""The headline's figures priced again on the runtimes that run them.

On the ideal stack (the default) every figure is an upper bound: no real runtime pays nothing
per layer, per expert and per copy. The headline names, per cache size, the fastest deployable
method and the best plain cache (`casmoe.summary.verdicts`); each of them whose class names the
runtime that runs it (`ExpertCache.runtime`, a shipped stack) is run again on that stack, and its
record carries the figure as `on_runtime`: the stack, decode tokens/s, the spread the published
table measured for it, and the key of that run. Only ideal-stack records are priced again (a
`--stack` the user named is the runtime already): at most two runs per cache size.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.policies.family import policy_class
from casmoe.report import SPEED
from casmoe.sim.cost.stack import DEFAULT_STACK, load_stack
from casmoe.sim.run.grid import Runs
from casmoe.sim.run.runner import run
from casmoe.summary import RUNTIME, verdicts

KEPT = ("stack", SPEED, "uncertainty", "uncertainty_factor", "uncertainty_outside", "key")
"""The fields of the run on the runtime's stack that its `on_runtime` keeps."""


def on_runtimes(runs: Runs, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` with `on_runtime` added to the headline's ideal-stack records whose policy
    names a runtime; a run the runtime's stack cannot price leaves its record as it was (the
    headline then says the figure is an upper bound only)."""
    specs = {s.key: s for s in runs.specs}
    ran = [r for r in records if "skipped" not in r]
    chosen = {r["key"]: r for v in verdicts(ran) for r in (v.best, v.baseline)
              if r is not None and r.get("stack") == DEFAULT_STACK and r.get("key") in specs}
    priced: dict[str, dict[str, Any]] = {}
    for key, r in chosen.items():
        cls = policy_class(r["policy"])
        if cls is None or cls.runtime is None:
            continue
        spec = specs[key]
        try:
            again = run(replace(spec, machine=replace(spec.machine, stack=load_stack(cls.runtime))))
        except CasmoeError:
            continue
        priced[key] = {k: again.get(k) for k in KEPT}
    return [{**r, RUNTIME: priced[r["key"]]} if r.get("key") in priced else r for r in records]
