"""The request-selection options of replay, simulate and sweep (`casmoe.selection`), defined once."""

from __future__ import annotations

from typing import Optional

import typer

SPLIT = typer.Option(
    "auto",
    help="Requests scored: heldout, train, all, or auto (all, unless a policy was fitted on some of them "
    "(a planner, static's profile): then only those it never saw).",
)
TASK = typer.Option(None, help="Only requests of this task, repeatable.")
RANGE = typer.Option(None, "--range", help="Only requests START:STOP of the trace (Python slice bounds, e.g. 0:100).")


def requests_option(default_help: str) -> Optional[int]:
    return typer.Option(None, min=0, help=f"Only the first N selected requests (0: all). {default_help}")
