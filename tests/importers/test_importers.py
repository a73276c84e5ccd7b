"""Importers and the CSV exporter: the shipped real traces (traces/real), arrays, JSON, malformed input."""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.geometry import Geometry
from casmoe.importers import import_trace, read_json, read_lrc_arrays, read_route_csv, write_route_csv
from casmoe.synthetic import SynthConfig, generate
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError
from casmoe.trace_io import save_trace
from support.traces import assert_same, random_trace
from support.paths import REPO

REAL = REPO / "traces" / "real"

# name -> (layers, experts, k, prefill tokens with a skipped last layer)
HEADERS = {"qwen": (48, 128, 6, True), "gemma": (30, 128, 6, False), "gptoss": (36, 128, 2, True)}


def csv_sets(path: Path) -> dict[tuple[int, int], dict[int, set[int]]]:
    """Independent reading of the CSV: (turn, step) -> layer -> expert set."""
    out: dict[tuple[int, int], dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    with open(path) as fh:
        for row in csv.DictReader(line for line in fh if not line.startswith("#")):
            out[int(row["turn"]), int(row["step"])][int(row["layer"])].add(int(row["expert"]))
    return out


@pytest.mark.parametrize("name", list(HEADERS))
def test_real_csv_imports_with_header_geometry_and_exact_sets(name):
    path = REAL / f"{name}.route.csv"
    tr = read_route_csv(path)
    L, E, k, skips = HEADERS[name]
    g = tr.geometry
    assert (g.layers, g.experts, g.top_k) == (L, E, k)
    assert len(g.layer_expert_bytes) == L and all(b > 0 for b in g.layer_expert_bytes)
    [req] = tr.requests
    computed = req.computed
    # every computed token-layer has exactly k distinct experts; gaps are whole NOT_COMPUTED rows
    for t, layer in zip(*np.nonzero(computed)):
        assert len(set(req.topk[t, layer].tolist())) == k
    assert (req.topk[~computed] == NOT_COMPUTED).all() and (req.weights[~computed] == 0).all()
    # the CSV's per-step sets, read independently, equal the trace's
    sets = csv_sets(path)
    first = min(step for _, step in sets)
    assert req.tokens == max(step for _, step in sets) - first + 1
    for t in range(req.tokens):
        want = sets.get((0, first + t), {})
        for layer in range(L):
            got = set(req.topk[t, layer].tolist()) if computed[t, layer] else set()
            assert got == want.get(layer, set()), (t, layer)
    # the engine skipped the last layer for every prompt token but the last
    gaps = np.argwhere(~computed)
    if skips:
        assert gaps.tolist() == [[t, L - 1] for t in range(req.prefill - 1)]
    else:
        assert len(gaps) == 0
    assert 0 < req.prefill < req.tokens
    steps = req.steps(g)
    assert len(steps) == 1 + req.decode_tokens
    if skips:
        assert steps[0].experts[L - 1] != []  # the last prompt token computed it


def test_real_csv_prefill_and_weights_match_rows():
    tr = read_route_csv(REAL / "gptoss.route.csv")
    [req] = tr.requests
    rows = [r for r in csv.DictReader(l for l in open(REAL / "gptoss.route.csv") if not l.startswith("#"))]
    assert req.prefill == len({r["step"] for r in rows if r["phase"] == "0"})
    r0 = rows[0]
    assert req.topk[0, 0, int(r0["slot"])] == int(r0["expert"])
    assert req.weights[0, 0, int(r0["slot"])] == np.float32(float(r0["weight"]))


def test_moe_lrc_case_json_imports_all_or_one_key():
    path = REAL / "moe_lrc_case_traces.json"
    doc = json.loads(path.read_text())
    tr = read_json(path)
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (1, 16, 2)
    assert len(tr.requests) == len([k for k in doc if not k.startswith("_")]) == 2
    grin = read_json(path, key="grin")
    [req] = grin.requests
    assert req.topk[:, 0].tolist() == doc["grin"]["experts_per_token"]
    assert "GRIN" in grin.meta["source_model"]
    with pytest.raises(TraceError, match="no entry 'nope'"):
        read_json(path, key="nope")


def test_export_import_round_trip(tmp_path):
    g = Geometry(layers=4, experts=8, top_k=2, hidden=16, intermediate=32)
    tr = generate(g, SynthConfig(requests=5, prefill=(0, 5), decode=(1, 6), seed=3))
    tr.requests[0].topk[0, 3] = NOT_COMPUTED  # a gap survives the trip as a gap
    tr.requests[0].weights[0, 3] = 0
    tr.requests[1].topk[:] = NOT_COMPUTED  # even a request with no computed token-layer
    tr.requests[1].weights[:] = 0
    path = tmp_path / "t.csv"
    write_route_csv(tr, path)
    back = read_route_csv(path)
    assert back.geometry == g
    assert back.meta["synth"] == tr.meta["synth"] and back.meta["source_model"] == tr.meta["source_model"]
    for a, b in zip(tr.requests, back.requests, strict=True):
        np.testing.assert_array_equal(a.topk, b.topk)
        np.testing.assert_array_equal(a.weights, b.weights)
        assert (a.prefill, a.prompt, a.task) == (b.prefill, b.prompt, b.task)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    L=st.integers(1, 4), E=st.integers(1, 10), k=st.integers(1, 3), n=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
    optional=st.booleans(),
)
def test_csv_round_trip_random_geometries(tmp_path, L, E, k, n, seed, optional):
    """Export then import gives the trace back: arrival times, output ids and text included;
    only the router logits and spec are lost (the CSV has no column for them)."""
    tr = random_trace(np.random.default_rng(seed), L, E, min(k, E), n, optional=optional)
    for r in tr.requests:
        r.logits = r.spec = None
    write_route_csv(tr, tmp_path / "t.csv")
    back = read_route_csv(tmp_path / "t.csv")
    assert_same(tr, back)
    assert back.meta["nested"] == tr.meta["nested"]


