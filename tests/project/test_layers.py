"""The layering DESIGN promises, read from the source: every module's imports (function-local
ones, `importlib.import_module("...")` and `__import__` included) form a graph with no cycle,
and every edge points down the stack core (`casmoe/`) < simulator (`casmoe/sim/`) < backend
(`casmoe/backends/`, which validates against the simulator) < command line (`casmoe/cli/`).

A cycle hidden behind a function-local import still runs (the second module is half-built when
the first needs it) and still makes the two modules one thing to change; an upward import makes
the core need the packages built on it. Imports under `if TYPE_CHECKING:` never run, so they
count for the layers but not for cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.import_graph import PACKAGES, ROOT, graph, modules

LAYERS = ("casmoe", "casmoe.sim.box", "casmoe.sim.cost", "casmoe.sim.passes", "casmoe.sim.trust", "casmoe.sim.run",
          "casmoe.sim.questions", "casmoe.sim", "casmoe.backends", "casmoe.cli")
"""Bottom to top: a module may import its own layer and the ones before it. Inside the simulator:
the box (hardware) < what prices a token < the passes that walk a run in time < how far a figure is
trusted < a run described and run < the questions answered with runs < the package's front door
(`casmoe.sim.api`, `casmoe.sim.testing`)."""
SCRIPTS = {"casmoe.__main__"}
"""`python -m casmoe`: a script that runs the command line (as the console script does), imported
by no module, so it sits at the top whatever folder holds it."""










def cycles(edges: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's), over imports that run."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, typing_only in edges.get(v, {}).items():
            if typing_only:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def layer(name: str, layers: tuple[str, ...]) -> int:
    """The highest layer whose package holds `name` (`casmoe.sim.x` is the simulator's)."""
    return max(i for i, top in enumerate(layers) if name == top or name.startswith(top + "."))


def upward(edges: dict[str, dict[str, bool]], layers: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer(b, layers) > layer(a, layers)
    )


def test_no_import_cycle():
    groups = cycles(graph(PACKAGES))
    assert not groups, "import cycles (each group imports itself through the others):\n" + "\n".join(map(" <-> ".join, groups))


def test_imports_point_down_the_layers():
    edges = graph(PACKAGES)
    assert not any(s in targets for targets in edges.values() for s in SCRIPTS), "a module imports a script"
    bad = upward({a: t for a, t in edges.items() if a not in SCRIPTS}, LAYERS)
    assert not bad, "imports up the stack core < sim < backends < cli:\n" + "\n".join(bad)


def test_the_checker_reads_every_package():
    """Guards the guard: a folder of code that is not a package would go unchecked (and would
    not be an import path), and setup.py must not map an import name to another folder."""
    assert "package_dir" not in (ROOT / "setup.py").read_text().replace('package_dir={"casmoe.data": "traces"}', "")
    folders = {p.parent for p in (ROOT / "casmoe").rglob("*.py") if "__pycache__" not in p.parts}
    assert not [f for f in folders if not (f / "__init__.py").exists()], "folders of code that are not packages"
    files = modules(PACKAGES)
    assert {"casmoe.cache", "casmoe.sim.passes.driver", "casmoe.backends.session", "casmoe.cli.replay"} <= set(files)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    "how",
    [
        "from pkg.b import f\n",  # at module level
        "def g():\n    from pkg.b import f\n    return f\n",  # hidden in a function
        "def g():\n    from . import b\n    return b\n",  # relative
        "import importlib\ndef g():\n    return importlib.import_module('pkg.b')\n",
        "import importlib\n_HOME = {'f': 'pkg.b'}\ndef g(n):\n    return importlib.import_module(_HOME[n])\n",
    ],
)
def test_a_reintroduced_cycle_fails(tmp_path, how):
    """The checker on a synthetic package where a imports b and b imports a back, written
    each way the tree's own cycles were hidden; and the same package without the back edge."""
    _write(tmp_path / "pkg", {"__init__.py": "", "a.py": "from pkg.b import f\n", "b.py": "def f():\n    return 1\n"})
    assert cycles(graph({"pkg": tmp_path / "pkg"})) == []
    _write(tmp_path / "pkg", {"b.py": how.replace("pkg.b", "pkg.a").replace("import b", "import a").replace("return b", "return a") + "def f():\n    return 1\n"})
    assert cycles(graph({"pkg": tmp_path / "pkg"})) == [["pkg.a", "pkg.b"]]


def test_type_checking_imports_are_no_cycle_but_still_a_layer(tmp_path):
    _write(tmp_path / "core", {"__init__.py": "", "a.py": "from core.b import f\n",
                               "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core.a import X\n    from core.top.c import Y\ndef f(): ...\n"})
    _write(tmp_path / "top", {"__init__.py": "", "c.py": "from core.a import f\n"})
    edges = graph({"core": tmp_path / "core", "core.top": tmp_path / "top"})
    assert cycles(edges) == []
    assert upward(edges, ("core", "core.top")) == ["core.b -> core.top.c"]


def private_imports(packages: dict[str, Path]) -> list[str]:
    """`from casmoe.x import _name` in a module other than casmoe.x (and not its own package's
    `__init__`): a private name used across modules is an API nobody declared."""
    files = modules(packages)
    found = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base not in files or base == name:
                continue
            found += [f"{name} imports {base}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(found)


def test_no_module_imports_another_modules_private_name():
    found = private_imports(PACKAGES)
    assert not found, "private names imported across modules:\n" + "\n".join(found)


@pytest.mark.parametrize("package", sorted({p.parent for p in (ROOT / "casmoe" / "sim").rglob("__init__.py")}))
def test_each_simulator_package_docstring_names_what_it_holds(package):
    """A reader opening a folder of the simulator learns from its `__init__` what each module
    and subpackage holds."""
    import importlib

    name = ".".join(package.relative_to(ROOT).parts)
    doc = importlib.import_module(name).__doc__ or ""
    names = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    names += sorted(p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    missing = [n for n in names if f"`{n}`" not in doc]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not say what these hold: {missing}"
