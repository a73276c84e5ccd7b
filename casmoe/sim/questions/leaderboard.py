"""The leaderboard: every built-in policy x every workload trace x cache sizes of 1, 1.5, 2 and 4 x
top_k slots per layer and every expert (all on the GPU, where the box holds it; on a box that
holds fewer than top_k per layer, the sizes it holds, as simulate's defaults), scored only on
requests no fitted component saw (nor their prompts). The placements' cells are also said in
their engines' terms (`--n-cpu-moe N`, `-ot` layers, KTransformers' GPU experts).

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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from casmoe.policies import POLICIES, PolicySpec, default_policies
from casmoe.report import UNCERTAINTY, uncertainty_cell, uncertainty_notes
from casmoe.selection import HOLDOUT_EVERY, split_indices
from casmoe.sim.questions.deploy.terms import engine_terms
from casmoe.sim.questions.search import steps_to_hold
from casmoe.sim.run.grid import Grid, Runs
from casmoe.sim.run.runner import whole_trace
from casmoe.sim.run.spec import file_digest
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
    experts: int = 0  # experts per layer: the size that holds all of them is 'all on the GPU'


def prepare(path: Path, folder: Path, requests: int) -> Halves:
    """Write the trace's two halves under `folder` (kept across runs: same content, same
    names); `requests` > 0 scores only the first N held-out requests."""
    trace = load_trace(path)
    labels = trace.meta.get("splits")
    own = isinstance(labels, list) and len(labels) == len(trace.requests)
    how = "the trace's own train/heldout split" if own else f"no split in the trace: every {HOLDOUT_EVERY}th request held out"
    train, heldout = split_indices(trace, "train"), split_indices(trace, "heldout")
    seen = {trace.requests[i].prompt for i in train if trace.requests[i].prompt}
    repeated = [i for i in heldout if trace.requests[i].prompt and trace.requests[i].prompt in seen]
    if repeated:  # a prompt also in the train half: what was fitted there would have seen it
        heldout = [i for i in heldout if i not in set(repeated)]
        how += f"; {len(repeated)} held-out request{'s' * (len(repeated) > 1)} whose prompt the train half also holds left out"
    if requests:
        heldout = heldout[:requests]
    stem = f"{path.stem}-{file_digest(path)}"
    scored, fit = folder / f"{stem}-heldout{len(heldout)}{'-unseen' * bool(repeated)}.npz", folder / f"{stem}-train.npz"
    held = trace.subset(heldout)
    for out, part in ((scored, held), (fit, trace.subset(train))):
        if not out.exists():
            folder.mkdir(parents=True, exist_ok=True)
            save_trace(part, out)
    return Halves(path.stem, scored, fit, how, len(heldout), held.tokens, trace.geometry.experts)


def capacities(top_k: int, experts: int = 0) -> list[str]:
    """1, 1.5, 2 and 4 x top_k slots per layer (rounded up), and every expert (all on the GPU)."""
    sizes = {math.ceil(f * top_k) for f in FACTORS} | ({experts} if experts else set())
    return [str(s) for s in sorted(s for s in sizes if not experts or s <= experts)]


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
        geometry = load_trace(h.scored).geometry
        top_k = geometry.top_k
        base = grid.with_values(trace=[str(h.scored)], policy=policies(h, fit_planner), split="all", requests=0)
        built = base.with_values(capacity=capacities(top_k, geometry.experts)).specs(strict=False)
        if built.specs and all(s in built.refused for s in built.specs):  # a box below top_k per layer
            built = base.specs(strict=False)  # the sizes it holds: staging slots, a pool of whole experts
            notes.append(f"{h.name}: the box holds fewer than top_k = {top_k} experts per layer, so the board "
                         "runs the sizes it holds (simulate's defaults: the slots per layer it holds, the rest "
                         "passing through staging slots, and the largest pool of whole experts)")
        specs += built.specs
        refused.update(built.refused)
        notes += [n for n in built.notes if n not in notes]
        groups += built.groups
    return Runs(specs, refused, notes, groups)


METRICS = (("hit_rate", "hit rate", "{:.1%}"), ("decode_tokens_per_s", "decode tok/s", "{:.3g}"),
           ("ttft_p50_s", "TTFT p50 (s)", "{:.3g}"), ("link_bytes", "bytes moved (GB)", "{:.3g}"))


def markdown(records: Sequence[dict[str, Any]], halves: Sequence[Halves], specs: Sequence[Any] = ()) -> str:
    """One table per workload, machine and metric: policies (oracles starred) x slots per layer;
    the train half's file, and a planner fitted on it, are written `train`. Each machine's
    tables say the model, the experts' precision and the box they were priced on (from `specs`,
    the runs of `records` in order); the points a machine could not run are one line per
    reason, naming the cells it covers, not one per cell."""
    lines = []
    aligned = len(specs) == len(records)
    runs = list(specs) if aligned else [None] * len(records)
    for h in halves:
        mine = [(s, r) for s, r in zip(runs, records) if Path(r["trace"]).name == h.scored.name]
        if not mine:
            continue
        lines += [f"### {h.name}: {h.requests} held-out requests, {h.tokens} tokens ({h.split})", ""]
        boxes: dict[Any, list[tuple[Any, dict[str, Any]]]] = {}
        for spec, r in mine:
            key = spec.machine if spec is not None else (r.get("model", "?"), r.get("hardware", "?"))
            boxes.setdefault(key, []).append((spec, r))
        for machine, pairs in boxes.items():
            rs = [r for _, r in pairs]
            lines += [_priced(machine, rs, h), ""]
            lines += _tables(rs, h)
            terms = _engine_terms(pairs, h)
            lines += terms + [""] if terms else []
            advice = _to_run(machine, rs, h)
            lines += [advice, ""] if advice else []
    lines.append("\\* oracle: reads the future (a bound, not a deployable policy).")
    return "\n".join(lines) + "\n"


def _engine_terms(pairs: Sequence[tuple[Any, dict[str, Any]]], h: Halves) -> list[str]:
    """The placements' cells as their engines are told them (`--n-cpu-moe N`, `-ot` layers,
    KTransformers' GPU experts, all on the GPU): what a user types to run the cell."""
    out = []
    for spec, r in pairs:
        if spec is None or "skipped" in r or not spec.policy.cls.fills_at_start:
            continue
        out.append(f"- {short_label(r['policy'], h)} at {_cap_title(r['capacity_spec'], h.experts)}: "
                   f"{engine_terms(spec)}")
    return ["placements in their engines' terms:", "", *out] if out else []


