"""Importers that would count or place wrongly without a word (the user study's class 2): every
length a record states agrees with its rows, one request given twice counts once or is refused,
only the documented sentinel means "not computed", SGLang's finished requests stay finished,
counts are numbers, and an expert count read off the ids is a lower bound.

Each case is a one-line refusal naming the file and the numbers, or the right trace; the
properties run hypothesis over the lengths, ids and schedules that decide it.
"""

from __future__ import annotations

import json
import shutil
import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from support.engine_dumps import (  # noqa: F401  (fixtures and writers of the engines' formats)
    E, K, L_ALL, MOE, SgReq, routing, sglang_dump, vllm_rows)
from support.cli import assert_one_line, cli
from support.fuzzing import FUZZ

from casmoe.importers import import_profile, import_trace
from casmoe.profile import Profile, ProfileError, count_array
from casmoe.trace import NOT_COMPUTED, TraceError

torch = pytest.importorskip("torch")


def _import(path, **kw):
    return import_trace([path], "vllm", **kw)


# ---- vLLM: every length relation between prompt, output ids and routing rows ----------------------


@FUZZ
@given(P=st.integers(1, 6), G=st.integers(1, 6), delta=st.integers(-2, 2), ids=st.booleans())
@example(P=5, G=3, delta=1, ids=True)  # the user study: one row more gave prefill 0 everywhere
def test_vllm_whole_sequence_rows_must_add_up(tmp_path, P, G, delta, ids):
    """Older vLLM's one array holds P + G - 1 rows (the last generated token is never fed back):
    split at P when it does, else refused with the numbers, never read as all decode."""
    rows = P + G - 1 + delta
    if rows < 1:
        return
    whole, moe = vllm_rows(np.random.default_rng(P * 10 + G), rows)
    counts = ({"prompt_token_ids": list(range(P)), "outputs": [{"token_ids": list(range(G)), "routed_experts": whole.tolist()}]}
              if ids else {"usage": {"prompt_tokens": P, "completion_tokens": G}, "routed_experts": whole.tolist()})
    (tmp_path / "r.json").write_text(json.dumps(counts))
    if delta:
        with pytest.raises(TraceError) as err:
            _import(tmp_path / "r.json")
        msg = str(err.value)
        assert "r.json" in msg and str(rows) in msg and str(P + G - 1) in msg and "\n" not in msg
        return
    [req] = _import(tmp_path / "r.json").requests
    assert req.prefill == P and req.tokens == rows
    np.testing.assert_array_equal(req.topk, moe)


@FUZZ
@given(P=st.integers(1, 5), G=st.integers(1, 5), dp=st.integers(-1, 1), dd=st.integers(-1, 1))
def test_vllm_split_rows_must_match_the_token_counts(tmp_path, P, G, dp, dd):
    rng = np.random.default_rng(P + 7 * G)
    if P + dp < 1 or G - 1 + dd < 0:
        return
    prompt, _ = vllm_rows(rng, P + dp)
    gen, _ = vllm_rows(rng, G - 1 + dd)
    np.savez(tmp_path / "a.npz", prompt_routed_experts=prompt, routed_experts=gen,
             prompt_token_ids=np.arange(P), token_ids=np.arange(G))
    if dp or dd:
        with pytest.raises(TraceError, match=r"a\.npz.* rows"):
            _import(tmp_path / "a.npz")
        return
    [req] = _import(tmp_path / "a.npz").requests
    assert (req.prefill, req.decode_tokens) == (P, G - 1)


def test_vllm_ids_and_usage_that_disagree_are_refused(tmp_path):
    rows, _ = vllm_rows(np.random.default_rng(0), 6)
    doc = {"prompt_token_ids": [1, 2, 3, 4], "usage": {"prompt_tokens": 5, "completion_tokens": 3},
           "choices": [{"token_ids": [7, 8, 9], "routed_experts": rows.tolist()}]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"r\.json: prompt_token_ids holds 4 tokens but usage.prompt_tokens says 5"):
        _import(tmp_path / "r.json")


