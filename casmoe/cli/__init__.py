"""`casmoe` command line. Each module registers its subcommands on `app`; errors that users
can fix (`CasmoeError`, missing files) print one line and exit 2 instead of a traceback."""

from __future__ import annotations

import sys

from casmoe.cli import backend, lrc, planner, record, replay, simulate, trace  # noqa: F401  (register commands)
from casmoe.cli.app import app
from casmoe.errors import CasmoeError


def main() -> None:
    try:
        app()
    except (CasmoeError, FileNotFoundError) as exc:
        print(f"casmoe: error: {exc}", file=sys.stderr)
        sys.exit(2)
