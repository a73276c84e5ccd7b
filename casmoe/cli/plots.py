"""`python -m casmoe.cli.plots OUT`: draw a report folder's PNGs from its results.json.

`casmoe simulate` and `casmoe sweep` start this in a detached process (`--plots background`,
the default) so that matplotlib's seconds are not spent before the command returns; each PNG
is written atomically, so a file that exists is whole.
"""

from __future__ import annotations

import sys
from pathlib import Path

from casmoe.cli.figures import draw_report

if __name__ == "__main__":
    draw_report(Path(sys.argv[1]))
