"""The trace format: round trips, validation of every malformed input, atomic writes, gaps."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.geometry import Geometry
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError
from casmoe.trace_io import load_trace, save_trace, trace_arrays, validate_trace
from support.traces import assert_same, random_trace

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(
    L=st.integers(1, 5),
    E=st.integers(1, 12),
    k=st.integers(1, 4),
    n=st.integers(0, 4),
    optional=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_random_geometries(tmp_path, L, E, k, n, optional, seed):
    k = min(k, E)
    tr = random_trace(np.random.default_rng(seed), L, E, k, n, optional)
    path = tmp_path / "t.npz"
    save_trace(tr, path)
    back = load_trace(path)
    assert_same(tr, back)
    assert back.meta["source_model"] == "test" and back.meta["nested"] == {"a": [1, 2]}
    assert "created" in back.meta


def test_a_file_read_again_is_read_as_it_is_now_and_each_reader_owns_its_trace(tmp_path):
    """A process keeps the files it decoded, by their bytes: a file rewritten with its old
    times is read anew, and what one reader does to its trace never reaches another's."""
    path = tmp_path / "t.npz"
    first, second = (random_trace(np.random.default_rng(seed), 2, 8, 2, 3, False) for seed in (0, 1))
    save_trace(first, path)
    times = os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns
    mine = load_trace(path)
    mine.meta["note"] = "mine"
    mine.requests.pop()
    theirs = load_trace(path)
    assert_same(first, theirs)
    assert "note" not in theirs.meta and len(theirs.requests) == 3
    with pytest.raises(ValueError, match="read-only"):  # the requests are shared, so never edited in place
        theirs.requests[0].topk[0, 0, 0] = 0
    save_trace(second, path)
    os.utime(path, ns=times)  # the stat a cache keyed by times would trust
    assert_same(second, load_trace(path))


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_saved_file_has_the_mode_of_other_files(tmp_path, umask, mode):
    """The user's umask decides, as for any file they write (not mkstemp's 0600); set here,
    since the host's own umask is anyone's."""
    tr = random_trace(np.random.default_rng(0), 2, 4, 2, 2)
    before = os.umask(umask)
    try:
        save_trace(tr, tmp_path / "t.npz")
    finally:
        os.umask(before)
    assert (tmp_path / "t.npz").stat().st_mode & 0o777 == mode


# ---- malformed inputs -------------------------------------------------------------------------


def _valid(tmp_path: Path) -> tuple[dict[str, np.ndarray], Trace]:
    tr = random_trace(np.random.default_rng(1), 3, 6, 2, 3)
    return trace_arrays(tr), tr