def test_real_csv_survives_export_and_import(tmp_path):
    tr = read_route_csv(REAL / "qwen.route.csv")
    write_route_csv(tr, tmp_path / "q.csv")
    back = read_route_csv(tmp_path / "q.csv")
    assert back.geometry == tr.geometry
    np.testing.assert_array_equal(back.requests[0].topk, tr.requests[0].topk)
    assert back.requests[0].prefill == tr.requests[0].prefill


# ---- malformed CSV and JSON ---------------------------------------------------------------------

HEAD = "# route_trace v1\n# model=m n_layer=2 n_expert=4 n_expert_used=2\nturn,phase,step,layer,slot,expert,weight\n"
GOOD_ROWS = "0,0,0,0,0,1,0.6\n0,0,0,0,1,2,0.4\n0,1,1,0,0,3,0.5\n0,1,1,0,1,0,0.5\n0,1,1,1,0,0,0.5\n0,1,1,1,1,1,0.5\n"


def test_small_csv_with_gap(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text(HEAD + GOOD_ROWS)
    [req] = read_route_csv(p).requests
    assert req.prefill == 1 and req.tokens == 2
    assert req.topk[0, 1].tolist() == [NOT_COMPUTED, NOT_COMPUTED]
    assert req.steps(Geometry(2, 4, 2))[0].experts == [[1, 2], []]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# nothing\n",
        "# route_trace v1\nturn,phase,step,layer,slot,expert,weight\n0,0,0,0,0,1,0.5\n",  # no geometry
        HEAD.replace("n_expert_used=2", "n_expert_used=9"),  # k > E
        HEAD.replace("turn,", "tour,") + GOOD_ROWS,  # missing column
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,1,0.4"),  # duplicate expert
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,7,0.4"),  # expert >= E
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,-2,0.4"),  # negative expert
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,2,nan"),  # NaN weight
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,2,-0.4"),  # negative weight
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,2,inf"),  # infinite weight
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,1,2,heavy"),  # non-numeric
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4\n", ""),  # fewer than k experts
        HEAD + GOOD_ROWS.replace("0,0,0,0,1,2,0.4", "0,0,0,0,0,2,0.4"),  # slot twice
        HEAD + GOOD_ROWS.replace("0,1,1,1,1,1,0.5", "0,1,1,5,1,1,0.5"),  # layer out of range
        HEAD + GOOD_ROWS.replace("0,0,0,0,0,1,0.6\n0,0,0,0,1,2,0.4", "0,1,0,0,0,1,0.6\n0,1,0,0,1,2,0.4").replace(
            "0,1,1,", "0,0,1,"
        ),  # decode before prefill
        HEAD + GOOD_ROWS + "# casmoe request={not json\n",
        HEAD + '# casmoe request={"turn": 0, "tokens": "x"}\n' + GOOD_ROWS,
        HEAD + '# casmoe request={"turn": 0, "prompt": 5}\n' + GOOD_ROWS,
        HEAD + '# casmoe meta=[1]\n' + GOOD_ROWS,
        HEAD + '# casmoe geometry={"layers": 2}\n' + GOOD_ROWS,
        HEAD + GOOD_ROWS.replace("0,1,1,1,1,1,0.5", "0,1,1000000000,1,1,1,0.5"),  # damaged step column
        HEAD + GOOD_ROWS.replace("0,1,1,1,1,1,0.5", "0,1,,1,1,1,0.5"),  # empty step
        HEAD + GOOD_ROWS.replace("0,1,1,1,1,1,0.5", "0,1,1.5,1,1,1,0.5"),  # fractional step
        HEAD + "0,0,0,0,0,1\n",  # short row
    ],
)
def test_malformed_csv_raises_trace_error(tmp_path, text):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceError):
        read_route_csv(p)