def _priced(machine: Any, records: Sequence[dict[str, Any]], halves: Halves) -> str:
    """'priced as mixtral-8x7b, bf16 experts (176 MB each), on my4090 (1 GPU), stack ideal': the
    stack named because every figure below assumed it."""
    stack = f", stack {records[0].get('stack', 'ideal')}" if records else ""
    if isinstance(machine, tuple):
        return f"priced as {machine[0]} on {machine[1]}{stack}"

    trace = whole_trace(str(halves.scored), file_digest(halves.scored))
    return f"priced as {machine.preset.name}, {machine.priced(trace)}, on {machine.box()}{stack}"


def _to_run(machine: Any, records: Sequence[dict[str, Any]], h: Halves) -> str:
    """For a machine that could not hold some of the leaderboard's cache sizes (fixed multiples
    of top_k): the options that would hold the largest of them."""
    refused = [r for r in records if "skipped" in r and "beside the dense weights" in r["skipped"]
               and r["capacity_spec"].isdigit()]
    if not refused or isinstance(machine, tuple):
        return ""

    trace = whole_trace(str(h.scored), file_digest(h.scored))
    sizes = [int(r["capacity_spec"]) for r in refused]
    steps = steps_to_hold(machine, trace, max(sizes), min(sizes))
    return (f"to run the sizes it skipped ({', '.join(map(str, sorted(set(sizes))))} slots/layer; the leaderboard's "
            f"sizes are 1, 1.5, 2 and 4 x top_k and every expert): {steps + ' per layer; or ' if steps else ''}"
            "--allow-overcommit "
            "(simulates a cache the GPUs do not hold)")


TRUSTED = "decode_tokens_per_s"
"""The metric whose table carries the uncertainty column: the validated spreads are of decode tok/s."""


def _cap_key(label: str) -> tuple[bool, int]:
    """Sizes in slots per layer first, then pools of whole experts ('57 global': a box below
    top_k per layer runs simulate's default sizes), each by size."""
    number, _, pool = label.partition(" ")
    return bool(pool), int(number)


def _cap_title(label: str, experts: int = 0) -> str:
    number, _, pool = label.partition(" ")
    if pool:
        return f"a pool of {number} whole experts"
    return f"{number} slots/layer" + (" (all on the GPU)" if experts and int(number) >= experts else "")


