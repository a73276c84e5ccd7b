"""Optional dependencies (the user study's class 5): `check_policy` without the test extra is one
error that says how to install it, not a `ModuleNotFoundError` from inside casmoe."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import REPO



@pytest.mark.parametrize("module", ["casmoe.sim.testing", "casmoe.testing"])
def test_check_policy_without_hypothesis_says_which_extra(monkeypatch, module):
    for name in [m for m in sys.modules if m == "hypothesis" or m.startswith("hypothesis.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    for name in ("casmoe.testing", "casmoe.sim.testing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import importlib

    from casmoe.errors import CasmoeError

    with pytest.raises(ModuleNotFoundError) as err:  # still an ImportError to code that catches those
        importlib.import_module(module)
    assert isinstance(err.value, CasmoeError) and err.value.name == "hypothesis"
    msg = str(err.value)
    assert "pip install 'casmoe[test]'" in msg and "\n" not in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no chained traceback


def test_a_users_test_file_sees_one_line(tmp_path):
    """What a user's test module prints when hypothesis is absent: the last line says what to do,
    and nothing from hypothesis' own import is chained to it."""
    code = "import sys; sys.modules['hypothesis'] = None\nfrom casmoe.sim.testing import check_policy\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("casmoe.testing.MissingExtraError: ") and "pip install 'casmoe[test]'" in last
    assert "During handling" not in done.stderr and "halted" not in done.stderr


def test_with_the_extra_it_imports():
    from casmoe.sim.testing import check_policy

    assert callable(check_policy)