def test_binary_garbage_csv_raises_trace_error(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TraceError):
        read_route_csv(p)


def test_plain_json_requests(tmp_path):
    doc = {
        "num_experts": 4,
        "top_k": 2,
        "requests": [
            {"layers": [[[0, 1], [2, 3]], [[1, 2], None]], "prompt": "hi", "task": "code", "prefill": 1},
            {"layers": [[[3, 0]], [[0, 1]]], "weights": [[[0.7, 0.3]], [[0.5, 0.5]]]},
        ],
    }
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    tr = read_json(p)
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (2, 4, 2)
    a, b = tr.requests
    assert a.topk.tolist() == [[[0, 1], [1, 2]], [[2, 3], [-1, -1]]]
    assert (a.prefill, a.prompt, a.task) == (1, "hi", "code")
    assert b.weights[0].tolist() == [[pytest.approx(0.7), pytest.approx(0.3)], [0.5, 0.5]]
    # a list of requests, each with its own num_experts / top_k, imports too
    p.write_text(json.dumps([{**r, "num_experts": 4, "top_k": 2} for r in doc["requests"]]))
    assert len(read_json(p).requests) == 2


@pytest.mark.parametrize(
    "doc",
    [
        "not json {",
        [1, 2],
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 0]]]}]},  # duplicate expert
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 9]]]}]},  # id >= E
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1, 2]]]}]},  # wrong k
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]], []]}]},  # layers disagree on T
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]]}, {"layers": [[[0, 1]], [[0, 1]]]}]},
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]], "prefill": 5}]},
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]], "weights": [[[0.5, float("nan")]]]}]},
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]], "weights": [[[0.5, -1]]]}]},
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]], "weights": [[0.5]]}]},
        {"num_experts": 4, "top_k": 5, "requests": [{"layers": [[[0, 1, 2, 3, 3]]]}]},  # k > E
        {"num_experts": "four", "top_k": 2, "requests": [{"layers": [[[0, 1]]]}]},
        {"requests": [{"layers": [[[0, 1]]]}]},  # no num_experts
        {"a": {"num_experts": 4, "top_k": 2, "experts_per_token": [[0, 1]]},
         "b": {"num_experts": 8, "top_k": 2, "experts_per_token": [[0, 1]]}},  # shapes disagree
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, "x"]]]}]},
        {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]], "prompt": 3}]},
        {"num_experts": 4, "top_k": 2, "requests": "all of them"},
        {"_provenance": "only a note"},
    ],
)
def test_malformed_json_raises_trace_error(tmp_path, doc):
    p = tmp_path / "bad.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(TraceError):
        read_json(p)


