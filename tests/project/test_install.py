"""A real install: the wheel built from this checkout, installed into a fresh virtual environment
outside it, runs the main commands on the data it ships.

An editable install (the README's, CI's) reads the checkout and hides whatever a wheel leaves
out (a package, a data file). The fresh environment borrows the running environment's
site-packages for the dependencies through a .pth file (a path line: the editable casmoe's own
.pth files there are not processed), so no torch is reinstalled; casmoe itself comes only from
the wheel, and the commands run from an empty folder without CASMOE_DATA.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.slow  # about 75 s on a loaded 2-core machine; .ci/run runs it after the default suite



def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _isolation() -> list[str]:
    """Build with this environment's setuptools when it builds wheels by itself (70.1 and later,
    as pyproject.toml asks for >= 68); else in pip's isolated build environment."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if (major, minor) >= (70, 1) else []


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(bin folder of the fresh environment, its environment variables, an empty work folder)."""
    root = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("CASMOE_DATA", "PYTHONPATH", "VIRTUAL_ENV")}
    wheels = root / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", *_isolation(), "-q", "-w", wheels, REPO, cwd=root, env=env)
    (wheel,) = wheels.glob("casmoe-*.whl")
    fresh = root / "venv"
    venv.EnvBuilder(with_pip=False).create(fresh)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)}))
    borrowed = [p for p in {*site.getsitepackages(), *sys.path} if p.endswith("site-packages") and Path(p).is_dir()]
    (purelib / "borrowed-deps.pth").write_text("\n".join(sorted(borrowed)) + "\n")
    python = fresh / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel, cwd=root, env=env)
    work = root / "work"
    work.mkdir()
    return fresh / "bin", env, work


def test_the_wheel_imports_from_the_fresh_environment_only(installed):
    bin_dir, env, work = installed
    code = ("import casmoe, casmoe.kernels, casmoe.cli, casmoe.sim.api, casmoe.backends;"
            "from casmoe.shipped import data_dir, shipped;"
            "print(casmoe.__file__); print(data_dir()); print(shipped('tiny-mixtral.npz'))")
    out = run(bin_dir / "python", "-c", code, cwd=work, env=env).stdout.splitlines()
    fresh = bin_dir.parent.resolve()
    assert all(Path(line).resolve().is_relative_to(fresh) for line in out), out
    assert Path(out[1]).name == "data"


def test_the_installed_cli_runs_simulate_replay_and_lrc_on_shipped_data(installed, tmp_path):
    bin_dir, env, work = installed
    casmoe = bin_dir / "casmoe"
    assert "casmoe/data/" in run(casmoe, "--help", cwd=work, env=env).stdout
    run(casmoe, "simulate", "--policy", "lru", "--policy", "static", "--capacity", "4", "--requests", "2", "--out",
        tmp_path / "sim", cwd=work, env=env)
    records = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert [r["policy"] for r in records] == ["lru", "static"] and all(r["decode_tokens_per_s"] > 0 for r in records)
    replay = json.loads(run(casmoe, "replay", "--policy", "lru", "--capacity", "4", "--requests", "40", "--json",
                            cwd=work, env=env).stdout)
    assert replay[0]["accesses"] > 0 and 0 < replay[0]["hit_rate"] < 1
    data = Path(run(bin_dir / "python", "-c", "from casmoe.shipped import data_dir; print(data_dir())", cwd=work,
                    env=env).stdout.strip())
    out = run(casmoe, "lrc", "-t", data / "real" / "qwen.route.csv", "--m", "16", "--rho", "2", "--replicates", "50",
              "--baselines", "lru", "--json", cwd=work, env=env).stdout  # the SCH/SRP kernels, compiled fresh
    assert json.loads(out)
