"""The user cache (the user study's class 4): a damaged `planner=auto` entry is fitted again with
a one-line note, never a failed run; a `CASMOE_CACHE` that names a file is one error naming it;
the embedder's ONNX export is keyed by the content it is made from, so every install with the
same model files shares one export, written atomically and made again when damaged.

Nothing here fits a planner or exports the real model: the fit is a planner built from parts
and the export writes a few bytes, so each case takes well under a second.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from casmoe.geometry import Geometry
from casmoe.planner import embedding
from casmoe.planner.embedding import CacheError, cache_dir
from casmoe.synthetic import SynthConfig, generate

pytest.importorskip("hnswlib")
G = Geometry(4, 8, 2)


# ---- planner=auto: a damaged entry is fitted again ------------------------------------------------


def _trace():
    trace = generate(G, SynthConfig(requests=6, prefill=(2, 4), decode=(4, 6), seed=0))
    for i, r in enumerate(trace.requests):
        r.prompt, r.task = f"prompt {i}", "t"
    return trace


def _parts_planner(trace, config=None, progress=False, **_):
    """What `fit_planner` returns, from parts: no sentence model, no training."""
    from casmoe.planner import EAPConfig, Planner, PlannerConfig
    from casmoe.planner.eam import EMBED_DIM, Matcher
    from casmoe.planner.fitdata import FitData
    from casmoe.planner.gate import ConfidenceGate
    from casmoe.planner.linear import LinearEAP
    from casmoe.planner.trajectory import fit_trajectory

    rng = np.random.default_rng(0)
    keys = rng.normal(size=(12, EMBED_DIM)).astype(np.float32)
    patterns = rng.random((12, G.layers, G.experts)).astype(np.float32)
    patterns /= patterns.sum(-1, keepdims=True)
    cfg = PlannerConfig(eap=EAPConfig(kind="linear"))
    return Planner(G, cfg, Matcher.build(keys, patterns, 5, 0), LinearEAP.fit(keys, patterns),
                   FitData.of(trace, trace, patterns[:6]), ConfidenceGate(np.zeros(0), np.array([0.5])),
                   fit_trajectory(trace, None, horizon=2))


@pytest.fixture
def fits(tmp_path, monkeypatch):
    """A cache folder of its own and a counting, instant fit."""
    from casmoe.planner import cached

    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path / "cache"))
    calls = []

    def fit(trace, config=None, progress=False, **kw):
        calls.append(1)
        return _parts_planner(trace, config)

    monkeypatch.setattr(cached, "fit_planner", fit)
    return calls


def _truncate(folder: Path, name: str) -> None:
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])


DAMAGE = {
    "truncated index": lambda f: _truncate(f, "eam.index"),
    "truncated predictor": lambda f: _truncate(f, "eap_linear.npz"),
    "wrong JSON": lambda f: (f / "planner.json").write_text("{not json"),
    "JSON of another shape": lambda f: (f / "planner.json").write_text(json.dumps({"format": 1})),
    "a part missing": lambda f: (f / "eam_patterns.npy").unlink(),
    "no manifest": lambda f: (f / "manifest.json").unlink(),
    "damaged manifest": lambda f: (f / "manifest.json").write_text("[]"),
    "a file in its place": lambda f: (shutil.rmtree(f), f.write_text("x")),
    "an empty folder": lambda f: [p.unlink() for p in f.iterdir()],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_entry_is_fitted_again_with_a_note(fits, capsys, damage):
    from casmoe.planner.cached import cached_planner
    from casmoe.planner.planner import load_planner

    trace = _trace()
    first = cached_planner(trace)
    again = cached_planner(trace)
    assert len(fits) == 1 and again.fit_s is None and again.folder == first.folder  # read back, not refitted
    capsys.readouterr()
    DAMAGE[damage](first.folder)
    fixed = cached_planner(trace)
    err = capsys.readouterr().err
    assert len(fits) == 2 and fixed.fit_s is not None and fixed.note
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("casmoe: note: the cached planner planner-"), err
    assert "fitting it again" in lines[0] and "error" not in lines[0].lower()
    load_planner(fixed.folder)  # whole again
    assert cached_planner(trace).fit_s is None and len(fits) == 2


def test_a_run_with_a_damaged_entry_goes_on(fits, tmp_path, monkeypatch, capsys):
    """Through the console entry point: exit 0, the note, no error line (prompts embedded as
    random unit vectors: no sentence model)."""
    from casmoe.planner import planner as planner_module
    from casmoe.planner.cached import cached_planner
    from casmoe.planner.eam import EMBED_DIM

    def vectors(prompts, precision, known=None, progress=False):
        v = np.random.default_rng(len(prompts)).normal(size=(len(prompts), EMBED_DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    monkeypatch.setattr(planner_module, "embed_prompts", vectors)
    from casmoe.trace_io import save_trace
    from support.cli import cli

    trace = _trace()
    trace.meta["splits"] = ["train"] * 4 + ["test"] * 2
    save_trace(trace, tmp_path / "t.npz")
    from casmoe.trace_io import load_trace

    entry = cached_planner(load_trace(tmp_path / "t.npz")).folder
    (entry / "planner.json").write_text("{cut")
    capsys.readouterr()
    code, out, err = cli(["replay", "--trace", "t.npz", "--policy", "casmoe[planner=auto]", "--capacity", "4"],
                         tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "casmoe: note: the cached planner" in err and "casmoe: error" not in err


# ---- CASMOE_CACHE that cannot be a folder ----------------------------------------------------------


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_a_cache_path_that_is_a_file_is_one_error_naming_it(tmp_path, monkeypatch, capsys, where):
    (tmp_path / "f").write_text("mine")
    target = tmp_path / "f" if where == "a file" else tmp_path / "f" / "sub"
    monkeypatch.setenv("CASMOE_CACHE", str(target))
    with pytest.raises(CacheError) as err:
        cache_dir(create=True)
    msg = str(err.value)
    assert str(target) in msg and "CASMOE_CACHE" in msg and "File exists" not in msg and "\n" not in msg
    assert (tmp_path / "f").read_text() == "mine"


def test_the_planner_cache_refuses_a_file_before_fitting(fits, tmp_path, monkeypatch, capsys):
    from casmoe.planner.cached import cached_planner

    (tmp_path / "f").write_text("mine")
    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path / "f"))
    with pytest.raises(CacheError, match=r"is a file, not a folder \(CASMOE_CACHE="):
        cached_planner(_trace())
    assert not fits  # refused before any work


def test_a_cache_path_that_is_a_file_is_one_line_in_the_cli(tmp_path, monkeypatch, capsys):
    from support.cli import assert_one_line, cli

    trace = _trace()
    from casmoe.trace_io import save_trace

    save_trace(trace, tmp_path / "t.npz")
    (tmp_path / "f").write_text("mine")
    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path / "f"))
    code, _, err = cli(["replay", "--trace", "t.npz", "--policy", "casmoe[planner=auto]", "--capacity", "4"],
                       tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert str(tmp_path / "f") in err and "CASMOE_CACHE" in err


# ---- the embedder's export: one per content --------------------------------------------------------


@pytest.fixture
def fake_export(tmp_path, monkeypatch):
    """A model folder of small files and an export that writes a digest of them (counted)."""
    model = tmp_path / "site-a" / "minilm"
    (model / "1_Pooling").mkdir(parents=True)
    for name, text in (("model.safetensors", "weights"), ("config.json", "{}"), ("1_Pooling/config.json", "{}")):
        (model / name).write_text(text)
    monkeypatch.setattr(embedding, "model_dir", lambda: model)
    monkeypatch.setenv("CASMOE_CACHE", str(tmp_path / "cache"))
    exports = []

    def export(src: Path, out: Path) -> None:
        exports.append(src)
        out.write_bytes(b"onnx graph of " + (src / "model.safetensors").read_bytes())

    monkeypatch.setattr(embedding, "_export", export)
    return model, exports


def test_every_install_of_the_same_model_shares_one_export(fake_export, tmp_path, monkeypatch):
    model, exports = fake_export
    first = embedding.onnx_export()
    other = tmp_path / "site-b" / "minilm"  # another install: another path, other times
    shutil.copytree(model, other)
    os.utime(other / "model.safetensors", ns=(1, 1))
    monkeypatch.setattr(embedding, "model_dir", lambda: other)
    assert embedding.onnx_export() == first and len(exports) == 1
    (other / "model.safetensors").write_text("other weights")  # other content: its own export
    assert embedding.onnx_export() != first and len(exports) == 2
    names = sorted(p.name for p in first.parent.glob("*.onnx"))
    assert len(names) == 2 and not list(first.parent.glob("*.tmp"))


def test_the_key_follows_the_export_settings_and_versions(fake_export, monkeypatch):
    key = embedding.export_key()
    monkeypatch.setattr(embedding, "EXPORT_OPSET", 18)
    assert embedding.export_key() != key
    monkeypatch.setattr(embedding, "EXPORT_OPSET", 17)
    real = embedding._versions
    monkeypatch.setattr(embedding, "_versions", lambda *libs: {**real(*libs), "torch": "0.0.0"})
    assert embedding.export_key() != key


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "record lost", "record garbled"])
def test_a_damaged_export_is_made_again(fake_export, damage):
    _, exports = fake_export
    path = embedding.onnx_export()
    good = path.read_bytes()
    record = path.with_name(path.name + ".json")
    if damage == "truncated":
        path.write_bytes(good[:5])
    elif damage == "overwritten":
        path.write_bytes(b"x" * len(good))
    elif damage == "record lost":
        record.unlink()
    else:
        record.write_text("{")
    assert embedding.onnx_export() == path and path.read_bytes() == good and len(exports) == 2
    assert embedding.onnx_export() == path and len(exports) == 2  # intact now: reused


def test_a_moved_but_intact_export_is_kept(fake_export):
    """A copied cache (new times, same bytes) is checked by its hash and kept."""
    _, exports = fake_export
    path = embedding.onnx_export()
    os.utime(path, ns=(10**9, 10**9))
    assert embedding.onnx_export() == path and len(exports) == 1


def test_the_model_files_are_hashed_once_per_install(fake_export, monkeypatch):
    embedding.onnx_export()
    hashed = []
    real = embedding.sha256_file
    monkeypatch.setattr(embedding, "sha256_file", lambda p: hashed.append(p) or real(p))
    embedding.onnx_export()
    assert not [p for p in hashed if p.suffix != ".onnx"]