def test_vllm_decode_rows_without_the_prompts_are_refused(tmp_path):
    """The newer split form saved without prompt_routed_experts: the rows are the G - 1 generated
    tokens, and the prompt's routing is missing (it would import as prefill 0)."""
    gen, _ = vllm_rows(np.random.default_rng(1), 3)
    (tmp_path / "r.json").write_text(json.dumps({"prompt_token_ids": [1, 2, 3, 4, 5], "choices": [
        {"token_ids": [7, 8, 9, 10], "routed_experts": gen.tolist()}]}))
    with pytest.raises(TraceError, match="save prompt_routed_experts too"):
        _import(tmp_path / "r.json")


def test_choices_of_one_response_are_not_held_to_the_summed_usage(tmp_path):
    """usage.completion_tokens counts every choice's tokens together: n = 2 imports."""
    rng = np.random.default_rng(2)
    prompt, _ = vllm_rows(rng, 3)
    choices = [{"index": c, "token_ids": list(range(G)), "routed_experts": vllm_rows(rng, G - 1)[0].tolist()}
               for c, G in enumerate((3, 4))]
    (tmp_path / "r.json").write_text(json.dumps({"id": "cmpl-1", "prompt_token_ids": [1, 2, 3], "choices": choices,
                                                 "prompt_routed_experts": prompt.tolist(),
                                                 "usage": {"prompt_tokens": 3, "completion_tokens": 7}}))
    assert [r.decode_tokens for r in _import(tmp_path / "r.json").requests] == [2, 3]


# ---- one response or file given twice ------------------------------------------------------------


def _response(rid: str | None, seed: int = 3, created: int | None = 1700000000) -> dict:
    rng = np.random.default_rng(seed)
    prompt, _ = vllm_rows(rng, 3)
    gen, _ = vllm_rows(rng, 2)
    doc = {"prompt_token_ids": [1, 2, 3], "prompt_routed_experts": prompt.tolist(),
           "choices": [{"token_ids": [4, 5, 6], "routed_experts": gen.tolist()}]}
    if rid is not None:
        doc["id"] = rid
    if created is not None:
        doc["created"] = created
    return doc


@pytest.mark.parametrize("how", ["same path twice", "two spellings", "a copy", "same id in one file",
                                 "same id, two files", "same content and time"])
def test_a_response_or_file_given_twice_is_refused(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps(_response("cmpl-1")))
    sources = {"same path twice": ["a.json", "a.json"], "two spellings": ["a.json", "./sub/../a.json"],
               "a copy": ["a.json", "b.json"], "same id in one file": ["c.jsonl"],
               "same id, two files": ["a.json", "d.json"], "same content and time": ["e.jsonl"]}[how]
    (tmp_path / "sub").mkdir()
    shutil.copy(tmp_path / "a.json", tmp_path / "b.json")
    (tmp_path / "c.jsonl").write_text(json.dumps(_response("cmpl-1")) + "\n" + json.dumps(_response("cmpl-1", 4)) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(_response("cmpl-1", 5, 1700000009)))
    (tmp_path / "e.jsonl").write_text((json.dumps(_response(None)) + "\n") * 2)
    with pytest.raises(TraceError) as err:
        import_trace(sources, "vllm")
    msg = str(err.value)
    assert "twice" in msg and "\n" not in msg and any(s.rpartition("/")[2] in msg for s in sources)


def test_equal_requests_that_are_two_requests_import_as_two(tmp_path):
    """The same prompt sent twice at greedy decoding routes the same: without an id or a time
    nothing says they are one record, and with two ids or two times they are two."""
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(_response(None, created=None)) for _ in range(2)) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_response("x")) + "\n" + json.dumps(_response("y")) + "\n")
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(_response(None, created=t)) for t in (1, 2)) + "\n")
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        assert len(import_trace([tmp_path / name], "vllm").requests) == 2


def test_an_engine_dump_given_twice_is_refused(tmp_path):
    rng = np.random.default_rng(6)
    reqs = [SgReq(3, 2)]
    reqs[0].rows, reqs[0].ids = routing(rng, 5), rng.integers(0, 100, 5)
    sglang_dump([("extend", [(0, 0, 3)]), ("decode", [(0, 3, 1)]), ("decode", [(0, 4, 1)])], reqs, rng, tmp_path / "d.pt")
    shutil.copy(tmp_path / "d.pt", tmp_path / "copy.pt")
    for sources in ([tmp_path / "d.pt", tmp_path / "d.pt"], [tmp_path / "d.pt", tmp_path / "copy.pt"]):
        with pytest.raises(TraceError, match="twice"):
            import_trace(sources)
    torch.save(torch.ones(4, E), tmp_path / "f.pt")
    shutil.copy(tmp_path / "f.pt", tmp_path / "g.pt")
    with pytest.raises(ProfileError, match="twice"):
        import_profile([tmp_path / "f.pt", tmp_path / "g.pt"], "ktransformers")


