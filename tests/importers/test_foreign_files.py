"""Files of the wrong kind are named as what they are (the user study's class 3): a zip given as a
CSV is "x.csv is a zip archive, not a routing CSV", never another format's parse error; every
CSV error names its file (and row); a file declaring more than memory holds is refused naming
it; no library's multi-line warning reaches the user. Every error is one `casmoe: error:` line,
exit 2, no traceback.

One sniffer (`casmoe.filekind`) serves every reader, so the matrix below crosses the kinds of
foreign file with the commands that read files.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.cli import assert_one_line, cli
from support.fuzzing import FUZZ, small_trace

from casmoe.errors import CasmoeError
from casmoe.filekind import describe, one_line, require, sniff
from casmoe.importers import read_route_csv, write_route_csv
from casmoe.resources import ResourceError
from casmoe.trace import TraceError


def _zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("notes.txt", "hello")


def _npy_pickle(path: Path) -> None:
    with open(path, "wb") as fh:
        np.save(fh, np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _npz_pickle(path: Path) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, a=np.array([{"a": 1}], dtype=object))


def _torch(path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"weight": torch.zeros(3)}, path)


def _write(data: bytes):
    return lambda path: path.write_bytes(data)


FOREIGN = {  # kind -> how to make one
    "zip": _zip,
    "npy-pickle": _npy_pickle,
    "npz-pickle": _npz_pickle,
    "torch": _torch,
    "empty": _write(b""),
    "folder": lambda path: path.mkdir(),
    "binary": _write(bytes(range(256)) * 8),
    "pickle": lambda path: path.write_bytes(pickle.dumps({"x": 1}, protocol=4)),
    "gzip": lambda path: path.write_bytes(gzip.compress(b"turn,step,layer,expert\n")),
    "png": _write(b"\x89PNG\r\n\x1a\n" + bytes(64)),
}

READERS = {  # the commands that read a user's file, with the name the user gave it
    "route CSV": (["trace", "import", "x.csv", "-o", "o.npz"], "x.csv", "a routing CSV"),
    "JSON routing": (["trace", "import", "--format", "json", "x.json", "-o", "o.npz"], "x.json", "a JSON routing file"),
    "trace": (["trace", "info", "x.npz"], "x.npz", "a casmoe trace"),
    "profile": (["popularity", "info", "x.npz"], "x.npz", "a casmoe profile or trace"),
    "ktransformers": (["popularity", "import", "--format", "ktransformers", "x.pt", "-o", "p.npz"], "x.pt",
                      "KTransformers activation frequencies"),
    "sglang dump": (["trace", "import", "--format", "sglang", "x.pt", "-o", "o.npz"], "x.pt", "an SGLang per_token dump"),
    "layer array": (["trace", "import", "x.npy", "--num-experts", "4", "-o", "o.npz"], "x.npy", "a per-layer routing array"),
}


TAKEN = {"ktransformers": {"torch", "folder"}, "sglang dump": {"torch", "folder"}, "layer array": {"folder"},
         "route CSV": {"folder"}}
"""Kinds a reader takes (a folder of dumps or layer files; a torch file of something else)."""


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_foreign_file_is_named_as_what_it_is(tmp_path, monkeypatch, capsys, reader, kind):
    argv, name, what = READERS[reader]
    FOREIGN[kind](tmp_path / name)
    assert sniff(tmp_path / name) == kind
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    if kind in TAKEN.get(reader, ()):  # its reader's own kind: the reader says what the file lacks
        assert name in err
        return
    assert f"{name} is {describe(kind)}, not {what}" in err, err
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "p.npz").exists()


def test_an_accepted_kind_reaches_its_reader(tmp_path):
    """The sniffer only refuses: a real file of the accepted kind is read as before."""
    tr = small_trace()
    write_route_csv(tr, tmp_path / "t.csv")
    assert sniff(tmp_path / "t.csv") == "text" and len(read_route_csv(tmp_path / "t.csv").requests) == len(tr.requests)
    from casmoe.trace_io import load_trace, save_trace

    save_trace(tr, tmp_path / "t.npz")
    assert sniff(tmp_path / "t.npz") == "npz" and load_trace(tmp_path / "t.npz").tokens == tr.tokens
    (tmp_path / "t.json").write_text(json.dumps({"num_experts": 4, "top_k": 2, "requests": []}))
    assert sniff(tmp_path / "t.json") == "json"
    (tmp_path / "l.csv").write_bytes("# caf\xe9\n".encode("latin-1"))
    assert sniff(tmp_path / "l.csv") == "other-text"


@FUZZ
@given(data=st.binary(max_size=600), name=st.sampled_from(["x.csv", "x.json", "x.npz", "x.pt", "x.npy"]))
def test_any_bytes_are_sniffed_and_refused_in_one_line(tmp_path, data, name):
    path = tmp_path / name
    path.write_bytes(data)
    kind = sniff(path)
    assert kind in describe.__globals__["DESCRIPTIONS"] or kind == "missing"
    try:
        require(path, {"never"}, "a thing", TraceError)
    except TraceError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes")
def test_a_pipe_is_never_read_to_look_at_it(tmp_path):
    """Sniffing a pipe would consume its data (or block with no writer): it is named, not read."""
    import os

    os.mkfifo(tmp_path / "p.csv")
    assert sniff(tmp_path / "p.csv") == "special"
    with pytest.raises(TraceError, match=r"p\.csv is a pipe or device \(save it to a file first\), not a routing CSV"):
        read_route_csv(tmp_path / "p.csv")


def test_one_line_takes_the_first_line_of_a_library_paragraph():
    assert one_line(ValueError("\n  first line\nsecond line")) == "first line"
    assert one_line(ValueError("")) == "ValueError"
    assert len(one_line(ValueError("x" * 500))) == 200


# ---- CSV: every error names its file (and row) ---------------------------------------------------


@FUZZ
@given(line=st.integers(0, 40), edit=st.sampled_from(["drop", "double", "junk", "minus", "huge", "cut", "field"]),
       column=st.integers(0, 6))
def test_every_csv_error_names_its_file(tmp_path, line, edit, column):
    write_route_csv(small_trace(2), tmp_path / "my-routing.csv")
    lines = (tmp_path / "my-routing.csv").read_text().splitlines(keepends=True)
    i = min(line, len(lines) - 1)
    cells = lines[i].rstrip("\n").split(",")
    c = min(column, len(cells) - 1)
    if edit == "drop":
        del lines[i]
    elif edit == "double":
        lines.insert(i, lines[i])
    elif edit in ("junk", "minus", "huge"):
        cells[c] = {"junk": "x1", "minus": "-7", "huge": "1e12"}[edit]
        lines[i] = ",".join(cells) + "\n"
    elif edit == "cut":
        lines[i] = lines[i][: len(lines[i]) // 2] + "\n"
    else:
        lines[i] = lines[i].rstrip("\n") + ",9\n"
    (tmp_path / "my-routing.csv").write_text("".join(lines))
    try:
        read_route_csv(tmp_path / "my-routing.csv")
    except (TraceError, ResourceError) as exc:
        assert str(exc).startswith(str(tmp_path / "my-routing.csv")) and "\n" not in str(exc), str(exc)


@pytest.mark.parametrize("rows,says", [
    ("0,0,0,1\n0,0,0,1\n", "data row 2: step 0, layer 0: expert 1 routed twice (first in data row 1)"),
    ("0,0,0,1\n0,0,0,2\n0,0,0,3\n", "data row 3: step 0, layer 0: slot 0 given twice (first in data row 1)"),
    ("0,0,0,1\n0,0,0,x\n", "data row 2: expert 'x' is not a number"),
    ("0,0,0,1\n0,0,0,-2\n", "data row 2: expert -2 outside [0, 4)"),
])
def test_csv_faults_in_given_rows_name_the_row(tmp_path, rows, says):
    text = "# n_layer=1 n_expert=4 n_expert_used=2\nturn,step,layer,expert\n" + rows
    if "slot 0 given twice" in says:
        text = text.replace("turn,step,layer,expert\n", "turn,step,layer,slot,expert\n").replace(
            "0,0,0,1\n0,0,0,2\n0,0,0,3\n", "0,0,0,0,1\n0,0,0,1,2\n0,0,0,0,3\n")
    (tmp_path / "x.csv").write_text(text)
    with pytest.raises(TraceError) as err:
        read_route_csv(tmp_path / "x.csv")
    assert str(err.value).startswith(str(tmp_path / "x.csv")) and says in str(err.value), str(err.value)


def test_a_non_numeric_cell_names_its_row_and_column(tmp_path):
    (tmp_path / "x.csv").write_text("# n_layer=1 n_expert=4 n_expert_used=2\nturn,step,layer,expert\n0,0,0,1\n0,0,0,x\n")
    with pytest.raises(TraceError, match=r"x\.csv: data row 2: expert 'x' is not a number"):
        read_route_csv(tmp_path / "x.csv")


# ---- sizes beyond memory name the file -----------------------------------------------------------


def _npy_declaring(path: Path, rows: int) -> None:
    header = f"{{'descr': '<i8', 'fortran_order': False, 'shape': ({rows}, 2, 2), }}"
    header += " " * (118 - len(header)) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))


@pytest.mark.parametrize("what", ["npy header", "csv tokens"])
def test_a_file_declaring_a_trillion_rows_is_refused_naming_it(tmp_path, monkeypatch, capsys, what):
    if what == "npy header":
        _npy_declaring(tmp_path / "big.npy", 10**12)
        argv = ["trace", "import", "big.npy", "--num-experts", "4", "-o", "o.npz"]
    else:
        (tmp_path / "big.csv").write_text('# n_layer=1 n_expert=4 n_expert_used=2\n# casmoe request={"turn": 0, '
                                          '"tokens": 1000000000000}\nturn,step,layer,expert\n0,0,0,1\n0,0,0,2\n')
        argv = ["trace", "import", "big.csv", "-o", "o.npz"]
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert argv[2] in err


def test_memory_errors_inside_a_reader_name_the_file(tmp_path, monkeypatch):
    from casmoe.importers import import_trace
    from casmoe.importers import route_csv

    write_route_csv(small_trace(), tmp_path / "t.csv")

    def boom(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.3 TiB")

    monkeypatch.setattr(route_csv, "_csv_request", boom)
    with pytest.raises(ResourceError, match=r"t\.csv: out of memory while reading it \(Unable to allocate 7\.3 TiB\)"):
        import_trace([tmp_path / "t.csv"])


# ---- no library warnings reach the user ----------------------------------------------------------


def test_numpy_warnings_of_extreme_logits_stay_silent(tmp_path, monkeypatch, capsys):
    logits = np.zeros((1, 3, 4))
    logits[0, 0, :2] = (1e308, -1e308)  # the softmax's subtraction overflows: numpy warns in two lines
    np.save(tmp_path / "l0.npy", logits)
    np.save(tmp_path / "l1.npy", logits)
    code, out, err = cli(["trace", "import", "l0.npy", "l1.npy", "--top-k", "2", "-o", "o.npz"], tmp_path, monkeypatch,
                         capsys)
    assert code == 0, err
    assert "Warning" not in err and err.strip() == "", err


def test_a_torch_warning_of_a_pickle_protocol_stays_silent(tmp_path, monkeypatch, capsys):
    (tmp_path / "p.pt").write_bytes(pickle.dumps({"logical_count": [1, 2]}, protocol=4))
    code, _, err = cli(["popularity", "import", "--format", "ktransformers", "p.pt", "-o", "o.npz"], tmp_path,
                       monkeypatch, capsys)
    assert_one_line(code, err)
    assert "Warning" not in err and len(err.strip().splitlines()) == 1


def test_a_hand_written_file_that_is_no_text_is_named(tmp_path):
    from casmoe.sim.box.hardware import HardwareError, load_profile

    _zip(tmp_path / "box.toml")
    with pytest.raises(HardwareError, match=r"box\.toml is a zip archive, not a hardware profile"):
        load_profile(tmp_path / "box.toml")
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(HardwareError, match=r"dir\.toml is a folder, not a hardware profile"):
        load_profile(tmp_path / "dir.toml")


def test_every_foreign_error_is_a_casmoe_error():
    """The CLI prints CasmoeError as one line: the sniffer's refusals are of that kind."""
    buf = io.BytesIO()
    try:
        require(Path("/nonexistent/x.csv"), {"text"}, "a routing CSV", TraceError)
    except CasmoeError as exc:
        buf.write(str(exc).encode())
    assert buf.getvalue() == b"/nonexistent/x.csv: no such file"
