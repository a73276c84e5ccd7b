"""Optional Chrome/Perfetto trace of a simulation: one compute and one link track per device.

The engine holds `None` instead of a recorder by default, so the hot loop pays one pointer
test per layer. Open the written JSON in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from casmoe.output import write_text

COMPUTE_TRACK = 0
LINK_TRACK = 1


class Timeline:
    """Collects spans in simulated seconds; writes Chrome trace events in microseconds."""

    def __init__(self, experts_per_layer: int, devices: int, label: str = "") -> None:
        self._E = experts_per_layer
        self.devices = devices
        self.label = label
        self.events: list[dict[str, Any]] = []

    def compute(self, device: int, start: float, end: float, layer: int) -> None:
        self._span(device, COMPUTE_TRACK, start, end, f"L{layer}", "compute")

    def stall(self, device: int, start: float, end: float, layer: int) -> None:
        self._span(device, COMPUTE_TRACK, start, end, f"stall L{layer}", "stall")

    def copy(self, device: int, start: float, end: float, expert: int, demand: bool) -> None:
        """`expert` is a flat id of the whole model."""
        layer, e = divmod(expert, self._E)
        self._span(device, LINK_TRACK, start, end, f"L{layer}E{e}", "demand" if demand else "prefetch")

    def _span(self, pid: int, tid: int, start: float, end: float, name: str, cat: str) -> None:
        self.events.append(
            {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start * 1e6, "dur": (end - start) * 1e6}
        )

    def to_chrome(self) -> dict[str, Any]:
        meta: list[dict[str, Any]] = []
        for d in range(self.devices):
            name = f"{self.label} gpu{d}" if self.label else f"gpu{d}"
            meta.append({"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": name}})
            for tid, track in ((COMPUTE_TRACK, "compute"), (LINK_TRACK, "h2d link")):
                meta.append({"name": "thread_name", "ph": "M", "pid": d, "tid": tid, "args": {"name": track}})
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ms"}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text(path, json.dumps(self.to_chrome()))