def test_two_dumps_holding_the_same_passes_are_refused(tmp_path):
    """A second dump taken without resetting the recorder holds the first one's passes again."""
    rng = np.random.default_rng(13)
    reqs, passes = _one_after_another([(3, 2), (4, 2)], rng)
    sglang_dump(passes[:3], reqs, np.random.default_rng(1), tmp_path / "first_0.pt")
    sglang_dump(passes, reqs, np.random.default_rng(1), tmp_path / "second_0.pt")
    with pytest.raises(TraceError, match=r"second_0\.pt record 0: forward pass 0 of rank 0 again \(first in .*first_0"):
        import_trace([tmp_path])


# ---- expert ids: only the documented sentinel means "not computed" ---------------------------------


@FUZZ
@given(bad=st.integers(-10**6, -2), token=st.integers(0, 4), layer=st.sampled_from(MOE), j=st.integers(0, K - 1))
def test_a_negative_physical_id_in_an_sglang_dump_is_refused(tmp_path, bad, token, layer, j):
    rng = np.random.default_rng(7)
    reqs = [SgReq(3, 2)]
    reqs[0].rows, reqs[0].ids = routing(rng, 5), rng.integers(0, 100, 5)
    sglang_dump([("extend", [(0, 0, 3)]), ("decode", [(0, 3, 1)]), ("decode", [(0, 4, 1)])], reqs, rng, tmp_path / "d.pt")
    doc = torch.load(tmp_path / "d.pt", weights_only=True)
    record, row = (0, token) if token < 3 else (token - 2, 0)
    doc["records"][record]["topk_ids_of_layer"][layer, row, j] = bad
    torch.save(doc, tmp_path / "d.pt")
    with pytest.raises(TraceError) as err:
        import_trace([tmp_path / "d.pt"])
    msg = str(err.value)
    assert f"d.pt record {record}" in msg and f"layer {layer}" in msg and f"token row {row}" in msg and str(bad) in msg


@FUZZ
@given(bad=st.integers(-10**6, -2), token=st.integers(0, 5), layer=st.sampled_from(MOE))
def test_a_negative_id_in_a_vllm_response_is_refused_naming_its_token(tmp_path, bad, token, layer):
    rows, _ = vllm_rows(np.random.default_rng(8), 6)
    rows = rows.astype(np.int64)
    rows[token, layer, 0] = bad
    np.savez(tmp_path / "a.npz", prompt_routed_experts=rows[:4], routed_experts=rows[4:],
             prompt_token_ids=np.arange(4), token_ids=np.arange(3))
    with pytest.raises(TraceError, match=rf"a\.npz: token {token} .*layer {layer}: expert id {bad} "):
        _import(tmp_path / "a.npz")


def test_only_a_whole_token_layer_of_minus_one_is_not_computed(tmp_path):
    rng = np.random.default_rng(9)
    rows, moe = vllm_rows(rng, 4)
    rows = rows.astype(np.int32)
    rows[1, 2] = -1  # SGLang's and casmoe's "none": a gap
    np.savez(tmp_path / "a.npz", prompt_routed_experts=rows, routed_experts=rows[:0])
    [req] = _import(tmp_path / "a.npz").requests
    assert (req.topk[1, 1] == NOT_COMPUTED).all()
    rows[1, 2, 0] = 3  # -1 beside a real id: not a gap, refused
    np.savez(tmp_path / "a.npz", prompt_routed_experts=rows, routed_experts=rows[:0])
    with pytest.raises(TraceError, match="fewer than top_k"):
        _import(tmp_path / "a.npz")


# ---- SGLang: a request absent from a decode pass has finished --------------------------------------


