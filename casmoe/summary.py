"""What `simulate` and `sweep` print: which method wins per cache size, and every policy by family.

The answer comes first (`headline`): per cache size, the fastest *deployable* method (no oracle,
nothing fitted on the requests it is scored on) against the best plain reactive cache
(`casmoe.policies.family.plain_cache`: LRU, LFU or least-stale, the better of them), with the
ratio; on the ideal stack, both figures again on the stacks of the runtimes that run them
(`on_runtime`, priced by `casmoe.sim.run.runtimes`). Then the decode tokens/s of every policy,
grouped by family, a line per name saying what it is, and how far to trust the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from casmoe.policies.family import Family, describe, plain_cache, record_family
from casmoe.report import (ORACLE_NOTE, SPEED, UNCERTAINTY, policy_label, print_table, sig, uncertainty_cell,
                           uncertainty_notes, varied_axes)


def _row_label(r: dict[str, Any]) -> str:
    """A policy and the stack it ran on, as the uncertainty notes name a row."""
    return policy_label(r) + (f" on {r['stack']}" if "stack" in r else "")


def _capacity_columns(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(capacity label, heading) in growing cache size; the heading adds the size in GB when
    every record of that label has the same one."""
    sizes: dict[str, set[float]] = {}
    for r in records:
        sizes.setdefault(r["capacity"], set()).add(round(r["capacity_gb"], 6))
    order = sorted(sizes, key=lambda c: (min(sizes[c]), c))
    return [(c, f"{c}\n{sig(next(iter(sizes[c])))} GB" if len(sizes[c]) == 1 else c) for c in order]


def print_capacity_table(records: Sequence[dict[str, Any]], title: str, value: str = SPEED,
                         show: Callable[[float], str] = sig) -> None:
    """One row per policy (and per value of every varied axis), one column per cache size;
    rows grouped by family (`casmoe.policies.family`), each family named on its first row."""
    axes = varied_axes(records)
    columns = _capacity_columns(records)
    rows: dict[tuple, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: list(Family).index(record_family(r))):
        key = (policy_label(r), *(str(r.get(a)) for a in axes))
        row = rows.setdefault(key, {"family": record_family(r).value, "policy": key[0], **dict(zip(axes, key[1:]))})
        row[r["capacity"]] = show(r[value])
        row.setdefault(UNCERTAINTY, set()).add(uncertainty_cell(r))
    shown = [{**row, **{head: row.get(c, "-") for c, head in columns}, UNCERTAINTY: " / ".join(sorted(row[UNCERTAINTY]))}
             for row in rows.values()]
    ends = {i for i in range(len(shown) - 1) if shown[i]["family"] != shown[i + 1]["family"]}
    for i in range(len(shown) - 1, 0, -1):  # the family on its first row only
        if shown[i]["family"] == shown[i - 1]["family"]:
            shown[i]["family"] = ""
    print_table(shown, ["family", "policy", *axes, *(head for _, head in columns), UNCERTAINTY], title=title,
                sections=ends)


@dataclass(frozen=True)
class Verdict:
    """The answer for one cache size (and value of every varied axis): the fastest deployable
    record, the best plain reactive cache (`casmoe.policies.family.plain_cache`), and the
    fastest bound where one beats the deployable winner."""

    where: str
    best: dict[str, Any] | None
    baseline: dict[str, Any] | None
    bound: dict[str, Any] | None


def verdicts(records: Sequence[dict[str, Any]]) -> list[Verdict]:
    """One `Verdict` per cache size and value of every varied axis, in the records' order of
    axes, then growing cache. Ties go to the earlier record (the registry's order)."""
    axes = varied_axes(records)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((*(_axis_value(a, r.get(a)) for a in axes), r["capacity"]), []).append(r)
    seen: dict[tuple, int] = {}
    for k in groups:
        seen.setdefault(k[:-1], len(seen))
    out = []
    for key in sorted(groups, key=lambda k: (seen[k[:-1]], groups[k][0]["capacity_gb"])):
        group = groups[key]
        deployable = [r for r in group if not r.get("oracle")]
        best = _fastest(deployable)
        bound = _fastest([r for r in group if r.get("oracle")])
        where = ", ".join([*key[:-1], f"{key[-1]} ({sig(group[0]['capacity_gb'])} GB)"])
        out.append(Verdict(where, best, _fastest([r for r in deployable if plain_cache(r)]),
                           bound if bound and (best is None or bound[SPEED] > best[SPEED]) else None))
    return out