# ---- moe-lrc arrays -------------------------------------------------------------------------------


def test_arrays_from_ids_logits_and_ranks(tmp_path):
    rng = np.random.default_rng(0)
    S, T, L, E, k = 3, 5, 4, 8, 2
    logits = rng.standard_normal((L, S, T, E)).astype(np.float32)
    ids = np.argsort(-logits, axis=-1)[..., :k]
    ranks = logits.argsort(-1).argsort(-1).astype(np.int8)  # what moe-lrc's 12_rank.py stores
    for kind, arrays in (("ids", ids.astype(np.int8)), ("logits", logits), ("rank", ranks)):
        d = tmp_path / kind
        d.mkdir()
        for layer in range(L):  # names sort by their layer number, not as text
            suffix = ".npz" if layer % 2 else ".npy"
            path = d / f"model_{layer}{suffix}"
            if suffix == ".npy":
                np.save(path, arrays[layer])
            else:
                np.savez(path, data=arrays[layer])
        if kind == "ids":
            tr = import_trace([d], num_experts=E, kind="topk")
        else:
            tr = import_trace([d], top_k=k)  # auto: floats are logits, int rows of E ranks
        assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (L, E, k)
        assert len(tr.requests) == S
        for s, req in enumerate(tr.requests):
            np.testing.assert_array_equal(req.topk, ids[:, s].transpose(1, 0, 2))
    tr = read_lrc_arrays([tmp_path / "logits"], top_k=k, keep_logits=True, prefill=2)
    assert tr.requests[0].logits.shape == (T, L, E) and tr.requests[0].prefill == 2
    w = tr.requests[0].weights
    assert (w > 0).all() and (w.sum(axis=2) <= 1 + 1e-6).all()


def test_arrays_from_safetensors(tmp_path):
    from safetensors.numpy import save_file

    logits = np.random.default_rng(1).standard_normal((2, 2, 6, 8)).astype(np.float32)
    for layer in range(2):
        save_file({"wiki": logits[layer, :1], "code": logits[layer, 1:]}, str(tmp_path / f"m_{layer:02d}.safetensors"))
    tr = import_trace([tmp_path], top_k=2)
    assert (tr.geometry.layers, tr.geometry.experts, len(tr.requests), tr.requests[0].tokens) == (2, 8, 2, 6)


