"""Tables, JSON/CSV files and PNG plots of results (matplotlib imported lazily)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def print_table(records: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> None:
    """A rich table on stdout, one row per record."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="left" if c in ("policy", "capacity", "name") else "right")
    for r in records:
        table.add_row(*(_fmt(r.get(c, "")) for c in columns))
    Console(width=200).print(table)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def write_csv(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Flat CSV that pandas reads; nested values are stored as JSON strings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for r in records:
        columns.extend(k for k in r if k not in columns)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in records:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})