def _write(tmp_path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


def _meta(arrays, **changes):
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(changes)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


def _set(arrays, name, index, value):
    arr = arrays[name].copy()
    arr[index] = value
    arrays[name] = arr


MALFORMED = {
    "topk shape": lambda a: a.update(topk=a["topk"][:, :, :1]),
    "weights shape": lambda a: a.update(weights=a["weights"][:-1]),
    "logits shape": lambda a: a.update(logits=a["logits"][:, :, :2]),
    "spec shape": lambda a: a.update(spec=a["spec"][:, :1]),
    "expert id too large": lambda a: _set(a, "topk", (2, 0, 0), 6),
    "expert id negative": lambda a: _set(a, "topk", (2, 0, 0), -5),
    "duplicate expert": lambda a: _set(a, "topk", (2, 1), 3),
    "half gap": lambda a: _set(a, "topk", (2, 1, 0), NOT_COMPUTED),
    "weighted gap": lambda a: _set(a, "weights", (0, 2, 0), 0.5),  # token 0, layer 2 is a gap
    "float spec": lambda a: a.update(spec=a["spec"].astype(np.float32)),
    "int logits": lambda a: a.update(logits=a["logits"].astype(np.int32)),
    "nan weight": lambda a: _set(a, "weights", (1, 0, 0), np.nan),
    "inf weight": lambda a: _set(a, "weights", (1, 0, 1), np.inf),
    "negative weight": lambda a: _set(a, "weights", (1, 2, 0), -0.5),
    "nan logit": lambda a: _set(a, "logits", (1, 2, 0), np.nan),
    "spec id out of range": lambda a: _set(a, "spec", (1, 0, 0), 99),
    "arrival count": lambda a: a.update(arrival=a["arrival"][:-1]),
    "arrival negative": lambda a: _set(a, "arrival", 1, -0.5),
    "arrival nan": lambda a: _set(a, "arrival", 2, np.nan),
    "arrival integers": lambda a: a.update(arrival=np.arange(3)),
    "prefill longer than request": lambda a: _set(a, "prefill", 0, 10_000),
    "negative prefill": lambda a: _set(a, "prefill", 1, -1),
    "unknown version": lambda a: _meta(a, version=99),
    "not a casmoe file": lambda a: _meta(a, format="other"),
    "bad geometry": lambda a: _meta(a, geometry={"layers": 0, "experts": 1, "top_k": 1}),
    "unknown geometry field": lambda a: _meta(a, geometry={"layers": 3, "experts": 6, "top_k": 2, "color": 1}),
    "geometry not a dict": lambda a: _meta(a, geometry=[3, 6, 2]),
    "request count": lambda a: a.update(prefill=a["prefill"][:-1]),
    "offsets not partitioning": lambda a: _set(a, "offsets", -1, 1),
    "offsets decreasing": lambda a: _set(a, "offsets", 1, 10**6),
    "offsets 2d": lambda a: a.update(offsets=a["offsets"][None]),
    "missing array": lambda a: a.pop("weights"),
    "meta not json": lambda a: a.update(meta=np.frombuffer(b"{not json", dtype=np.uint8)),
    "meta not utf8": lambda a: a.update(meta=np.frombuffer(b"\xff\xfe", dtype=np.uint8)),
    "meta a list": lambda a: a.update(meta=np.frombuffer(b"[1]", dtype=np.uint8)),
    "request info not list": lambda a: _meta(a, requests={"a": 1}),
    "prompt not a string": lambda a: _meta(a, requests=[{"prompt": 5}, {}, {}]),
    "float expert ids": lambda a: a.update(topk=a["topk"].astype(np.float32)),
    "int weights": lambda a: a.update(weights=a["weights"].astype(np.int32)),
    "meta 2d": lambda a: a.update(meta=a["meta"][None]),
    "prefill float": lambda a: a.update(prefill=a["prefill"].astype(np.float64) + 0.5),
    "offsets float": lambda a: a.update(offsets=a["offsets"].astype(np.float64)),
    "output ids without offsets": lambda a: a.pop("output_offsets"),
    "output offsets without ids": lambda a: a.pop("output_ids"),
    "negative output id": lambda a: a.update(output_ids=np.array([-3], np.int32), output_offsets=np.array([0, 1, 1, 1])),
    "float output ids": lambda a: a.update(output_ids=a["output_ids"].astype(np.float32)),
    "output offsets count": lambda a: a.update(output_offsets=a["output_offsets"][:-1]),
    "output offsets not partitioning": lambda a: _set(a, "output_offsets", -1, 10**6),
    "output not a string": lambda a: _meta(a, requests=[{"output": [1]}, {}, {}]),
}


@pytest.mark.parametrize("fault", list(MALFORMED))
def test_malformed_trace_raises_trace_error(tmp_path, fault):
    arrays, _ = _valid(tmp_path)
    MALFORMED[fault](arrays)
    path = _write(tmp_path, arrays)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"not a zip file at all", b"PK\x03\x04garbage", None],
    ids=["empty", "text", "bad zip", "truncated"],
)
def test_unreadable_files_raise_trace_error(tmp_path, content):
    path = tmp_path / "t.npz"
    if content is None:
        _, tr = _valid(tmp_path)
        save_trace(tr, path)
        content = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(content)
    with pytest.raises(TraceError, match=str(path)):
        load_trace(path)