def _one_after_another(lengths: list[tuple[int, int]], rng) -> tuple[list[SgReq], list]:
    """Requests served one at a time: each prefilled, then decoding alone until it finishes."""
    reqs, passes = [], []
    for i, (P, D) in enumerate(lengths):
        r = SgReq(P, D)
        r.rows, r.ids = routing(rng, P + D), rng.integers(0, 1000, P + D)
        reqs.append(r)
        passes.append(("extend", [(i, 0, P)]))
        passes += [("decode", [(i, P + t, 1)]) for t in range(D)]
    return reqs, passes


def _overlapping(lengths: list[tuple[int, int]], admit: list[int], rng) -> tuple[list[SgReq], list]:
    """Continuous batching: before each round `admit[i]` new requests are prefilled in one extend
    pass, then every running request decodes one token; a request leaves when it has decoded its
    count (at least one: a request that stops at its first token is the one case the dump
    cannot tell from an older one stopping, see sglang._decode_owners)."""
    reqs = []
    for P, D in lengths:
        r = SgReq(P, D)
        r.rows, r.ids = routing(rng, P + D), rng.integers(0, 1000, P + D)
        reqs.append(r)
    passes, running, done, nxt, rounds = [], [], {}, 0, 0
    while nxt < len(reqs) or running:
        new = list(range(nxt, min(len(reqs), nxt + admit[rounds % len(admit)])))
        rounds += 1
        nxt += len(new)
        if new:
            passes.append(("extend", [(i, 0, reqs[i].prompt) for i in new]))
            running += new
            done.update({i: 0 for i in new})
        if running:
            passes.append(("decode", [(i, reqs[i].prompt + done[i], 1) for i in running]))
            for i in running:
                done[i] += 1
            running = [i for i in running if done[i] < reqs[i].decoded]
    return reqs, passes


def _check(tr, reqs):
    assert len(tr.requests) == len(reqs)
    for got, want in zip(tr.requests, reqs):
        assert got.prefill == want.prompt
        np.testing.assert_array_equal(got.topk, want.rows)
        np.testing.assert_array_equal(got.output_ids, want.ids[want.prompt :])


def test_requests_served_one_after_another_keep_their_own_tokens(tmp_path):
    """The user study's dump: a short request, then a longer one whose decode positions pass
    the first one's; the first must not receive the second's decode tokens."""
    rng = np.random.default_rng(10)
    reqs, passes = _one_after_another([(3, 3), (5, 4), (4, 2)], rng)
    sglang_dump(passes, reqs, rng, tmp_path / "d.pt")
    _check(import_trace([tmp_path / "d.pt"]), reqs)


@FUZZ
@given(lengths=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 5)), min_size=1, max_size=5),
       admit=st.lists(st.integers(0, 2), min_size=1, max_size=4).filter(any), serial=st.booleans())
def test_sglang_schedules_rebuild_every_request(tmp_path, lengths, admit, serial):
    """Any schedule in which no two requests decode at one position in one pass (requests in
    lockstep, one of which stops, leave a dump that cannot say which one: it has no request ids)."""
    rng = np.random.default_rng(len(lengths))
    reqs, passes = _one_after_another(lengths, rng) if serial else _overlapping(lengths, admit, rng)
    for mode, segments in passes:
        positions = [start for _, start, _ in segments]
        assume(mode != "decode" or len(set(positions)) == len(positions))
    sglang_dump(passes, reqs, rng, tmp_path / "d.pt")
    _check(import_trace([tmp_path / "d.pt"]), reqs)


# ---- counts are numbers --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["ktransformers", "sglang-stat"])
def test_a_boolean_mask_is_not_popularity_counts(tmp_path, fmt):
    mask = torch.rand(L_ALL, E) > 0.5
    torch.save(mask if fmt == "ktransformers" else {"logical_count": mask[None]}, tmp_path / "m.pt")
    with pytest.raises(ProfileError, match=r"m\.pt: counts must be numbers of routed tokens, not a boolean mask"):
        import_profile([tmp_path / "m.pt"], fmt)


@FUZZ
@given(dtype=st.sampled_from(["bool", "int8", "int64", "uint16", "float16", "float32", "float64", "complex64"]),
       special=st.sampled_from([None, "nan", "inf", "negative", "huge"]))
