"""What a simulated figure is worth: its 80% interval from the error model
(`casmoe.sim.trust.error_model`), fitted on the published table's left-out residuals, and where
its configuration lies far from what that table measured.

Kept apart from `validation` (which runs grids) so that every run can say its uncertainty
without importing the validation machinery. A run's record carries its configuration as the
error model sees it (`error_point`, set by `casmoe.sim.run.runner.run`); `annotate` turns it
into `uncertainty` (words), `uncertainty_factor` (the interval: the figure x/÷ this; None where
nothing was validated: the ideal stack is an upper bound) and `uncertainty_outside` (more than
a doubling away from every measured box or model, or a runtime no published row ran), each
read again when a stored record is read, so an earlier fit never speaks for the current one.
`casmoe.report.uncertainty_cell` makes the table cell of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from casmoe.cache import MissMode
from casmoe.report import upper_bound
from casmoe.sim.trust.error_model import Point, load

PUBLISHED = Path(__file__).with_name("published")
MEASUREMENTS = PUBLISHED / "measurements.toml"
FAMILIES = ("gpu", "host", "stream", "cache")
IDEAL = "ideal"
FAR = 1.0
"""A box or model more than this far (in doublings of its numbers) from every measured one is
said to lie outside what was validated."""


def family(policy: str, miss_mode: str = "load") -> str:
    """The kind of configuration a run is: every expert on the GPU, host compute (a placement,
    a per-step host choice, or the cpu miss mode: the policy's own declaration,
    `ExpertCache.computes_on_host`), streaming whole layers, or caching."""
    from casmoe.policies import POLICIES

    if policy == "n-cpu-moe[n=0]":  # every expert on the GPU: nothing offloaded
        return "gpu"
    cls = POLICIES.get(policy.partition("[")[0])
    if cls is not None and cls.computes_on_host(MissMode(miss_mode)):
        return "host"
    if policy.startswith("layer-offload"):
        return "stream"
    return "cache"


def family_of(record: dict[str, Any]) -> str:
    """`family` of a record (or a published row's run)."""
    return family(str(record.get("policy", "")), str(record.get("miss_mode") or "load"))


def _where(record: dict[str, Any]) -> tuple[float | None, list[str]]:
    """The record's interval factor and where it lies outside what was validated."""
    model, point = load(), record.get("error_point")
    if model is None or point is None:
        return None, []
    p = Point.from_dict(point)
    x = dict(zip(("bias", "host", "cache", "stream", "host_only", "unseen_stack", "storage", "box", "model"),
                 p.features(model.seen)))
    far = [f"no published row ran the {p.stack} stack"] if x["unseen_stack"] else []
    far += [f"its {what} is {x[key]:.1f} doublings from the nearest measured one" for key, what in
            (("box", "box"), ("model", "model")) if x[key] > FAR]
    return model.factor(p), far


def factor(record: dict[str, Any]) -> float | None:
    """The 80% interval of the record's figure (the figure x/÷ this), or None where nothing was
    validated (an upper-bound stack, no error model yet)."""
    if upper_bound(record):
        return None
    return _where(record)[0]


def spread(record: dict[str, Any]) -> str:
    """What a record's figure is worth, in words."""
    if upper_bound(record):
        return (f"not validated: the {record.get('stack', IDEAL)} stack charges nothing beyond the hardware, an upper "
                "bound (name the runtime with --stack)")
    model = load()
    f, far = _where(record)
    if model is None or f is None:
        return "not validated yet: no error model (casmoe validate published --fit fits one)"
    held = f", which held {100 * model.coverage:.0f}% of published rows left out" if model.coverage is not None else ""
    text = f"x/÷ {f:.2f} (80% interval of the error model fitted on {model.rows} published rows{held})"
    return text + (f"; outside what was validated: {'; '.join(far)}" if far else "")


def annotate(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its `uncertainty` (words), `uncertainty_factor` and `uncertainty_outside`
    as of the error model now. A skipped record is returned as it is."""
    if "skipped" in record:
        return record
    f, far = (None, []) if upper_bound(record) else _where(record)
    return {**record, "uncertainty": spread(record), "uncertainty_factor": f, "uncertainty_outside": bool(far)}