def test_missing_file_and_pickled_member_raise_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.npz")
    arrays, _ = _valid(tmp_path)
    arrays["topk"] = np.array([{"a": 1}], dtype=object)  # needs pickle to load: refused
    with pytest.raises(TraceError):
        load_trace(_write(tmp_path, arrays))


def test_validation_error_names_the_request(tmp_path):
    arrays, tr = _valid(tmp_path)
    last = int(arrays["offsets"][-2])  # first token of the last request
    _set(arrays, "topk", (last, 0, 0), 50)
    with pytest.raises(TraceError, match=r"request 2: token 0: layer 0: expert id 50 outside \[0, 6\)"):
        load_trace(_write(tmp_path, arrays))


def test_save_refuses_invalid_traces(tmp_path):
    tr = random_trace(np.random.default_rng(2), 2, 4, 2, 2)
    tr.requests[0].prefill = tr.requests[0].tokens + 1
    with pytest.raises(TraceError, match="request 0"):
        save_trace(tr, tmp_path / "t.npz")
    assert not (tmp_path / "t.npz").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left behind


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_bytes_raise_only_trace_error(tmp_path, data):
    path = tmp_path / "t.npz"
    if not path.exists():
        save_trace(random_trace(np.random.default_rng(3), 3, 5, 2, 3), path)
    raw = bytearray(path.read_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    load_with_flips(raw, data, tmp_path, flips=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_members_raise_only_trace_error(tmp_path, data):
    """Byte flips inside the uncompressed members reach the validator, not only the zip layer."""
    tr = random_trace(np.random.default_rng(4), 3, 5, 2, 3)
    buf = io.BytesIO()
    np.savez(buf, **trace_arrays(tr))
    load_with_flips(bytearray(buf.getvalue()), data, tmp_path, flips=6)


def load_with_flips(raw: bytearray, data, tmp_path, flips: int) -> None:
    """Overwrite up to `flips` random bytes, then load: a TraceError is fine, anything else fails."""
    for _ in range(data.draw(st.integers(1 if raw else 0, flips if raw else 0))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(raw))
    try:
        load_trace(bad)
    except TraceError:
        pass


# ---- atomic write -----------------------------------------------------------------------------


def test_interrupted_write_leaves_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    old = random_trace(np.random.default_rng(5), 2, 4, 2, 2)
    save_trace(old, path)
    before = path.read_bytes()

    def explode(fh, **arrays):
        fh.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # e.g. Ctrl-C mid-write

    monkeypatch.setattr(np, "savez_compressed", explode)
    with pytest.raises(KeyboardInterrupt):
        save_trace(random_trace(np.random.default_rng(6), 3, 5, 2, 3), path)
    assert path.read_bytes() == before
    assert_same(load_trace(path), old)
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]


# ---- gaps and steps ---------------------------------------------------------------------------


def test_gap_rows_are_skipped_by_steps():
    g = Geometry(layers=2, experts=4, top_k=2)
    topk = np.array([[[0, 1], [-1, -1]], [[2, 3], [1, 0]], [[1, 2], [-1, -1]]], dtype=np.int16)
    weights = np.where(topk >= 0, 0.5, 0.0).astype(np.float32)
    req = Request(topk=topk, weights=weights, prefill=1)
    tr = Trace(g, [req])
    validate_trace(tr)
    steps = req.steps(g)
    assert steps[0].prefill and steps[0].experts[1] == []  # prefill gap: layer 1 not computed
    assert steps[1].experts == [[2, 3], [5, 4]]
    assert steps[2].experts == [[1, 2], []]  # decode gap: empty list, not an invented expert
    assert req.computed.tolist() == [[True, False], [True, True], [True, False]]
    pop = tr.popularity()
    assert pop.tolist() == [[1, 2, 2, 1], [1, 1, 0, 0]]
    s = tr.summary(top=2)
    assert (s["tokens"], s["prefill_tokens"], s["decode_tokens"], s["not_computed"]) == (3, 1, 2, 2)
    assert [row["routed"] for row in s["layers"]] == [6, 2]
    assert s["layers"][1]["distinct"] == 2 and s["layers"][1]["top_share"] == 1.0
    assert s["layers"][0]["hottest"][0][1] == pytest.approx(2 / 6)


def test_empty_trace_round_trips(tmp_path):
    tr = Trace(Geometry(layers=2, experts=4, top_k=2), [])
    save_trace(tr, tmp_path / "e.npz")
    assert load_trace(tmp_path / "e.npz").requests == []


def test_arrival_is_for_every_request_or_none():
    tr = random_trace(np.random.default_rng(4), 2, 4, 2, 3)
    tr.requests[1].arrival = None
    with pytest.raises(TraceError, match="request 1: arrival"):
        validate_trace(tr)
    tr.requests[1].arrival = float("inf")
    with pytest.raises(TraceError, match="request 1: arrival inf"):
        validate_trace(tr)
    for r in tr.requests:
        r.arrival = None
    validate_trace(tr)
    assert "arrival" not in trace_arrays(tr) and "arrival" not in tr.summary()["optional"]


@given(st.lists(st.sampled_from(["train", "heldout"]), min_size=1, max_size=12), st.data())
def test_subset_keeps_split_labels_with_their_requests(labels: list[str], data) -> None:
    rng = np.random.default_rng(len(labels))
    g = Geometry(layers=2, experts=4, top_k=1)
    reqs = [Request(rng.integers(0, 4, (3, 2, 1)).astype(np.int16), np.ones((3, 2, 1), np.float32), 1, task=str(i))
            for i in range(len(labels))]
    tr = Trace(g, reqs, {"splits": labels})
    idx = data.draw(st.lists(st.integers(0, len(labels) - 1), max_size=len(labels), unique=True))
    sub = tr.subset(iter(idx))  # any iterable of indices
    assert [r.task for r in sub.requests] == [str(i) for i in idx]
    assert sub.meta["splits"] == [labels[i] for i in idx]
    assert tr.meta["splits"] == labels  # the original is untouched


# ---- construction checks ----------------------------------------------------------------------


def _parts(T: int = 3, L: int = 2, k: int = 2) -> dict:
    topk = np.tile(np.arange(k, dtype=np.int16), (T, L, 1))
    return {"topk": topk, "weights": np.full((T, L, k), 0.5, np.float32), "prefill": 1}


BAD_REQUESTS = {
    "topk not 3-D": (dict(topk=np.zeros((3, 2), np.int16)), "topk must be an integer array"),
    "float topk": (dict(topk=np.zeros((3, 2, 2))), "topk must be an integer array"),
    "weights shape": (dict(weights=np.ones((3, 2, 1), np.float32)), "weights must be a float array"),
    "integer weights": (dict(weights=np.ones((3, 2, 2), np.int64)), "weights must be a float array"),
    "prefill past the tokens": (dict(prefill=4), r"prefill 4 outside \[0, 3\]"),
    "id below the marker": (dict(topk=np.array([[[0, 1], [0, 1]]] * 2 + [[[0, -2], [0, 1]]], np.int16)),
                            r"token 2: layer 0: expert id -2 is neither"),
    "NaN weight": (dict(weights=np.array([[[0.5, 0.5]] * 2, [[0.5, np.nan], [0.5, 0.5]], [[0.5, 0.5]] * 2],
                                         np.float32)), "token 1: router weight is NaN"),
    "negative weight": (dict(weights=np.full((3, 2, 2), -0.1, np.float32)), "token 0: negative router weight"),
    "logits of another token count": (dict(logits=np.zeros((2, 2, 4), np.float32)), "logits must be a float array"),
    "infinite logit": (dict(logits=np.full((3, 2, 4), np.inf, np.float32)), "router logit is NaN or infinite"),
    "spec shape": (dict(spec=np.zeros((3, 1, 2), np.int16)), "spec must be an integer array"),
    "arrival NaN": (dict(arrival=float("nan")), "arrival nan is not a finite time"),
    "arrival negative": (dict(arrival=-1.0), "arrival -1.0 is not a finite time"),
    "negative output id": (dict(output_ids=np.array([3, -1])), "output_ids must be a 1-D array"),
}


@pytest.mark.parametrize("fault", list(BAD_REQUESTS))
def test_a_request_refuses_bad_fields_when_built(fault):
    change, message = BAD_REQUESTS[fault]
    with pytest.raises(TraceError, match=message) as err:
        Request(**{**_parts(), **change})
    assert "\n" not in str(err.value)


def test_a_trace_refuses_requests_that_do_not_fit_its_geometry():
    g = Geometry(layers=2, experts=4, top_k=2)
    Trace(g, [Request(**_parts())])  # fits
    with pytest.raises(TraceError, match=r"request 1: topk has shape \[3, 3, 2\], expected \[3, 2, 2\]"):
        Trace(g, [Request(**_parts()), Request(**_parts(L=3))])
    high = _parts()
    high["topk"][2, 1, 0] = 4
    with pytest.raises(TraceError, match=r"request 0: token 2: layer 1: expert id 4 outside \[0, 4\)"):
        Trace(g, [Request(**high)])
    with pytest.raises(TraceError, match=r"request 0: logits has shape \[3, 2, 5\]"):
        Trace(g, [Request(**_parts(), logits=np.zeros((3, 2, 5), np.float32))])
    spec = _parts()["topk"].copy()
    spec[0, 0, 1] = 9
    with pytest.raises(TraceError, match=r"token 0: layer 0: spec expert id 9 outside \[0, 4\)"):
        Trace(g, [Request(**_parts(), spec=spec)])
    with pytest.raises(TraceError, match=r"request 1: output_ids must be given for every request or for none"):
        Trace(g, [Request(**_parts(), output_ids=np.array([1])), Request(**_parts())])
    with pytest.raises(TraceError, match="splits"):
        Trace(g, [Request(**_parts())], {"splits": ["train", "heldout"]})


def test_gaps_and_empty_requests_are_accepted_when_built():
    parts = _parts()
    parts["topk"][1, 1] = NOT_COMPUTED
    parts["weights"][1, 1] = 0
    Trace(Geometry(layers=2, experts=4, top_k=2), [Request(**parts), Request(**{**_parts(T=0), "prefill": 0})])


def test_construction_checks_are_array_wide_not_per_token():
    """A million token-layers are checked by numpy reductions, no loop in Python: counted as the
    Python lines run (a per-token loop runs tens of thousands), not timed (seconds are the
    host's: its speed and its load)."""
    import sys

    g = Geometry(layers=32, experts=8, top_k=2)
    rng = np.random.default_rng(0)
    topk = np.argsort(rng.random((31_250, 32, 8)), axis=2)[:, :, :2].astype(np.int16)
    weights = rng.random(topk.shape).astype(np.float32)
    lines = 0

    def count(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return count

    sys.settrace(count)
    try:
        Trace(g, [Request(topk, weights, 100)])
    finally:
        sys.settrace(None)
    assert 0 < lines < 3_000, lines


def test_an_imported_trace_names_its_file_from_construction_on():
    from casmoe.trace_io import checked_trace

    g = Geometry(layers=2, experts=4, top_k=2)
    high = _parts()
    high["topk"][0, 0, 0] = 7
    with pytest.raises(TraceError, match=r"^dump\.json: request 0: token 0: layer 0: expert id 7 outside \[0, 4\)$"):
        checked_trace(g, [Request(**high)], {}, "dump.json")
    twice = _parts()
    twice["topk"][1, 1] = [2, 2]
    with pytest.raises(TraceError, match=r"^dump\.json: request 0: token 1: layer 1: routes to the same expert twice"):
        checked_trace(g, [Request(**twice)], {}, "dump.json")
    assert checked_trace(g, [Request(**_parts())], {"source": "x"}, "dump.json").meta == {"source": "x"}
