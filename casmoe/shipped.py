"""Where the data shipped with the repository lives (traces, corpus, tiny models).

`traces/` sits beside the package in a source checkout (the README installs editable);
`CASMOE_DATA` points elsewhere, e.g. for a regular install.
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
    return Path(env) if env else Path(__file__).resolve().parents[1] / "traces"


def shipped(name: str) -> Path:
    """Path of a shipped file; a clear error if this install has no `traces/` folder."""
    path = data_dir() / name
    if not path.exists():
        raise FileNotFoundError(
            f"shipped file {name!r} not found under {data_dir()}; run from a source checkout "
            "(pip install -e .) or set CASMOE_DATA to the repository's traces/ folder"
        )
    return path