def test_counts_are_finite_non_negative_numbers(dtype, special):
    arr = np.ones((2, 3), dtype=dtype)
    if special and np.dtype(dtype).kind == "f":
        arr[1, 2] = {"nan": np.nan, "inf": np.inf, "negative": -1, "huge": np.finfo(dtype).max}[special]
    if special == "negative" and np.dtype(dtype).kind == "i":
        arr[1, 2] = -1
    ok = np.dtype(dtype).kind in "iuf" and not (special in ("nan", "inf") and np.dtype(dtype).kind == "f") \
        and not (special == "negative" and np.dtype(dtype).kind in "if")
    try:
        out = count_array(arr, "x.pt")
        Profile(arr)
    except ProfileError as exc:
        assert not ok or (special == "huge" and dtype == "float64"), (dtype, special, exc)
        assert str(exc).startswith("x.pt: ") or str(exc).startswith("<profile>: ")
        return
    assert ok and out.dtype == np.float64 and np.isfinite(out).all() and (out >= 0).all()


# ---- the expert count of a dump is a lower bound -------------------------------------------------


def _sglang_response(L: int, k: int, top: int, rng) -> dict:
    import base64

    P, G = 3, 3
    ids = np.stack([np.stack([rng.choice(top, k, replace=False) for _ in range(L)]) for _ in range(P + G - 1)])
    return {"text": "t", "output_ids": [1, 2, 3], "meta_info": {
        "id": "r0", "prompt_tokens": P, "completion_tokens": G,
        "routed_experts": base64.b64encode(ids.astype("<i4").tobytes()).decode()}}


def test_an_expert_nobody_routed_to_does_not_make_a_correct_model_disagree(tmp_path, monkeypatch, capsys):
    from casmoe.presets import get_preset

    model = get_preset("mixtral-8x7b").geometry  # 32 MoE layers, 8 experts, top-2
    doc = _sglang_response(model.layers, model.top_k, model.experts - 2, np.random.default_rng(11))  # ids 0..5 only
    (tmp_path / "r.json").write_text(json.dumps(doc))
    tr = import_trace([tmp_path / "r.json"], model=model)
    assert tr.geometry.experts == 8 and not tr.meta["experts_inferred"]
    assert import_trace([tmp_path / "r.json"], num_experts=8, top_k=2).geometry.experts == 8
    with pytest.raises(TraceError, match="expert id 5 .*has 4 experts"):  # fewer than the ids seen: refused
        import_trace([tmp_path / "r.json"], num_experts=4, top_k=2)
    code, out, err = cli(["trace", "import", "r.json", "--model", "mixtral-8x7b", "-o", "t.npz"], tmp_path,
                         monkeypatch, capsys)
    assert code == 0 and "8 experts" in out, (out, err)


def test_a_per_token_dump_without_a_map_takes_the_model_s_expert_count(tmp_path):
    """Without `last_physical_to_logical_map` the ids are the experts, the count the largest + 1:
    a model with more is taken, not refused."""
    from make_examples import sglang_record, write_sglang

    rng = np.random.default_rng(12)
    rows = np.full((5, L_ALL, K), -1)
    rows[:, MOE] = np.argsort(rng.random((5, len(MOE), 4)), axis=2)[:, :, :K]  # ids 0..3 of the model's 6
    passes = [("extend", [(0, rows[:3], [1, 2, 3])]), ("decode", [(3, rows[3:4], [4])]), ("decode", [(4, rows[4:], [5])])]
    write_sglang(tmp_path / "d.pt", [sglang_record(i, mode, seg, L_ALL) for i, (mode, seg) in enumerate(passes)],
                 np.tile(np.arange(E), (L_ALL, 1)))
    doc = torch.load(tmp_path / "d.pt", weights_only=True)
    del doc["last_physical_to_logical_map"]
    torch.save(doc, tmp_path / "d.pt")
    assert import_trace([tmp_path / "d.pt"]).geometry.experts == 4  # what the ids show
    tr = import_trace([tmp_path / "d.pt"], num_experts=E)
    assert tr.geometry.experts == E and tr.requests[0].prefill == 3
    np.testing.assert_array_equal(tr.requests[0].topk, rows[:, MOE])


def test_a_foreign_dump_is_one_line_in_the_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.pt").write_bytes(b"PK\x03\x04" + bytes(40))
    code, _, err = cli(["popularity", "import", "--format", "ktransformers", "m.pt", "-o", "p.npz"], tmp_path,
                       monkeypatch, capsys)
    assert_one_line(code, err)
    assert "m.pt" in err
