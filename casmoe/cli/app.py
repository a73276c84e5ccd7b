"""The Typer application every subcommand module registers on."""

from __future__ import annotations

import math
import typing
from typing import Any, Callable

import typer

from casmoe.errors import CasmoeError

app = typer.Typer(
    name="casmoe",
    help="Expert offloading for MoE models: traces, cache policies, simulator, backend, planner, metrics.\n\n"
    "Shipped data (the default trace, tiny models, prompt corpus, real route CSVs) is read from $CASMOE_DATA "
    "if set, else from traces/ of a source checkout, else from the installed package's casmoe/data/ folder. "
    "Errors you can fix print one line and exit with code 2.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rendering it with rich costs ~0.1 s of start-up
)


@app.callback()
def _root() -> None:
    """Expert offloading for MoE models (the help text is the app's)."""


def _is_float(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is float or typing.get_args(annotation) == (float,)


def _finite(param: Any, process: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`param.process_value` refusing nan and inf as written, before Typer's own parsing (whose
    range checks would call nan "not >= 0"): `--epsilon nan` compares false with everything,
    `--think inf` prints NaN, `--link-gbps nan` runs unlimited; no casmoe option means
    anything with them."""

    def check(ctx: Any, value: Any) -> Any:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            try:
                number = float(v) if isinstance(v, (str, float)) else 0.0
            except ValueError:
                continue  # not a number at all: Typer says so
            if not math.isfinite(number):
                name = max(param.opts, key=len) if param.opts else param.name
                raise CasmoeError(f"{name} must be a finite number, not {v}")
        return process(ctx, value)

    return check


def finite_floats(command: Any) -> Any:
    """`command` (the click command Typer builds) with every float option of it and of its
    subcommands refusing nan and inf (see `_finite`)."""
    for param in command.params:
        if _is_float(param):
            param.process_value = _finite(param, param.process_value)
    for sub in getattr(command, "commands", {}).values():
        finite_floats(sub)
    return command


def progress(iterable=None, *, quiet: bool = False, **kw):
    """A tqdm progress bar on stderr, shown only on a terminal (never in a pipe or a log file)
    and never when `quiet` (JSON or CSV on stdout, a single run)."""
    from tqdm import tqdm

    return tqdm(iterable, disable=True if quiet else None, **kw)


# Options of every command that runs specs through `casmoe.sim.run.runner.run_all` (sweep,
# leaderboard, search): declared once so that their meaning and help stay the same.
JOBS = typer.Option(2, min=1, help="Parallel local processes (or Ray CPUs for a local Ray).")
RAY = typer.Option(False, "--ray", help="Run the points on Ray (a local Ray unless --ray-address).")
RAY_ADDRESS = typer.Option(None, help="Ray cluster address (e.g. ray://head:10001); implies --ray.")

# The routing transform of every command that runs a policy on a trace or a model (replay,
# simulate, sweep, leaderboard, bench): `casmoe.gating`.
ADAPTIVE_GATING = typer.Option(
    None, "--adaptive-gating", min=0.0,
    help="AdapMoE's adaptive gating (lossy): a token whose top router weight is at least this share of its top-k "
    "weights runs that expert alone (0: every token one expert; above 1: no change). Default: off, the exact routing.",
)


def ray_target(ray: bool, ray_address: str | None) -> str | None:
    """`run_grid`'s ray_address from the two flags: a cluster, a local Ray, or None (processes)."""
    return ray_address or ("local" if ray else None)
