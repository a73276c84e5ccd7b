"""The Typer application every subcommand module registers on."""

from __future__ import annotations

import typer

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


def progress(iterable=None, *, quiet: bool = False, **kw):
    """A tqdm progress bar on stderr, shown only on a terminal (never in a pipe or a log file)
    and never when `quiet` (JSON or CSV on stdout, a single run)."""
    from tqdm import tqdm

    return tqdm(iterable, disable=True if quiet else None, **kw)
