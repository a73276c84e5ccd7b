"""Every option of every command is read: a parameter the command's function never uses is an
option accepted and ignored (the class of `casmoe plan --stack` printing the same figure whatever
it was given). `tests/sim/questions/test_plan.py` walks plan's options through their answers; this guard covers
every command at the root, where an option is declared and dropped."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from typing import Any

import typer

from casmoe.cli import app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    subs = getattr(command, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from _commands(sub, (*path, name))
    elif command.callback is not None:
        yield " ".join(path), command


def _unread(function: Any) -> list[str]:
    """The parameters `function`'s body never names."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function)))).body[0]
    assert isinstance(tree, ast.FunctionDef), function
    used = {n.id for n in ast.walk(ast.Module(body=tree.body, type_ignores=[])) if isinstance(n, ast.Name)}
    return [a.arg for a in (*tree.args.args, *tree.args.kwonlyargs) if a.arg not in used]


def test_every_command_reads_every_option_it_declares() -> None:
    ignored, seen = [], 0
    for name, command in _commands(typer.main.get_command(app)):
        ignored += [f"casmoe {name} --{p.replace('_', '-')}" for p in _unread(command.callback)]
        seen += 1
    assert seen >= 20, "the walk found too few commands to be walking them all"
    assert not ignored, "options declared and never read:\n" + "\n".join(ignored)


def test_the_guard_catches_an_ignored_option() -> None:
    """The check above would fail on a command that drops an option."""
    def command(model: str, stack: str = "ideal") -> None:
        print(model)

    assert _unread(command) == ["stack"]