@pytest.mark.parametrize(
    "fault",
    ["ids without E", "id out of range", "layers disagree", "nan logits", "float ids", "bad file", "k > E", "1d"],
)
def test_malformed_arrays_raise_trace_error(tmp_path, fault):
    ids = np.zeros((2, 3, 2), dtype=np.int8)
    ids[..., 1] = 1
    a, b, opts = ids, ids, {"num_experts": 4, "kind": "topk"}
    if fault == "ids without E":
        opts = {"kind": "topk"}
    elif fault == "id out of range":
        b = ids + 5
    elif fault == "layers disagree":
        b = ids[:, :2]
    elif fault == "nan logits":
        a = b = np.full((2, 3, 4), np.nan, dtype=np.float32)
        opts = {"top_k": 2}
    elif fault == "float ids":
        a = b = ids.astype(np.float32)
    elif fault == "k > E":
        opts = {"num_experts": 1, "kind": "topk"}
    elif fault == "1d":
        a = b = np.zeros(3, dtype=np.int8)
    np.save(tmp_path / "l_0.npy", a)
    np.save(tmp_path / "l_1.npy", b)
    if fault == "bad file":
        (tmp_path / "l_1.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(TraceError):
        read_lrc_arrays([tmp_path], **opts)


def test_import_npz_and_auto_dispatch(tmp_path):
    tr = Trace(Geometry(1, 4, 2), [Request(np.array([[[0, 1]]], np.int16), np.ones((1, 1, 2), np.float32), 0)])
    save_trace(tr, tmp_path / "t.npz")
    assert import_trace([tmp_path / "t.npz"]).geometry == tr.geometry
    with pytest.raises(TraceError):
        import_trace([])
    with pytest.raises(TraceError, match="no such file"):
        import_trace([tmp_path / "absent.csv"])


@pytest.mark.slow  # loads and runs tiny-mixtral; the docs' command test imports the folder in the default suite
def test_the_shipped_moe_lrc_folder_imports_the_models_own_routing():
    """examples/moe-lrc holds moe-lrc's rank files of tiny-mixtral; importing them gives back the
    experts the model's routers chose for those tokens."""
    import torch

    from casmoe.backends.corpus import load_corpus
    from casmoe.backends.models import load_model
    from casmoe.backends.record import RoutingRecorder
    from casmoe.importers import import_trace

    folder = REPO / "examples" / "moe-lrc"
    sys.path.insert(0, str(folder))
    try:
        import make_example
    finally:
        sys.path.remove(str(folder))
    tr = import_trace([folder], top_k=2)
    model, tokenizer = load_model("tiny-mixtral", dtype="float32")
    rows = load_corpus(split="heldout")
    chosen = []
    with RoutingRecorder(model) as recorder, torch.no_grad():
        for task in sorted(make_example.TASKS):  # the importer reads datasets in name order
            texts = [r.document for r in rows if r.task == task]
            ids = [t for t in (tokenizer(x)["input_ids"] for x in texts) if len(t) >= make_example.TOKENS]
            batch = [t[: make_example.TOKENS] for t in ids[: make_example.PER_TASK]]
            model(input_ids=torch.tensor(batch), use_cache=False)
            chosen += list(recorder.take(batch=len(batch))["topk"])  # [T, L, k] each
    assert len(tr.requests) == len(chosen) == 4
    for req, want in zip(tr.requests, chosen):
        np.testing.assert_array_equal(np.sort(req.topk, axis=-1), np.sort(want, axis=-1))


# ---- what a user's file or flags declare: refused when ambiguous or contradicted ----------------

MINIMAL = "# n_layer=2 n_expert=4 n_expert_used=2\nturn,step,layer,expert\n0,0,0,3\n0,0,0,1\n0,0,1,0\n0,0,1,2\n0,1,0,2\n0,1,0,3\n"


def test_the_minimal_csv_form_imports_with_its_defaults(tmp_path):
    p = tmp_path / "mine.csv"
    p.write_text(MINIMAL)
    tr = import_trace([p])
    [req] = tr.requests
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (2, 4, 2)
    assert req.prefill == 0 and req.tokens == 2  # no phase column: every token a decode step
    assert req.topk[0].tolist() == [[3, 1], [0, 2]]  # slots in the rows' order
    assert req.topk[1, 1].tolist() == [NOT_COMPUTED, NOT_COMPUTED]  # a token-layer without rows
    assert (req.weights[req.computed] == 0.5).all()


@pytest.mark.parametrize(
    "text, match",
    [
        (MINIMAL.replace("n_expert_used=2", "n_expert_used=2 n_expert=8"), "twice"),
        ("# n_expert=8\n" + MINIMAL, "twice"),
        (MINIMAL.replace("\nturn", "\n# layer=0 expert_bytes=5\n# layer=0 expert_bytes=6\nturn"), "twice"),
        (MINIMAL + '# casmoe request={"turn": 0}\n# casmoe request={"turn": 0}\n', "twice"),
        (MINIMAL + '# casmoe request={"turn": 0, "turn": 1}\n', "twice"),
        (MINIMAL + '# casmoe geometry={"layers": 2, "experts": 8, "top_k": 2}\n', "disagrees"),
        (MINIMAL.replace("turn,step,layer,expert", "turn,step,layer,expert,expert"), "twice"),
        ("# n_layer=2 n_expert=4 n_expert_used=2\nturn,step,layer,expert\n", "no rows"),
        ("# n_layer=2 n_expert=4 n_expert_used=2\n", "no column line"),
        (MINIMAL.replace("n_layer=2 ", ""), "n_layer"),
    ],
)
def test_ambiguous_or_empty_csv_is_refused(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceError, match=match):
        import_trace([p])


def test_a_byte_order_mark_is_skipped(tmp_path):
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert import_trace([tmp_path / "bom.csv"]).geometry.layers == 2
    doc = {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1]]]}]}
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    assert len(import_trace([tmp_path / "bom.json"]).requests) == 1
    (tmp_path / "dup.json").write_text('{"num_experts": 4, "num_experts": 8, "top_k": 2, "requests": []}')
    with pytest.raises(TraceError, match="twice"):
        import_trace([tmp_path / "dup.json"])


