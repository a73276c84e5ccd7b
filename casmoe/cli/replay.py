"""`casmoe replay`: walk a trace through cache policies and print their counts."""

from __future__ import annotations

import json
from pathlib import Path

from typing import TYPE_CHECKING

import typer

from casmoe.cli.app import app, progress
from casmoe.cli.flags import run_options
from casmoe.errors import CasmoeError
if TYPE_CHECKING:
    from casmoe.sim.run.grid import Grid


@app.command()
@run_options("routing")
def replay(
    grid: Grid,
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Replay a trace through cache policies with no timing; print hit rates and loads.

    Hit rate = (hits + late hits) / routed accesses, where an access is one expert routed at one
    layer of one step (prefill is one step: the union of its tokens' experts). Experts are sized
    as `casmoe simulate` prices them (the model preset at --quant, or the trace's measured
    bytes), so bytes loaded agree between the two; the default cache is 2 x top_k per layer.
    """
    from casmoe.compiled import uses_twin
    from casmoe.replay import replay as run_replay
    from casmoe.sim.run.runner import routing, scored_trace
    from casmoe.step_arrays import StepArrays

    if not grid.given.get("capacity") and not grid.given.get("global_capacity"):
        from casmoe.shipped import DEFAULT_TRACE, shipped
        from casmoe.trace_io import load_trace

        first = (grid.given.get("trace") or [str(shipped(DEFAULT_TRACE))])[0]
        if Path(first).exists():  # else the grid says the trace is missing
            grid = grid.with_values(capacity=str(2 * load_trace(first).geometry.top_k))
    runs = grid.with_values(allow_overcommit=True).specs(strict=True, shape_ok=True)  # a count, not a box: any size runs
    named = bool(grid.given.get("policy")) and grid.given.get("policy") != ("all",)
    records, skipped = [], []
    shared: dict[tuple, tuple] = {}  # built once per (trace, batch): steps and arrays
    bar = progress(runs.specs, desc="replay", unit="run", quiet=len(runs.specs) < 2 or as_json)
    for spec in bar:
        tr = scored_trace(spec.trace)
        nbytes = spec.machine.expert_bytes(tr)
        try:
            cap = spec.capacity.resolve(nbytes)
            cache = spec.policy.create(tr.geometry, cap, miss_mode=spec.miss_mode, trace=tr, expert_bytes=nbytes,
                                       source=routing(spec.trace.path, spec.trace.digest, spec.trace.gating))
        except CasmoeError as exc:
            if named:
                raise
            skipped.append(f"skipped {spec.policy.label} @ {spec.capacity.label}: {exc}")
            continue
        steps, arrays = shared.get((spec.trace, spec.batch), (None, None))
        if uses_twin(cache, tr):
            arrays = StepArrays.from_trace(tr, spec.batch) if arrays is None else arrays
        else:
            steps = tr.steps(spec.batch) if steps is None else steps
        shared[spec.trace, spec.batch] = (steps, arrays)
        result = run_replay(tr, cache, batch=spec.batch, steps=steps, arrays=arrays).to_dict()
        records.append({**result, "policy": spec.policy.label, "oracle": spec.policy.oracle or spec.fitted,
                        "trace": spec.trace.name, "model": spec.machine.preset.name,
                        "quant": spec.machine.precision_label(tr.geometry)})
    if not records:  # no policy could run at all: a refusal, not an empty table
        raise CasmoeError(skipped[0].removeprefix("skipped "))
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    from casmoe.report import print_replay

    for group in runs.groups:
        g = scored_trace(runs.specs[0].trace).geometry
        gating = runs.specs[0].trace.gating
        gated = "" if gating is None else f", adaptive gating >= {gating:g} (lossy)"
        print_replay([r for r in records if r["trace"] == group.trace.name],
                     f"{g.describe()}, {group.scored.describe()}, {group.tokens} tokens, experts priced as "
                     f"{group.machine.preset.name} ({records[0]['quant'] if records else 'bf16'}){gated}")
        break
    for note in skipped:
        typer.echo(note)