def _fastest(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return max(records, key=lambda r: r[SPEED], default=None)  # max keeps the first of equals


RUNTIME = "on_runtime"
"""The record field of a headline figure priced again on its runtime's stack (`casmoe.sim.run.runtimes`):
stack, decode tokens/s and its uncertainty fields."""


def headline(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per cache size (and varied axes): the fastest deployable method and its decode tok/s
    against the best plain cache, with the ratio; where the records carry them (`on_runtime`),
    the same two priced on their runtimes' stacks beside the ideal stack's upper bound, and a
    last line naming those stacks and their spreads; the bound that beats the winner, if one does."""
    name_stack = "stack" not in varied_axes(records)
    found = verdicts(records)
    lines = [_verdict_line(v, name_stack) for v in found]
    runtimes: dict[str, list[str]] = {}
    for v in found:
        for r in _shown(v):
            if RUNTIME in r:
                p = r[RUNTIME]
                runtimes.setdefault(f"{p['stack']} ({uncertainty_cell(p) or 'not validated'})", []).append(policy_label(r))
    if runtimes:
        lines.append("upper bounds on the ideal stack (no runtime cost); on their runtimes' stacks: " + "; ".join(
            f"{', '.join(dict.fromkeys(labels))} on {stack}" for stack, labels in runtimes.items()))
    return lines


def _shown(v: Verdict) -> list[dict[str, Any]]:
    """The verdict's winner and its baseline (once, when they are one record)."""
    return [r for r in (v.best, v.baseline if v.baseline is not v.best else None) if r is not None]


def _verdict_line(v: Verdict, name_stack: bool) -> str:
    if v.best is None:
        return f"{v.where}: only bounds ran" + (f" ({policy_label(v.bound)} {sig(v.bound[SPEED])} tok/s)"
                                                 if v.bound else "")
    text = f"{v.where}: {policy_label(v.best)} {sig(v.best[SPEED])} tok/s"
    if v.baseline is v.best:
        text += ", itself the best plain cache"
    elif v.baseline is not None:
        text += f" = {_ratio(v.best, v.baseline)} {policy_label(v.baseline)} ({sig(v.baseline[SPEED])})"
    priced = [r[RUNTIME] for r in _shown(v) if RUNTIME in r]
    if RUNTIME not in v.best:
        text += _trust(v.best, name_stack)
    elif len(priced) == 2:
        text += f"; on their runtimes {sig(priced[0][SPEED])} vs {sig(priced[1][SPEED])} = {_ratio(*priced)}"
    else:
        text += f"; on its runtime {sig(priced[0][SPEED])}"
    if v.bound is not None:
        text += f"; bound: {policy_label(v.bound)} {sig(v.bound[SPEED])}"
    return text


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> str:
    return f"{sig(a[SPEED] / b[SPEED])}x" if b[SPEED] > 0 else "n/a"


def _trust(best: dict[str, Any], name_stack: bool) -> str:
    """The stack a headline's figure assumed (unless the line names it already, as a varied axis)
    and how far to trust it: ', on the mixtral-offloading stack (x/÷ 1.50)'; nothing for a record
    without a stack."""
    if "stack" not in best:
        return ""
    cell = uncertainty_cell(best)
    return (f", on the {best['stack']} stack" if name_stack else "") + (f" ({cell})" if cell else "")


def _axis_value(axis: str, value: Any) -> str:
    """'rtx4090x4' for names, 'devices 4' for numbers that need their axis to read."""
    return str(value) if axis in ("trace", "model", "hardware") else f"{axis.replace('_', ' ')} {value}"


def legend(records: Sequence[dict[str, Any]]) -> list[str]:
    """One line per policy shown, in the table's order: its label and what it is."""
    labels = {policy_label(r): record_family(r) for r in records}
    order = sorted(labels, key=lambda label: list(Family).index(labels[label]))
    width = max(map(len, order), default=0)
    return [f"{label:<{width}}  {describe(label) or labels[label].value}" for label in order]


YOUR_BOX = ("Your own box and model: casmoe plan --model <GGUF file or preset> (it detects this machine when no "
            "--hardware is given; casmoe hardware detect writes its profile, to edit and pass as --hardware).")
"""The last line of `simulate`'s and `sweep`'s output (`casmoe.cli.reporting`)."""


def print_simulation(records: Sequence[dict[str, Any]], title: str, details: str) -> None:
    """What `simulate` and `sweep` print: the answer per cache size, the decode tok/s of every
    policy by family and cache size with what each name is, and how far to trust the figures;
    `details` names the files that hold every other measurement. `YOUR_BOX` closes the command's
    output (`casmoe.cli.reporting`)."""
    from rich.console import Console

    console = Console(width=200, highlight=False)
    console.print(f"[bold]{title}[/bold]", markup=True)
    console.print("Fastest deployable method per expert-cache size against the best plain cache (LRU, LFU or "
                  "least-stale), decode tokens/s:", markup=False)
    for line in headline(records):
        console.print("  " + line, markup=False)
    print_capacity_table(records, title="decode tokens/s by family, policy and expert-cache size")
    console.print("what each name is:", markup=False)
    for line in legend(records):
        console.print("  " + line, markup=False)
    if any(r.get("oracle") for r in records):
        console.print(ORACLE_NOTE, markup=False)
    notes = uncertainty_notes(records, _row_label)
    if notes:
        console.print("uncertainty (how far real systems of each kind landed from casmoe's figures: casmoe validate "
                      "published):", markup=False)
        for line in notes:
            console.print("  " + line, markup=False)
    console.print(details, markup=False)
