"""Shipped files a command makes are what that command makes now: the published boxes' profiles
(bench/published_profiles.py) and the synthetic traces (the commands traces/README.md gives). An edit
to a generator's inputs (a link's source, a catalog part, a new profile field, the synthetic model)
not followed by a rerun fails here, naming what to rerun, instead of shipping files that say
something their generator no longer does."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from support.cli import cli
from support.paths import REPO
from support.scripts import load_script

from casmoe.npz import format_meta, read_npz
from casmoe.trace import TraceError
from casmoe.trace_io import FORMAT_NAME, FORMAT_VERSION


def test_the_published_boxes_profiles_are_what_their_generator_writes() -> None:
    gen = load_script(REPO / "bench" / "published_profiles.py")
    shipped = {p.stem for p in gen.OUT.glob("*.toml")}
    assert shipped == set(gen.MAP), "rerun: python bench/published_profiles.py"
    stale = [name for name in gen.MAP if (gen.OUT / f"{name}.toml").read_text() != gen.text(name)]
    assert not stale, f"rerun: python bench/published_profiles.py ({len(stale)} stale, e.g. {stale[:3]})"


SYNTH = re.compile(r"^casmoe trace synth (traces/\S+\.npz) (.*)$", re.M)
SHIPPED_SYNTHETIC = SYNTH.findall((REPO / "traces" / "README.md").read_text(encoding="utf-8"))
LIKE_A_REAL_TRACE = "--like"
"""Fitting a real trace first takes 45-75 s a file on two cores: those commands run with -m slow."""


def _members(path: Path) -> dict[str, object]:
    """The archive's arrays and its metadata, read as the trace format reads them."""
    members = read_npz(path, TraceError)
    meta = format_meta(members.pop("meta"), str(path), TraceError, FORMAT_NAME, FORMAT_VERSION)
    meta.pop("created")  # the only thing a rerun changes, as traces/README.md says
    return {"meta": meta, **members}


@pytest.mark.parametrize("target,args", [
    pytest.param(target, args, id=Path(target).stem, marks=[pytest.mark.slow] if LIKE_A_REAL_TRACE in args else [])
    for target, args in SHIPPED_SYNTHETIC])
def test_each_shipped_synthetic_trace_is_what_its_documented_command_makes(target, args, tmp_path, monkeypatch,
                                                                          capsys) -> None:
    out = tmp_path / Path(target).name
    code, _, err = cli(["trace", "synth", str(out), *shlex.split(args)], REPO, monkeypatch, capsys)
    assert code == 0, err
    made, shipped = _members(out), _members(REPO / target)
    assert made.keys() == shipped.keys()
    assert made["meta"] == shipped["meta"]
    for name in shipped.keys() - {"meta"}:
        assert np.array_equal(made[name], shipped[name]), f"{target}: {name} differs from what the command makes"


def test_the_readme_documents_every_shipped_synthetic_trace() -> None:
    documented = {Path(target).name for target, _ in SHIPPED_SYNTHETIC}
    shipped = {p.name for p in (REPO / "traces").glob("synthetic-*.npz")}
    assert documented == shipped and len(documented) == 4
