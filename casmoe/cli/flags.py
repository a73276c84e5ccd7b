"""The run options of every command that simulates or replays, as Typer flags, made from their
one declaration (`casmoe.sim.run.options.OPTIONS`).

`@run_options("routing", "box", "serving")` adds one flag per option of those groups to a
command (a repeatable one for an axis) and hands the command the values given as one `Grid`
(`grid=`): the command never sees a flag it has to parse, and a new option reaches every
command from its declaration.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from casmoe.sim.run.options import OPTIONS, Option


def _default_text(option: Option) -> str:
    if option.default is None or option.kind is bool:
        return ""
    return f" [default: {option.default}]"


def _parameter(option: Option, text: str | None = None) -> inspect.Parameter:
    """The Typer parameter of one option: unset (None) unless given, so that a sweep file's key
    is kept where no flag overrides it, and a list for an axis; `text`, the command's own help
    for it (a default of its own)."""
    kind = option.kind
    # every flag but a switch collects its values, so that one given twice is refused, not overridden (`_one`)
    annotation: Any = Optional[kind] if kind is bool else Optional[list[kind]]
    flags = option.flags or (option.flag,)
    extra: dict[str, Any] = {}
    if option.minimum is not None and kind in (int, float):
        extra["min"] = option.minimum
    if kind is not bool:
        extra["metavar"] = {str: "TEXT", int: "INT", float: "FLOAT"}[kind]
    help_text = text if text is not None else option.help + _default_text(option)
    default = typer.Option(None, *flags, help=help_text, show_default=False, **extra)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _one(option: Option, values: Any) -> Any:
    """The value of a flag as given: a list for an axis (and --task), else its one value; an
    option of one value given twice is refused (the last would silently win)."""
    if option.kind is bool:
        return values
    if not values:
        return None
    if option.axis or option.name == "task":
        return values
    if len(values) > 1:
        from casmoe.sim.run.options import GridError

        shown = " and ".join(repr(v) if isinstance(v, str) else str(v) for v in values)
        raise GridError(f"the command line: {option.flag} is given {len(values)} times ({shown}); it takes one value")
    return values[0]


def _resolved(annotation: Any, command: Callable[..., Any]) -> Any:
    """A parameter's annotation as an object: `from __future__ import annotations` leaves a
    string, which names things in the command's module, not here."""
    return eval(annotation, command.__globals__) if isinstance(annotation, str) else annotation  # noqa: S307


def run_options(*groups: str, exclude: tuple[str, ...] = (), helps: dict[str, str] | None = None
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command taking `grid: Grid` with the flags of the options of `groups`; `helps`
    gives an option the help of a command whose default differs from simulate's (search's
    policies, the leaderboard's traces): the help must not promise simulate's default there."""
    chosen = [o for o in OPTIONS if o.group in groups and o.name not in exclude]
    helps = helps or {}
    unknown = set(helps) - {o.name for o in chosen}
    if unknown:
        raise ValueError(f"help for options this command does not take: {sorted(unknown)}")

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        own = [p.replace(annotation=_resolved(p.annotation, command)) for name, p in signature.parameters.items()
               if name != "grid"]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from casmoe.sim.run.grid import Grid  # the simulator loads when a command runs, not for --help

            given = {o.name: _one(o, kwargs.pop(o.name)) for o in chosen}
            return command(grid=Grid.of(given, "the command line"), **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + [_parameter(o, helps.get(o.name))
                                                                                   for o in chosen]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer reads this signature, not the wrapped function's
        return wrapper

    return decorate
