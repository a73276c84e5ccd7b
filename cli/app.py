"""The Typer application every subcommand module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="casmoe",
    help="Expert offloading for MoE models: traces, cache policies, simulator, backend, planner, metrics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rendering it with rich costs ~0.1 s of start-up
)


@app.callback()
def _root() -> None:
    """Expert offloading for MoE models: traces, cache policies, simulator, backend, planner, metrics."""