def _tables(records: Sequence[dict[str, Any]], h: Halves) -> list[str]:
    lines: list[str] = []
    caps = sorted({r["capacity_spec"] for r in records}, key=_cap_key)
    ran = [r for r in records if "skipped" not in r]

    def label_of(r: dict[str, Any]) -> str:
        return short_label(r["policy"], h) + ("*" if r.get("oracle") else "")

    if ran:
        for key, title, fmt in METRICS:
            extra = [UNCERTAINTY] if key == TRUSTED else []
            lines += [f"{title} | " + " | ".join([*(_cap_title(c, h.experts) for c in caps), *extra]),
                      "---|" + "---|" * (len(caps) + len(extra))]
            rows: dict[str, dict[str, str]] = {}
            for r in records:
                row = rows.setdefault(label_of(r), {})
                if "skipped" in r:
                    row[r["capacity_spec"]] = "n/a"
                else:
                    value = r[key] / 1e9 if key == "link_bytes" else r[key]
                    row[r["capacity_spec"]] = fmt.format(value)
                    row[UNCERTAINTY] = uncertainty_cell(r)
            lines += [f"{label} | " + " | ".join([*(row.get(c, "-") for c in caps), *(row.get(e, "-") for e in extra)])
                      for label, row in rows.items()]
            lines.append("")
            if key == "hit_rate":
                late = _late_line(ran, label_of)
                lines += [late, ""] if late else []
        notes = uncertainty_notes(ran, label_of)
        lines += ["uncertainty of decode tok/s (how far real systems of each kind landed from casmoe's figures: "
                  "casmoe validate published):", "", *(f"- {n}" for n in notes), ""] if notes else []
    else:
        lines += ["no point of this workload could be simulated on this machine:", ""]
    skipped = skipped_lines(records, h)
    lines += skipped + ([""] if skipped else [])
    return lines


def _late_line(records: Sequence[dict[str, Any]], label_of: Callable[[dict[str, Any]], str]) -> str:
    """The policies whose hits are mostly prefetches still in flight (late hits, which wait for
    the link as a miss does): layer-offload's 100% hit rate is its streamed layers arriving late."""
    late: dict[str, float] = {}
    for r in records:
        if r.get("accesses") and r.get("late_hits", 0) >= 0.1 * r["accesses"]:
            late[label_of(r)] = max(late.get(label_of(r), 0.0), r["late_hits"] / r["accesses"])
    if not late:
        return ""
    return ("a hit counts a prefetch still in flight when needed (a late hit: it waits for the link as a miss does); "
            "late hits, at most, of the accesses: " + ", ".join(f"{k} {v:.0%}" for k, v in late.items()))


def skipped_lines(records: Sequence[dict[str, Any]], h: Halves) -> list[str]:
    """One line per distinct reason a point was skipped, with the cells it covers: reasons that
    differ only in the cache size they name are one line (N standing for it)."""
    policies = list(dict.fromkeys(short_label(r["policy"], h) for r in records))
    caps = sorted({r["capacity_spec"] for r in records}, key=_cap_key)
    reasons: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        if "skipped" in r:
            cap = r["capacity_spec"]
            why = r["skipped"]
            if "beside the dense weights" in why:  # simulate's remedy (give --capacity ...): not a leaderboard
                why = why.split("; give ", 1)[0]  # option; the line after the tables says what holds the sizes
            why = re.sub(rf"(?<![\w.]){re.escape(cap)}(?![\w.])", "N", why) if cap.isdigit() else why
            reasons.setdefault(why, []).append((short_label(r["policy"], h), cap))
    out = []
    for why, cells in reasons.items():
        sizes = sorted({c for _, c in cells}, key=_cap_key)
        if len(sizes) == 1:
            why = re.sub(r"(?<![\w.])N(?![\w.])", sizes[0], why)
        names = list(dict.fromkeys(p for p, _ in cells))
        full = len(cells) == len(names) * len(sizes)  # every policy named, at every size named
        who = "every policy" if full and len(names) == len(policies) else ", ".join(names) if full else \
            "; ".join(f"{p} @ {', '.join(c for q, c in cells if q == p)}" for p in names)
        where = "every size" if full and len(sizes) == len(caps) else ", ".join(_cap_title(c, h.experts) for c in sizes)
        n = f" (N = {', '.join(sizes)})" if len(sizes) > 1 and "N" in re.findall(r"(?<![\w.])N(?![\w.])", why) else ""
        out.append(f"n/a, {who} at {where}{n}: {why}" if full else f"n/a, {who}{n}: {why}")
    return out


def short_label(label: str, halves: Halves) -> str:
    """A policy's label with the train half's file, and a planner folder fitted on it, written `train`."""
    label = label.replace(str(halves.train), "train")
    return re.sub(r"planner=[^,\]]*planner-[0-9a-f]{16}", "planner=train", label)
