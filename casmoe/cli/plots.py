"""`python -m casmoe.cli.plots KIND OUT`: draw a folder's PNGs from what it holds: `report`, a
report folder's from its results.json; `plan`, a plan's from its plan.json; `leaderboard`, a
leaderboard's from its plots.json.

`casmoe simulate`, `sweep`, `plan` and `leaderboard` start this in a detached process (`--plots background`,
the default) so that matplotlib's seconds are not spent before the command returns; each PNG
is written atomically, so a file that exists is whole.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    kind, folder = sys.argv[1], Path(sys.argv[2])
    if kind in ("plan", "leaderboard"):
        from importlib import import_module

        import_module(f"casmoe.cli.{kind}").draw_pictures(folder)
    else:
        from casmoe.cli.figures import draw_report

        draw_report(folder)
