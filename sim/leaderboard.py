"""The leaderboard: every built-in policy x every workload trace x cache sizes of 1, 1.5, 2 and 4 x
top_k slots per layer, scored only on requests no fitted component saw.

Each trace is split in two `Halves`: its `train` requests fit whatever a policy fits (each
policy's `Fit.on_train`: static's and ktransformers' popularity profiles, moe-infinity's
collection, CasMoE's planner), its `heldout` requests are the ones simulated and scored. The
split is the trace's own (`meta["splits"]`, as `casmoe record` writes it) or, for a trace
without one, every fifth request held out (`casmoe.selection`). Both halves are written beside
the results, named by the source trace's content; the runs are built by `Grid.specs` and stored
by `run_all` like every other command's, keyed by the content of everything they depend on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from casmoe.policies import POLICIES, PolicySpec, default_policies
from casmoe.sim.grid import Grid, Runs
from casmoe.sim.spec import file_digest
from casmoe.trace_io import load_trace, save_trace

TRACES = ("tiny-mixtral.npz", "tiny-olmoe.npz", "synthetic-qwen3.npz")
"""The shipped traces the leaderboard runs by default."""
FACTORS = (1.0, 1.5, 2.0, 4.0)
"""Slots per layer, as multiples of top_k (rounded up)."""


@dataclass(frozen=True)
class Halves:
    """A trace split for the leaderboard: the held-out requests that run, the train ones that
    fitted components see, how the split was made, and the size of what is scored."""

    name: str
    scored: Path
    train: Path
    split: str
    requests: int
    tokens: int


def prepare(path: Path, folder: Path, requests: int) -> Halves:
    """Write the trace's two halves under `folder` (kept across runs: same content, same
    names); `requests` > 0 scores only the first N held-out requests."""
    from casmoe.selection import HOLDOUT_EVERY, split_indices

    trace = load_trace(path)
    labels = trace.meta.get("splits")
    own = isinstance(labels, list) and len(labels) == len(trace.requests)
    how = "the trace's own train/heldout split" if own else f"no split in the trace: every {HOLDOUT_EVERY}th request held out"
    train, heldout = split_indices(trace, "train"), split_indices(trace, "heldout")
    if requests:
        heldout = heldout[:requests]
    stem = f"{path.stem}-{file_digest(path)}"
    scored, fit = folder / f"{stem}-heldout{len(heldout)}.npz", folder / f"{stem}-train.npz"
    held = trace.subset(heldout)
    for out, part in ((scored, held), (fit, trace.subset(train))):
        if not out.exists():
            folder.mkdir(parents=True, exist_ok=True)
            save_trace(part, out)
    return Halves(path.stem, scored, fit, how, len(heldout), held.tokens)


def capacities(top_k: int) -> list[str]:
    return [str(s) for s in sorted({math.ceil(f * top_k) for f in FACTORS})]


def policies(halves: Halves, fit_planner: bool = True) -> list[PolicySpec]:
    """Every variant of every registered policy, each fitted on the train half (`on_train`;
    oracles as they are); CasMoE's planner only with `fit_planner`."""
    out = []
    for spec in default_policies(POLICIES):
        if "planner" in dict(spec.options) and not fit_planner:
            continue
        fitted = spec.on_train(halves.train)
        if fitted is not None:
            out.append(fitted)
    return out


def runs(halves: Sequence[Halves], grid: Grid, fit_planner: bool = True) -> Runs:
    """Every policy x cache size of every workload, with the user's other options (`grid`); a
    size beyond what the GPUs hold is skipped (n/a, with the reason) unless
    `--allow-overcommit` simulates it anyway."""
    specs, refused, notes, groups = [], {}, [], []
    for h in halves:
        top_k = load_trace(h.scored).geometry.top_k
        built = grid.with_values(trace=[str(h.scored)], policy=policies(h, fit_planner), capacity=capacities(top_k),
                                 split="all", requests=0).specs(strict=False)
        specs += built.specs
        refused.update(built.refused)
        notes += [n for n in built.notes if n not in notes]
        groups += built.groups
    return Runs(specs, refused, notes, groups)


METRICS = (("hit_rate", "hit rate", "{:.1%}"), ("decode_tokens_per_s", "decode tok/s", "{:.3g}"),
           ("ttft_p50_s", "TTFT p50 (s)", "{:.3g}"), ("link_bytes", "bytes moved (GB)", "{:.3g}"))


def markdown(records: Sequence[dict[str, Any]], halves: Sequence[Halves]) -> str:
    """One table per workload and metric: policies (oracles starred) x slots per layer; the
    train half's file, and a planner fitted on it, are written `train`."""
    lines = []
    for h in halves:
        mine = [r for r in records if Path(r["trace"]).name == h.scored.name]
        if not mine:
            continue
        caps = sorted({r["capacity_spec"] for r in mine}, key=int)
        lines += [f"### {h.name}: {h.requests} held-out requests, {h.tokens} tokens ({h.split})", ""]
        for key, title, fmt in METRICS:
            lines += [f"{title} | " + " | ".join(f"{c} slots/layer" for c in caps), "---|" + "---|" * len(caps)]
            rows: dict[str, dict[str, str]] = {}
            for r in mine:
                label = short_label(r["policy"], h) + ("*" if r.get("oracle") else "")
                row = rows.setdefault(label, {})
                if "skipped" in r:
                    row[r["capacity_spec"]] = "n/a"
                else:
                    value = r[key] / 1e9 if key == "link_bytes" else r[key]
                    row[r["capacity_spec"]] = fmt.format(value)
            lines += [f"{label} | " + " | ".join(row.get(c, "-") for c in caps) for label, row in rows.items()]
            lines.append("")
        skipped = sorted({f"{short_label(r['policy'], h)}: {r['skipped']}" for r in mine if "skipped" in r})
        lines += [f"n/a: {s}" for s in skipped] + ([""] if skipped else [])
    lines.append("\\* oracle: reads the future (a bound, not a deployable policy).")
    return "\n".join(lines) + "\n"


def short_label(label: str, halves: Halves) -> str:
    """A policy's label with the train half's file, and a planner folder fitted on it, written `train`."""
    import re

    label = label.replace(str(halves.train), "train")
    return re.sub(r"planner=[^,\]]*planner-[0-9a-f]{16}", "planner=train", label)