@pytest.mark.parametrize(
    "source, options",
    [
        ("csv", {"num_experts": 8}),
        ("csv", {"top_k": 3}),
        ("logits", {"num_experts": 16, "top_k": 2}),
        ("ids", {"num_experts": 4, "top_k": 3}),
        ("csv", {"top_k": 0}),
        ("csv", {"num_experts": -1}),
        ("ids", {"num_experts": 0}),
    ],
)
def test_flags_that_contradict_the_data_are_refused(tmp_path, source, options):
    if source == "csv":
        (tmp_path / "t.csv").write_text(MINIMAL)
        path = tmp_path / "t.csv"
    else:
        path = tmp_path / "layers"
        path.mkdir()
        for layer in range(2):
            data = np.random.default_rng(layer).standard_normal((2, 3, 4)).astype(np.float32)
            np.save(path / f"l_{layer}.npy", data if source == "logits" else np.argsort(data, axis=-1)[..., :2])
    with pytest.raises(TraceError) as err:
        import_trace([path], **options)
    assert "\n" not in str(err.value)


def test_traces_without_requests_are_refused(tmp_path):
    empty = Trace(Geometry(1, 4, 2), [])
    with pytest.raises(TraceError, match="no requests"):
        write_route_csv(empty, tmp_path / "e.csv")
    save_trace(empty, tmp_path / "e.npz")
    with pytest.raises(TraceError, match="no requests"):
        import_trace([tmp_path / "e.npz"])
    np.save(tmp_path / "l_0.npy", np.zeros((0, 3, 2), dtype=np.int8))
    with pytest.raises(TraceError, match="no sequences"):
        import_trace([tmp_path / "l_0.npy"], num_experts=4)


@pytest.mark.parametrize("argv", [["trace", "export", "t.npz", "t.npz"], ["trace", "import", "t.csv", "-o", "t.csv"],
                                  ["trace", "import", "t.csv", "-o", "x.npz", "--top-k", "0"],
                                  ["trace", "import", "t.csv", "-o", "x.npz", "--num-experts", "8"],
                                  ["trace", "import", ".", "-o", "t.npz"], ["trace", "synth", "t.npz", "--like", "t.npz"]])
def test_commands_refuse_to_overwrite_their_input_or_contradict_it(tmp_path, monkeypatch, capsys, argv):
    from support.cli import assert_one_line, cli

    (tmp_path / "t.csv").write_text(MINIMAL)
    save_trace(read_route_csv(tmp_path / "t.csv"), tmp_path / "t.npz")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
