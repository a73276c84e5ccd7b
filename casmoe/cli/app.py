"""The Typer application every subcommand module registers on."""

from __future__ import annotations

import math
from typing import Any, Callable

import typer

from casmoe.errors import CasmoeError

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


def _finite(callback: Callable[..., Any] | None) -> Callable[..., Any]:
    """A parameter callback that refuses nan and inf in a parsed float value, then runs the
    parameter's own callback: `--epsilon nan` compares false with everything, `--think inf`
    prints NaN, `--link-gbps nan` runs unlimited; no casmoe option means anything with them."""

    def check(ctx: Any, param: Any, value: Any) -> Any:
        values = value if isinstance(value, (list, tuple)) else [value]
        bad = next((v for v in values if isinstance(v, float) and not math.isfinite(v)), None)
        if bad is not None:
            name = max(param.opts, key=len) if getattr(param, "opts", None) else param.name
            raise CasmoeError(f"{name} must be a finite number, not {bad}")
        return value if callback is None else callback(ctx, param, value)

    return check


def finite_floats(command: Any) -> Any:
    """`command` (the click command Typer builds) with every parameter of it and of its
    subcommands refusing nan and inf (see `_finite`)."""
    for param in command.params:
        param.callback = _finite(param.callback)
    for sub in getattr(command, "commands", {}).values():
        finite_floats(sub)
    return command
