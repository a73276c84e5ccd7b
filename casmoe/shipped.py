"""Where the data shipped with casmoe lives (traces, corpus, tiny models, real route CSVs).

In order: `CASMOE_DATA` if set; `traces/` beside the package in a source checkout (an editable
install); else the installed package's own copy, `casmoe/data/` (a wheel holds all of traces/
but its two largest traces, see setup.py). `casmoe --help` says so.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TRACE = "tiny-mixtral.npz"
"""Routing recorded from the shipped tiny-mixtral model (Mixtral-8x7B's routing shape) on the
prompt corpus: the default input of replay, simulate and the planner."""
SYNTHETIC_TRACE = "synthetic-mixtral.npz"
"""The synthetic Mixtral-shaped trace with task-labelled prompts (`casmoe trace synth`)."""


def data_dir() -> Path:
    env = os.environ.get("CASMOE_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    checkout = here.parent / "traces"
    return checkout if (here.parent / "pyproject.toml").exists() and checkout.is_dir() else here / "data"


def shipped(name: str) -> Path:
    """Path of a shipped file; a clear error if this install has no `traces/` folder."""
    path = data_dir() / name
    if not path.exists():
        raise FileNotFoundError(
            f"shipped file {name!r} not found under {data_dir()}; set CASMOE_DATA to a folder that holds it "
            "(a source checkout's traces/; an installed wheel leaves out its largest traces)"
        )
    return path
