"""Hostile inputs: every one is a one-line error (exit 2, no traceback) or a correct result,
never a crash, a silent coercion or a partial file.

Library-level properties run hypothesis over many inputs cheaply (a `CasmoeError` is what the
CLI prints as one line); CLI-level cases drive the console entry point in-process and check
the exit status, the single `casmoe: error:` line and the output folder.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from casmoe.cache import PolicyError
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.importers import read_json, read_route_csv, write_route_csv
from casmoe.resources import ResourceError
from casmoe.policies import PolicySpec
from casmoe.policies.lru import LRU
from casmoe.replay import replay
from casmoe.sim.box.hardware import PROFILES_DIR, HardwareProfile
from casmoe.synthetic import SynthConfig, generate
from casmoe.trace import Trace, TraceError
from casmoe.trace_io import load_trace, save_trace, validate_trace
from support.cli import assert_one_line, cli, leftovers
from support.fuzzing import FUZZ, G, small_trace
from support.paths import REPO











# ---- traces: arrays of the wrong dtype, rank or size ------------------------------------------


def _arrays(trace: Trace, path: Path) -> dict[str, np.ndarray]:
    save_trace(trace, path)
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


MUTATIONS = st.sampled_from(["0-d", "1-d", "float", "uint64", "huge", "negative", "reverse", "bool", "empty"])


@FUZZ
@given(name=st.sampled_from(["topk", "weights", "offsets", "prefill", "spec"]), how=MUTATIONS)
def test_mutated_trace_arrays_raise_only_trace_error(tmp_path, name, how):
    arrays = _arrays(small_trace(), tmp_path / "t.npz")
    a = arrays[name]
    arrays[name] = {
        "0-d": lambda: np.asarray(a.ravel()[0] if a.size else 0),
        "1-d": lambda: a.ravel(),
        "float": lambda: a.astype(np.float64) + 0.5,
        "uint64": lambda: np.abs(a).astype(np.uint64)[::-1].copy(),  # non-monotone: a signed diff is < 0
        "huge": lambda: np.full_like(a, np.iinfo(a.dtype).max if a.dtype.kind in "iu" else np.inf),
        "negative": lambda: -np.abs(a) - 1,
        "reverse": lambda: a[::-1].copy(),
        "bool": lambda: a.astype(bool),
        "empty": lambda: a[:0],
    }[how]()
    np.savez(tmp_path / "bad.npz", **arrays)
    try:
        tr = load_trace(tmp_path / "bad.npz")
    except TraceError:
        return
    # accepted: then it must be a consistent trace whose tokens are exactly the file's
    assert sum(r.tokens for r in tr.requests) == len(arrays["topk"])
    validate_trace(tr)


def test_uint64_offsets_that_go_back_are_refused(tmp_path):
    arrays = _arrays(small_trace(2), tmp_path / "t.npz")
    n = len(arrays["topk"])
    arrays["offsets"] = np.array([0, n + 5, n], dtype=np.uint64)  # unsigned: n - (n + 5) wraps to 2**64 - 5
    arrays["prefill"] = np.array([1, 0])
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(TraceError, match="partition"):
        load_trace(tmp_path / "bad.npz")


# ---- route CSV and JSON -------------------------------------------------------------------------

HEADER_VALUE = st.one_of(
    st.integers(-3, 10**12).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "2.5", "1e3", "0x10", "true", " 4", "٣"]),
)


@FUZZ
@given(n_layer=HEADER_VALUE, n_expert=HEADER_VALUE, k=HEADER_VALUE, cut=st.integers(0, 400), newline=st.booleans())
def test_route_csv_headers_and_cuts(tmp_path, n_layer, n_expert, k, cut, newline):
    rows = "".join(f"0,{int(t > 1)},{t},{layer},{s},{(t + layer + s) % 4},0.5\n"
                   for t in range(4) for layer in range(2) for s in range(2))
    text = (f"# route_trace v1\n# model=x n_layer={n_layer} n_expert={n_expert} n_expert_used={k}\n"
            "turn,phase,step,layer,slot,expert,weight\n" + rows)
    text = text[: len(text) - cut] + ("\n" if newline and cut else "")
    path = tmp_path / "x.csv"
    path.write_text(text)
    try:
        tr = read_route_csv(path)
    except (TraceError, ResourceError):  # a refused header, or a geometry this box cannot hold now
        return
    g = tr.geometry  # accepted: the header's integers, exactly
    assert (str(g.layers), str(g.experts), str(g.top_k)) == (n_layer.strip(), n_expert.strip(), k.strip())


def test_csv_cut_mid_row_is_refused(tmp_path):
    write_route_csv(small_trace(), tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    (tmp_path / "cut.csv").write_text(text[: text.rindex(",") + 3])  # inside the last weight
    with pytest.raises(TraceError, match="cut mid-row"):
        read_route_csv(tmp_path / "cut.csv")
    lines = text.splitlines(keepends=True)  # a whole row missing: the declared row count disagrees
    (tmp_path / "short.csv").write_text("".join(lines[:-1]))
    with pytest.raises(TraceError, match="declares .* rows"):
        read_route_csv(tmp_path / "short.csv")


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 10**13), st.floats(), st.text(max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12,
)


@FUZZ
@given(num_experts=JSON_VALUE, top_k=JSON_VALUE, prefill=JSON_VALUE, layers=JSON_VALUE)
@example(num_experts=-2, top_k=-2, prefill=None, layers=None)  # once sized an array by k before checking it
@example(num_experts=-2, top_k=10**13, prefill=None, layers=None)
def test_json_fields_of_any_type(tmp_path, num_experts, top_k, prefill, layers):
    doc = {"num_experts": num_experts, "top_k": top_k,
           "requests": [{"layers": [[[0, 1], [2, 3]]], "prefill": prefill}, {"layers": layers}]}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc))
    try:
        tr = read_json(path)
    except TraceError:
        return
    # accepted only with exact integers, never a coerced float, string or boolean
    assert type(num_experts) is int and type(top_k) is int and type(prefill) is int
    assert (tr.geometry.experts, tr.geometry.top_k, tr.requests[0].prefill) == (num_experts, top_k, prefill)


@pytest.mark.parametrize("text", ['{"num_experts": Infinity, "top_k": 2, "requests": []}', "[" * 100_000 + "]" * 100_000,
                                  '{"num_experts": 1e12, "top_k": 2, "requests": [{"layers": [[[0, 1]]]}]}',
                                  '{"num_experts": 1000000000000, "top_k": 2, "requests": [{"layers": [[[0, 1]]]}]}'])
def test_json_extremes(tmp_path, text):
    (tmp_path / "x.json").write_text(text)
    with pytest.raises(TraceError):
        read_json(tmp_path / "x.json")


# ---- engine dumps (vLLM, SGLang) ----------------------------------------------------------------

ENGINE_EXAMPLES = REPO / "examples" / "engine-dumps"


@FUZZ
@given(prompt=JSON_VALUE, routed=JSON_VALUE, ids=JSON_VALUE, created=JSON_VALUE, text=JSON_VALUE)
def test_vllm_response_fields_of_any_type(tmp_path, prompt, routed, ids, created, text):
    doc = {"prompt_routed_experts": prompt, "prompt_token_ids": ids, "created": created,
           "usage": {"prompt_tokens": created, "completion_tokens": text},
           "choices": [{"routed_experts": routed, "token_ids": ids, "text": text}]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    from casmoe.importers.vllm import read_vllm

    try:
        tr = read_vllm([tmp_path / "r.json"])
    except TraceError:
        return
    validate_trace(tr)  # accepted: a consistent trace of integer ids
    assert all(r.topk.dtype.kind == "i" for r in tr.requests)


SGLANG_FIELDS = ["forward_pass_id", "input_ids", "positions", "extend_seq_lens", "forward_mode", "topk_ids_of_layer"]


@settings(FUZZ, max_examples=15)  # each example saves and loads a torch file
@given(field=st.sampled_from(SGLANG_FIELDS), value=JSON_VALUE, record=st.integers(0, 3))
def test_sglang_record_fields_of_any_type(tmp_path, field, value, record):
    torch = pytest.importorskip("torch")
    [dump] = (ENGINE_EXAMPLES / "sglang").glob("*.pt")
    doc = torch.load(dump, weights_only=True)
    doc["records"][record][field] = value
    torch.save(doc, tmp_path / "d.pt")
    from casmoe.importers.sglang import read_sglang

    try:
        tr = read_sglang([tmp_path / "d.pt"])
    except TraceError:
        return
    validate_trace(tr)


@settings(FUZZ, max_examples=20)
@given(name=st.sampled_from(["sglang", "vllm/request-1.npz", "sglang-stat.pt"]), cut=st.integers(1, 4000),
       flip=st.integers(0, 4000))
def test_damaged_engine_dumps_raise_one_error(tmp_path, name, cut, flip):
    pytest.importorskip("torch")
    from casmoe.errors import CasmoeError
    from casmoe.importers import import_profile, import_trace

    src = ENGINE_EXAMPLES / name
    src = next(src.glob("*.pt")) if src.is_dir() else src
    data = bytearray(src.read_bytes())
    data[flip % len(data)] ^= 0xFF
    bad = tmp_path / src.name
    bad.write_bytes(bytes(data[: max(1, len(data) - cut)]) if cut % 2 else bytes(data))
    try:
        if name == "sglang-stat.pt":
            import_profile([bad], "sglang-stat")
        else:
            validate_trace(import_trace([bad], "sglang" if bad.suffix == ".pt" else "vllm"))
    except CasmoeError as exc:
        assert "\n" not in str(exc)


# ---- hardware profiles --------------------------------------------------------------------------

PROFILE = (PROFILES_DIR / "rtx4090x4.toml").read_text()
NUMBERS = HardwareProfile.numeric_fields()


def _profile_with(field: str, value: str) -> str:
    out, in_sources = [], False
    for ln in PROFILE.splitlines():
        in_sources |= ln.strip() == "[sources]"
        out.append(f"{field} = {value}" if not in_sources and ln.split("=")[0].strip() == field else ln)
    return "\n".join(out)


@FUZZ
@given(field=st.sampled_from(NUMBERS), value=st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "true", '"fast"', "1e308", "[1]"]), st.floats().map(repr)))
def test_hardware_numbers(field, value):
    try:
        hw = HardwareProfile.from_toml(_profile_with(field, value))
    except CasmoeError:
        return
    assert all(math.isfinite(getattr(hw, n)) for n in NUMBERS)  # accepted: every number finite


def test_hardware_file_with_bytes_that_are_not_text(tmp_path):
    from casmoe.sim.box.hardware import HardwareError, load_profile

    (tmp_path / "hw.toml").write_bytes(b'name = "\xff\xfe"\n')
    with pytest.raises(HardwareError, match="UTF-8"):
        load_profile(tmp_path / "hw.toml")


# ---- policy specs and faulty user policies ------------------------------------------------------


@FUZZ
@given(text=st.one_of(
    st.text(max_size=20),
    st.builds(lambda n, k, v: f"{n}[{k}={v}]", st.sampled_from(["lru", "sch", "static", "casmoe", "semoe"]),
              st.sampled_from(["m", "noise", "foo", "profile", "predictor", "seed", "remainder"]),
              st.sampled_from(["0", "-1", "abc", "1.5", "true", "x.npz", "4", "noisy"]))))
def test_policy_specs(text):
    try:
        spec = PolicySpec.parse(text)
        cache = spec.create(G, 3, trace=small_trace())
    except CasmoeError:
        return
    assert cache.capacity.slots == 3


JUNK = st.one_of(
    st.none(), st.just(-1), st.integers(G.total_experts, 10**9), st.floats(), st.text(max_size=2),
    st.lists(st.one_of(st.floats(), st.booleans(), st.integers(-5, 40)), max_size=4),
    st.just(np.array([1, 2, 99])), st.just(np.array([0.5])),
)


@FUZZ
@given(junk=JUNK, hook=st.sampled_from(["prefetch_layer", "prefetch_request"]))
def test_policy_hook_answers_are_checked(junk, hook):
    class Faulty(LRU):
        pass

    setattr(Faulty, hook, lambda self, *args: junk)
    trace = small_trace(2)
    try:
        stats = replay(trace, Faulty(G, 3), compiled=False).stats
    except PolicyError as exc:
        assert hook in str(exc)
        return
    # accepted: the answer was a valid list of ids (possibly numpy integers), and counts add up
    ids = list(junk.tolist() if hasattr(junk, "tolist") else junk)
    assert all(type(e) is int and 0 <= e < G.total_experts for e in ids)
    assert stats.hits + stats.late_hits + stats.misses == stats.accesses


USER_POLICIES = {
    "raises on import": "raise RuntimeError('boom')\n",
    "syntax error": "def (:\n",
    "victim raises": "from casmoe.policies.lru import LRU\nclass P(LRU):\n    def victim(self, layer, c):\n        raise KeyError('no')\n",
    "negative prefetch": "from casmoe.policies.lru import LRU\nclass P(LRU):\n    def prefetch_layer(self, s, l):\n        return [-1]\n",
    "no class P": "x = 1\n",
}


@pytest.mark.parametrize("name", sorted(USER_POLICIES))
def test_faulty_user_policy_is_one_line(tmp_path, monkeypatch, capsys, name):
    module = f"userpol_{abs(hash(name)) % 10**6}"
    (tmp_path / f"{module}.py").write_text(USER_POLICIES[name])
    save_trace(small_trace(), tmp_path / "t.npz")
    code, _, err = cli(["replay", "--trace", "t.npz", "--capacity", "2", "--policy", f"{module}:P"],
                       tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    if name == "victim raises":
        assert "KeyError" in err and f"{module}.py" in err


# ---- CLI inputs of the wrong kind, and no partial outputs ---------------------------------------


@pytest.mark.parametrize("argv", [
    ["replay", "--trace", "t.npz", "--policy", "lru[foo=1]"],
    ["replay", "--trace", "t.npz", "--policy", "sch[m=0]"],
    ["replay", "--trace", "t.npz", "--policy", "casmoe", "--planner", "t.npz"],
    ["replay", "--trace", "t.npz", "--capacity", "6 parsecs"],
    ["replay", "--trace", "unsized.npz", "--capacity", "24GB"],
    ["trace", "synth", "adir", "--requests", "2"],
    ["trace", "export", "t.npz", "adir"],
    ["trace", "import", "t.npz", "-o", "nodir/x.npz"],
    ["simulate", "--trace", "t.npz", "--out", "afile"],
    ["lrc", "-t", "t.npz", "--out", "adir"],
])
def test_bad_paths_and_options_fail_before_work(tmp_path, monkeypatch, capsys, argv):
    save_trace(small_trace(), tmp_path / "t.npz")
    save_trace(generate(Geometry(3, 6, 2), SynthConfig(requests=1, seed=0)), tmp_path / "unsized.npz")  # no expert bytes
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("keep me")
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert (tmp_path / "afile").read_text() == "keep me" and not any((tmp_path / "adir").iterdir())
    assert not leftovers(tmp_path)


def test_huge_capacity_holds_every_expert_without_allocating_it(tmp_path, monkeypatch, capsys):
    save_trace(small_trace(), tmp_path / "t.npz")
    code, out, err = cli(["replay", "--trace", "t.npz", "--policy", "lru", "--capacity", "1000000000000", "--json"],
                         tmp_path, monkeypatch, capsys)
    assert code == 0, err
    (record,) = json.loads(out)
    assert record["capacity"] == f"{G.experts}/layer" and record["evictions"] == 0


@pytest.mark.parametrize("argv", [
    ["trace", "synth", "out/x.npz", "--requests", "5", "--layers", "2", "--experts", "4", "--top-k", "1"],
    ["trace", "export", "t.npz", "out/x.csv"],
    ["simulate", "--trace", "t.npz", "--model", "mixtral-8x7b", "--policy", "lru", "--capacity", "2", "--out", "out"],
])
def test_disk_full_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, argv):
    """ENOSPC when the data reaches the disk (fsync), as on a full file system."""
    tr = generate(Geometry(32, 8, 2), SynthConfig(requests=2, prefill=(2, 3), decode=(2, 3), seed=0))
    save_trace(tr, tmp_path / "t.npz")
    (tmp_path / "out").mkdir()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert "No space left on device: out/" in err and "free some space" in err
    assert not any(p.is_file() for p in (tmp_path / "out").rglob("*")), list((tmp_path / "out").rglob("*"))
    assert not leftovers(tmp_path)


def test_an_interrupted_write_keeps_the_old_file(tmp_path):
    from casmoe.output import atomic_open

    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(target) as fh:
            fh.write("new, half written")
            raise KeyboardInterrupt
    assert target.read_text() == "old" and not leftovers(tmp_path)


def test_temp_files_of_killed_writers_are_removed_by_the_next_write(tmp_path):
    from casmoe.output import write_text

    dead = tmp_path / ".f.txt.999999999.abcd.tmp"  # no such process
    live = tmp_path / f".f.txt.{os.getppid()}.abcd.tmp"  # a running process: maybe still writing
    dead.write_text("x")
    live.write_text("x")
    write_text(tmp_path / "f.txt", "new")
    assert not dead.exists() and live.exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker processes from /proc")
def test_a_killed_sweep_takes_its_workers_with_it(tmp_path):
    import signal
    import subprocess
    import time

    trace = REPO / "traces" / "tiny-mixtral.npz"
    proc = subprocess.Popen(
        [sys.executable, "-m", "casmoe", "sweep", "--trace", str(trace), "--requests", "30", "--policy", "belady",
         "--policy", "lfu", "--capacity", "2", "--capacity", "3", "--capacity", "4", "--jobs", "2", "--out", "sw"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def children() -> list[int]:
        pids = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(ln.split(":\t", 1) for ln in status.read_text().splitlines() if ":\t" in ln)
            except (OSError, ValueError):
                continue
            if fields.get("PPid", "").strip() == str(proc.pid) and not fields.get("State", "").startswith("Z"):
                pids.append(int(status.parent.name))
        return pids

    deadline = time.time() + 120
    while len(kids := children()) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(kids) >= 2, "the sweep started no workers"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    def running(pid: int) -> bool:
        try:
            return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False

    deadline = time.time() + 10
    while time.time() < deadline and (alive := [k for k in kids if running(k)]):
        time.sleep(0.2)
    for k in alive:
        os.kill(k, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived the sweep"


def test_sizes_beyond_memory_fail_before_allocating(tmp_path, monkeypatch, capsys):
    """A typo'd size is refused by arithmetic on the declared shape, not by a MemoryError. The
    machine's free memory is fixed at 16 GiB here: a host with a terabyte would hold the sizes."""
    import casmoe.resources

    monkeypatch.setattr(casmoe.resources, "available_memory", lambda: 16 * 2**30)
    with pytest.raises(ResourceError, match="GiB are available"):
        LRU(Geometry(100_000, 30_000, 2), 4)
    code, _, err = cli(["trace", "synth", "x.npz", "--layers", "4000", "--experts", "30000", "--requests", "100000"],
                       tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert not (tmp_path / "x.npz").exists()
