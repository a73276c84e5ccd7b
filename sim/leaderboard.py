"""The leaderboard: every built-in policy x every workload x cache sizes of 1, 1.5, 2 and 4 x top_k
slots per layer, scored only on requests no fitted component saw.

A workload is a trace split in two: its `train` requests fit whatever a policy fits (static's
popularity profile, moe-infinity's activation-matrix collection, a CasMoE planner given with
`planner`), its `heldout` requests are the ones simulated and scored. The split is the trace's
own (`meta["splits"]`, as `casmoe record` writes it) or, for a trace without one, every fifth
request held out (`casmoe.selection`, the planner's rule). Both halves are written beside the results, named by the source
trace's content, so the points (sweep `Point`s: resumable, Ray-able through `run_grid`) are
keyed by the content of everything that changes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from casmoe.options import CapacitySpec
from casmoe.policies import POLICIES, PolicySpec, default_policies
from casmoe.sim.sweep import Point, file_digest, preset_for
from casmoe.trace import Trace
from casmoe.trace_io import load_trace, save_trace

WORKLOADS = ("tiny-mixtral.npz", "tiny-olmoe.npz", "synthetic-qwen3.npz")
"""The shipped traces the leaderboard runs by default."""
FACTORS = (1.0, 1.5, 2.0, 4.0)
"""Slots per layer, as multiples of top_k (rounded up)."""
FITTED = {"static": "profile", "ktransformers": "profile", "moe-infinity": "fit"}
"""Policies fitted on a workload's train requests, and the option that takes them."""


@dataclass(frozen=True)
class Workload:
    name: str
    scored: Path  # the held-out requests that run
    train: Path  # the requests fitted components see
    split: str  # how the split was made
    requests: int  # scored requests
    tokens: int


def split(trace: Trace) -> tuple[list[int], list[int], str]:
    """(train, heldout) request indices (`casmoe.selection`'s rule) and how they were chosen."""
    from casmoe.selection import HOLDOUT_EVERY, split_indices

    labels = trace.meta.get("splits")
    own = isinstance(labels, list) and len(labels) == len(trace.requests)
    how = "the trace's own train/heldout split" if own else f"no split in the trace: every {HOLDOUT_EVERY}th request held out"
    return split_indices(trace, "train"), split_indices(trace, "heldout"), how


def prepare(path: Path, folder: Path, requests: int) -> Workload:
    """Write the workload's two halves under `folder` (kept across runs: same content, same
    names) and return it; `requests` > 0 scores only the first N held-out requests."""
    trace = load_trace(path)
    train, heldout, how = split(trace)
    if requests:
        heldout = heldout[:requests]
    stem = f"{path.stem}-{file_digest(path)}"
    scored, fit = folder / f"{stem}-heldout{len(heldout)}.npz", folder / f"{stem}-train.npz"
    held = trace.subset(heldout)
    for out, part in ((scored, held), (fit, trace.subset(train))):
        if not out.exists():
            folder.mkdir(parents=True, exist_ok=True)
            save_trace(part, out)
    return Workload(path.stem, scored, fit, how, len(heldout), held.tokens)


def capacities(top_k: int) -> list[CapacitySpec]:
    return [CapacitySpec(str(s)) for s in sorted({math.ceil(f * top_k) for f in FACTORS})]


def policies(workload: Workload, planner: str | None = None) -> list[PolicySpec]:
    """Every registered policy; the fitted ones fitted on the workload's train half, and with
    `planner` (a folder fitted on that half) CasMoE with it beside its oracle brackets."""
    out = []
    specs = default_policies(POLICIES)
    if planner is not None:
        at = next(i for i, s in enumerate(specs) if s.name == "casmoe")
        specs.insert(at, PolicySpec("casmoe", (("planner", planner),)))
    for spec in specs:
        option = FITTED.get(spec.name)
        out.append(PolicySpec(spec.name, tuple(sorted((*spec.options, (option, str(workload.train)))))) if option else spec)
    return out


def points(workloads: Sequence[Workload], hardware: str, planners: dict[str, str] | None = None,
           overcommit: bool = False, gating: float | None = None) -> list[Point]:
    """Every policy x cache size of every workload; a size beyond what the GPUs hold is skipped
    (n/a, with the reason) unless `overcommit` simulates it anyway; `gating` runs every point
    with AdapMoE's adaptive gating at that threshold (`casmoe.gating`)."""
    from casmoe.gating import check_threshold

    gating = None if gating is None else check_threshold(gating)
    out = []
    for w in workloads:
        trace = load_trace(w.scored)
        model = preset_for(trace, None)
        digest = file_digest(w.scored)
        for cap in capacities(trace.geometry.top_k):
            for spec in policies(w, (planners or {}).get(w.name)):
                out.append(Point(str(w.scored), model, hardware, spec, cap, trace_digest=digest, overcommit=overcommit,
                                 gating=gating))
    return out


METRICS = (("hit_rate", "hit rate", "{:.1%}"), ("decode_tokens_per_s", "decode tok/s", "{:.3g}"),
           ("ttft_p50_s", "TTFT p50 (s)", "{:.3g}"), ("link_bytes", "bytes moved (GB)", "{:.3g}"))


def markdown(records: Sequence[dict[str, Any]], workloads: Sequence[Workload],
             planners: dict[str, str] | None = None) -> str:
    """One table per workload and metric: policies (oracles starred) x slots per layer; a
    planner's folder (`planners`, by workload) is written `train`, as the train half's file is."""
    lines = []
    for w in workloads:
        planner = (planners or {}).get(w.name)
        mine = [r for r in records if Path(r["trace"]).name == w.scored.name]
        if not mine:
            continue
        caps = sorted({r["capacity_spec"] for r in mine}, key=int)
        lines += [f"### {w.name}: {w.requests} held-out requests, {w.tokens} tokens ({w.split})", ""]
        for key, title, fmt in METRICS:
            lines += [f"{title} | " + " | ".join(f"{c} slots/layer" for c in caps), "---|" + "---|" * len(caps)]
            rows: dict[str, dict[str, str]] = {}
            for r in mine:
                label = short_label(r["policy"], w, planner) + ("*" if r.get("oracle") else "")
                row = rows.setdefault(label, {})
                if "skipped" in r:
                    row[r["capacity_spec"]] = "n/a"
                else:
                    value = r[key] / 1e9 if key == "link_bytes" else r[key]
                    row[r["capacity_spec"]] = fmt.format(value)
            lines += [f"{label} | " + " | ".join(row.get(c, "-") for c in caps) for label, row in rows.items()]
            lines.append("")
        skipped = sorted({f"{short_label(r['policy'], w, planner)}: {r['skipped']}" for r in mine if "skipped" in r})
        lines += [f"n/a: {s}" for s in skipped] + ([""] if skipped else [])
    lines.append("\\* oracle: reads the future (a bound, not a deployable policy).")
    return "\n".join(lines) + "\n"


def short_label(label: str, workload: Workload, planner: str | None) -> str:
    """A policy's label with the train half's file, and the planner fitted on it, written `train`."""
    label = label.replace(str(workload.train), "train")
    return label.replace(planner, "train") if planner else label
