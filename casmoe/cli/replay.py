"""`casmoe replay`: walk a trace through cache policies and print their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cache import Capacity, CacheConfigError, MissMode
from casmoe.cli.app import app
from casmoe.policies import POLICIES, get_policy
from casmoe.replay import replay as run_replay
from casmoe.shipped import DEFAULT_TRACE, shipped
from casmoe.trace import Trace


def parse_capacity(capacity: Optional[int], global_capacity: Optional[int], default: int) -> Capacity:
    """`--capacity` (slots per layer) and `--global-capacity` (one pool) exclude each other."""
    if capacity is not None and global_capacity is not None:
        raise CacheConfigError("give --capacity (slots per layer) or --global-capacity (one pool), not both")
    if global_capacity is not None:
        return Capacity(global_capacity, per_layer=False)
    return Capacity(default if capacity is None else capacity)


@app.command()
def replay(
    trace: Optional[Path] = typer.Option(None, help="Trace (.npz); default: the shipped synthetic Mixtral trace."),
    policy: str = typer.Option("lru", help="Policy name, 'all', or package.module:ClassName."),
    capacity: Optional[int] = typer.Option(None, help="Slots per MoE layer (default: 2 x top_k)."),
    global_capacity: Optional[int] = typer.Option(None, help="One pool of slots shared by all layers."),
    miss_mode: MissMode = typer.Option(MissMode.LOAD, help="What a miss does."),
    batch: int = typer.Option(1, min=1, help="Requests whose decode tokens share a step."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Replay a trace through cache policies with no timing; print hit rates and loads."""
    tr = Trace.load(trace or shipped(DEFAULT_TRACE))
    cap = parse_capacity(capacity, global_capacity, 2 * tr.geometry.top_k)
    names = list(POLICIES) if policy == "all" else [policy]
    records = []
    for name in names:
        cls = get_policy(name)
        cache = cls.create(tr.geometry, cap, miss_mode=miss_mode, trace=tr)
        records.append(run_replay(tr, cache, batch=batch).to_dict())
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    from casmoe.report import print_table

    print_table(records, ["policy", "capacity", "hit_rate", "hits", "late_hits", "misses", "loads", "bytes_loaded"])
