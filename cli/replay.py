"""`casmoe replay`: walk a trace through cache policies and print their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cache import ExpertCache, MissMode
from casmoe.cli import requests as choose
from casmoe.cli.app import ADAPTIVE_GATING, app, progress
from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE, shipped


@app.command()
def replay(
    trace: Optional[Path] = typer.Option(None, help=f"Trace (.npz); default: the shipped {DEFAULT_TRACE}."),
    policy: Optional[list[str]] = typer.Option(
        None,
        help="Policy, repeatable: NAME, NAME[key=value,...] (sch[m=4], static[profile=t.npz]) or "
        "package.module:Class; default: all.",
    ),
    capacity: Optional[str] = typer.Option(
        None, help="Slots per MoE layer (4), or expert memory (24GB) if the trace knows expert sizes; default: 2 x top_k."
    ),
    global_capacity: Optional[str] = typer.Option(None, help="One pool shared by all layers: slots or memory."),
    miss_mode: MissMode = typer.Option(MissMode.LOAD, help="What a miss does (cpu: computed where it lives)."),
    batch: int = typer.Option(1, min=1, help="Requests whose decode tokens share a step."),
    planner: Optional[Path] = typer.Option(None, help="casmoe: a fitted planner folder (else exact and noisy oracles)."),
    split: str = choose.SPLIT,
    task: Optional[list[str]] = choose.TASK,
    span: Optional[str] = choose.RANGE,
    requests: Optional[int] = choose.requests_option(""),
    adaptive_gating: Optional[float] = ADAPTIVE_GATING,
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Replay a trace through cache policies with no timing; print hit rates and loads.

    Hit rate = (hits + late hits) / routed accesses, where an access is one expert routed at one
    layer of one step (prefill is one step: the union of its tokens' experts).
    """
    from casmoe.compiled import uses_twin
    from casmoe.gating import gate_trace
    from casmoe.options import one_capacity
    from casmoe.policies import POLICIES, parse_policies
    from casmoe.replay import replay as run_replay
    from casmoe.selection import Selection
    from casmoe.step_arrays import StepArrays
    from casmoe.trace_io import load_trace

    whole = gate_trace(load_trace(trace or shipped(DEFAULT_TRACE)), adaptive_gating)
    cap = one_capacity(capacity, global_capacity, whole.geometry)
    specs = parse_policies(policy, POLICIES, planner=str(planner) if planner else None)
    scored = Selection.of(split, task, span, requests).resolve(whole, specs)
    tr = scored.pick(whole)
    ExpertCache(tr.geometry, cap)  # a capacity no policy can use fails here, whichever policies run
    caches, skipped = [], []
    for spec in list(specs):  # fail before work; of every policy (no --policy), those this trace can run
        try:
            caches.append(spec.create(tr.geometry, cap, miss_mode=miss_mode, trace=tr, source=whole))
        except CasmoeError as exc:
            if policy and policy != ["all"]:
                raise
            specs.remove(spec)
            skipped.append(f"skipped {spec.label}: {exc}")
    steps, arrays = None, None  # built once, for the policies that run in Python / compiled
    records = []
    for spec, cache in zip(progress(specs, desc="replay", unit="policy", quiet=len(specs) < 2 or as_json), caches):
        if uses_twin(cache, tr):
            arrays = StepArrays.from_trace(tr, batch) if arrays is None else arrays
        else:
            steps = tr.steps(batch) if steps is None else steps
        result = run_replay(tr, cache, batch=batch, steps=steps, arrays=arrays).to_dict()
        records.append({**result, "policy": spec.label, "oracle": spec.oracle or spec.label in scored.starred})
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    from casmoe.report import print_replay

    gated = "" if adaptive_gating is None else f", adaptive gating >= {adaptive_gating:g} (lossy)"
    print_replay(records, f"{tr.geometry.describe()}, {scored.describe()}, {tr.tokens} tokens{gated}")
    for note in skipped:
        typer.echo(note)
