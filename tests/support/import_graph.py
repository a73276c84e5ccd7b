"""casmoe's own import graph, read from the source (function-local and dynamic imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PACKAGES = {"casmoe": ROOT / "casmoe"}
"""Import name -> source folder: every folder below casmoe/ is its own import path."""


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Import name -> file of every module under the mapped folders (a folder mapped to its
    own name wins over the same path reached through a parent's folder)."""
    found: dict[str, Path] = {}
    for name, folder in sorted(packages.items(), key=lambda kv: len(kv[0])):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _under_type_checking(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                hidden.update(id(n) for n in ast.walk(stmt))
    return hidden


def imports(name: str, path: Path, known: set[str]) -> dict[str, bool]:
    """The internal modules `name` imports -> whether only under TYPE_CHECKING. A name the
    module passes to `import_module` through a variable is matched by its string constants:
    every literal that names a known module counts (casmoe/__init__.py's lazy table)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    hidden = _under_type_checking(tree)
    found: dict[str, bool] = {}

    def add(target: str, node: ast.AST) -> None:
        while target and target not in known:  # `import casmoe.sim.passes.driver.x` -> the module part
            target = target.rpartition(".")[0]
        if target and target != name:
            found[target] = found.get(target, True) and id(node) in hidden

    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node)
        elif isinstance(node, ast.Call) and (ast.unparse(node.func).endswith("import_module") or ast.unparse(node.func) == "__import__"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(arg.value, node)
            else:
                dynamic = True
    if dynamic:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                add(node.value, node)
    return found


def graph(packages: dict[str, Path]) -> dict[str, dict[str, bool]]:
    files = modules(packages)
    return {name: imports(name, path, set(files)) for name, path in files.items()}
