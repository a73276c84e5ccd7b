"""Serving engines' routing dumps -> traces and profiles, on fixtures written in each engine's
documented format (vLLM's routed experts, SGLang's per_token recorder and responses,
TensorRT-LLM's expert statistics, KTransformers' frequency tables), never by casmoe's exporter."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from casmoe.geometry import Geometry
from casmoe.importers import import_profile, import_trace, read_route_csv, write_route_csv
from casmoe.importers.sglang import read_sglang_counts
from casmoe.profile import Profile, ProfileError, load_profile, read_profile
from casmoe.trace import NOT_COMPUTED, Trace, TraceError
from casmoe.trace_io import load_trace, save_trace
from support.cli import assert_one_line, cli
from support.engine_dumps import (DENSE, E, EXAMPLES, K, L_ALL, MOE, PHYS_TO_LOG, REQUESTS, routing, sglang_dump,
                                  sglang_workload, vllm_rows, write_trtllm)
from support.traces import assert_same

torch = pytest.importorskip("torch")


def test_sglang_per_token_dump_recovers_every_request(tmp_path):
    rng = np.random.default_rng(0)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, rng, tmp_path / "expert_distribution_recorder_1.0_0.pt")
    tr = import_trace([tmp_path / "expert_distribution_recorder_1.0_0.pt"])
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (3, E, K)
    assert tr.meta["moe_layers"] == MOE and tr.meta["engine_layers"] == L_ALL
    # requests in order of first appearance: 0, 1 (pass 0), 4 (pass 1), 2 (pass 2), 3 (pass 4)
    order = [0, 1, 4, 2, 3]
    assert len(tr.requests) == len(order)
    for got, i in zip(tr.requests, order):
        want = reqs[i]
        computed_prompt = want.prompt - want.cached if want.prompt else 0
        assert got.prefill == computed_prompt, i
        np.testing.assert_array_equal(got.topk, want.rows, err_msg=f"request {i}")
        assert (got.weights == 1 / K).all()
        np.testing.assert_array_equal(got.output_ids, want.ids[computed_prompt:])
    assert tr.meta["prefix_cached_tokens"] == [0, 0, 0, 0, 2]
    assert tr.meta["started_before_recording"] == 1
    save_trace(tr, tmp_path / "t.npz")  # and through casmoe's own formats, unchanged
    write_route_csv(load_trace(tmp_path / "t.npz"), tmp_path / "t.csv")
    assert_same(read_route_csv(tmp_path / "t.csv"), tr)


def test_sglang_tensor_parallel_ranks_count_once_and_data_parallel_ranks_add(tmp_path):
    rng = np.random.default_rng(1)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, np.random.default_rng(5), tmp_path / "d_0.pt", rank=0)
    sglang_dump(passes, reqs, np.random.default_rng(5), tmp_path / "d_1.pt", rank=1)  # same passes, same ids
    assert len(import_trace([tmp_path], "sglang").requests) == 5
    other, other_passes = sglang_workload(np.random.default_rng(2))
    sglang_dump(other_passes, other, rng, tmp_path / "d_1.pt", rank=1)  # rank 1 serves other requests
    tr = import_trace([tmp_path])
    assert len(tr.requests) == 10 and tr.meta["ranks"] == ["0", "1"]


def test_sglang_counts_of_a_per_token_dump_equal_the_trace_popularity(tmp_path):
    rng = np.random.default_rng(3)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, rng, tmp_path / "d.pt")
    profile = read_sglang_counts([tmp_path / "d.pt"])
    np.testing.assert_array_equal(profile.counts, import_trace([tmp_path / "d.pt"]).popularity())
    assert profile.meta["moe_layers"] == MOE


def test_sglang_stat_dump_becomes_a_profile(tmp_path):
    counts = np.random.default_rng(4).integers(0, 50, (7, L_ALL, E))
    counts[:, DENSE] = 0
    torch.save({"rank": 0, "logical_count": torch.tensor(counts, dtype=torch.int32),
                "average_utilization_rate_over_window": None}, tmp_path / "stat.pt")
    profile = import_profile([tmp_path / "stat.pt"], "sglang-stat")
    np.testing.assert_array_equal(profile.counts, counts.sum(axis=0)[MOE])
    with pytest.raises(TraceError, match="counts only"):  # not a trace
        import_trace([tmp_path / "stat.pt"])


@pytest.mark.parametrize("fault", ["pickled object", "speculative pass", "damaged file", "map too small", "mixed geometries"])
def test_sglang_faults_are_refused(tmp_path, fault):
    rng = np.random.default_rng(6)
    reqs, passes = sglang_workload(rng)
    path = tmp_path / "d.pt"
    sglang_dump(passes, reqs, rng, path)
    doc = torch.load(path, weights_only=True)
    if fault == "pickled object":
        doc["records"][0]["misc_objects"] = [Geometry(1, 2, 1)]  # a class instance: weights_only refuses it
    elif fault == "speculative pass":
        doc["records"][1]["forward_mode"] = 5  # TARGET_VERIFY
    elif fault == "map too small":
        doc["last_physical_to_logical_map"] = torch.tensor(PHYS_TO_LOG[:, :5])
    elif fault == "mixed geometries":
        doc["records"][1]["topk_ids_of_layer"] = doc["records"][1]["topk_ids_of_layer"][:3]
    torch.save(doc, path)
    if fault == "damaged file":
        path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(TraceError) as err:
        import_trace([path])
    assert "\n" not in str(err.value)
    if fault == "pickled object":
        assert "refused" in str(err.value)


def test_sglang_responses_with_routed_experts(tmp_path):
    rng = np.random.default_rng(7)
    docs, want = [], []
    for rid, (P, G) in enumerate([(4, 3), (2, 5)]):
        rows = np.full((P + G - 1, L_ALL, K), -1, dtype=np.int32)  # -1 in the dense layer
        rows[:, MOE] = routing(rng, P + G - 1)
        want.append(rows[:, MOE])
        out_ids = rng.integers(0, 100, G).tolist()
        docs.append({"text": f"answer {rid}", "output_ids": out_ids, "meta_info": {
            "id": f"req-{rid}", "prompt_tokens": P, "completion_tokens": G,
            "routed_experts": base64.b64encode(rows.astype("<i4").tobytes()).decode()}})
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    with pytest.raises(TraceError, match="--top-k"):
        import_trace([tmp_path / "r.jsonl"])
    tr = import_trace([tmp_path / "r.jsonl"], top_k=K)
    for got, rows, doc in zip(tr.requests, want, docs):
        np.testing.assert_array_equal(got.topk, rows)
        assert got.prefill == doc["meta_info"]["prompt_tokens"] and got.output == doc["text"]
        assert got.output_ids.tolist() == doc["output_ids"]
    assert tr.meta["request_names"] == ["req-0", "req-1"]


# ---- vLLM ---------------------------------------------------------------------------------------


def test_vllm_npz_per_request_files_in_a_folder(tmp_path):
    rng = np.random.default_rng(8)
    want = []
    for i, (P, G) in enumerate([(5, 4), (3, 1), (6, 7)]):
        prompt, moe_p = vllm_rows(rng, P)
        gen, moe_g = vllm_rows(rng, G - 1)  # the last generated token has no row
        np.savez(tmp_path / f"req{i}.npz", prompt_routed_experts=prompt, routed_experts=gen,
                 prompt_token_ids=rng.integers(0, 50, P), token_ids=np.arange(G) + 100 * i,
                 prompt=np.array(f"prompt {i}"), text=np.array(f"text {i}"))
        want.append((np.concatenate([moe_p, moe_g]), P, G, i))
    tr = import_trace([tmp_path])  # detected by content
    assert (tr.geometry.layers, tr.geometry.experts, tr.geometry.top_k) == (3, E, K)
    assert tr.meta["moe_layers"] == MOE and tr.meta["experts_inferred"]
    for got, (rows, P, G, i) in zip(tr.requests, want):
        np.testing.assert_array_equal(got.topk, rows)
        assert (got.prefill, got.prompt, got.output) == (P, f"prompt {i}", f"text {i}")
        assert got.output_ids.tolist() == list(np.arange(G) + 100 * i)
    # a round trip through casmoe's own formats keeps all of it
    save_trace(tr, tmp_path / "t.npz")
    write_route_csv(load_trace(tmp_path / "t.npz"), tmp_path / "t.csv")
    assert_same(read_route_csv(tmp_path / "t.csv"), tr)


def test_vllm_openai_responses_in_every_array_encoding(tmp_path):
    rng = np.random.default_rng(9)
    prompt, moe_p = vllm_rows(rng, 4)
    choices, want = [], []
    for c, G in enumerate([3, 5]):  # n=2: two choices share the prompt
        gen, moe_g = vllm_rows(rng, G - 1, dtype=np.int32)
        enc = gen.tolist() if c == 0 else {"data": base64.b64encode(gen.astype("<i4").tobytes()).decode(),
                                           "shape": list(gen.shape)}
        choices.append({"index": c, "message": {"role": "assistant", "content": f"reply {c}"},
                        "token_ids": list(range(G)), "routed_experts": enc})
        want.append(np.concatenate([moe_p, moe_g]))
    buf = io.BytesIO()
    np.save(buf, prompt)
    doc = {"id": "chatcmpl-1", "created": 1700000000, "prompt_token_ids": list(range(4)), "choices": choices,
           "prompt_routed_experts": base64.b64encode(buf.getvalue()).decode(), "usage": {"prompt_tokens": 4}}
    (tmp_path / "resp.json").write_text(json.dumps(doc))
    tr = import_trace([tmp_path], num_experts=8)  # a folder of responses, told apart by content
    assert tr.geometry.experts == 8 and not tr.meta["experts_inferred"]
    for got, rows, c in zip(tr.requests, want, range(2)):
        np.testing.assert_array_equal(got.topk, rows)
        assert got.prefill == 4 and got.output == f"reply {c}" and got.arrival == 0.0


def test_vllm_whole_sequence_form_and_one_file_of_many(tmp_path):
    rng = np.random.default_rng(10)
    whole, moe = vllm_rows(rng, 5 + 3 - 1)  # older vLLM: prompt + generated - 1 rows in one array
    records = [{"prompt": "p", "prompt_token_ids": [1, 2, 3, 4, 5], "arrival_time": 12.5,
                "outputs": [{"text": "t", "token_ids": [7, 8, 9], "routed_experts": whole.tolist()}]}]
    (tmp_path / "out.json").write_text(json.dumps(records))
    [got] = import_trace([tmp_path / "out.json"]).requests
    assert got.prefill == 5 and got.decode_tokens == 2
    np.testing.assert_array_equal(got.topk, moe)
    a, b = vllm_rows(rng, 3), vllm_rows(rng, 2)
    np.savez(tmp_path / "many.npz", **{"r0/prompt_routed_experts": a[0], "r0/routed_experts": b[0],
                                      "r1/prompt_routed_experts": b[0], "r1/routed_experts": a[0]})
    tr = import_trace([tmp_path / "many.npz"])
    assert [r.prefill for r in tr.requests] == [3, 2] and tr.meta["request_names"] == ["r0", "r1"]


@pytest.mark.parametrize("fault", ["mixed geometries", "model disagrees", "top-k disagrees", "no routing", "ragged"])
def test_vllm_faults_are_refused(tmp_path, fault):
    rng = np.random.default_rng(11)
    rows, _ = vllm_rows(rng, 4)
    np.savez(tmp_path / "a.npz", prompt_routed_experts=rows, routed_experts=rows[:2])
    opts = {}
    if fault == "mixed geometries":
        np.savez(tmp_path / "b.npz", prompt_routed_experts=rows[:, :3], routed_experts=rows[:2, :3])
    elif fault == "model disagrees":
        from casmoe.presets import get_preset

        opts = {"model": get_preset("mixtral-8x7b").geometry}
    elif fault == "top-k disagrees":
        opts = {"top_k": 4}
    elif fault == "no routing":
        np.savez(tmp_path / "a.npz", prompt_token_ids=np.arange(3))
    elif fault == "ragged":
        (tmp_path / "a.npz").unlink()
        (tmp_path / "r.json").write_text(json.dumps({"prompt_routed_experts": [[[1, 2]], [[1]]], "routed_experts": []}))
    with pytest.raises(TraceError) as err:
        import_trace([tmp_path], "vllm", **opts)
    assert "\n" not in str(err.value)


# ---- TensorRT-LLM and KTransformers: counts only ------------------------------------------------


def trtllm_folder(path, rng, layers=(3, 4, 5), ranks=2, iters=range(50, 53)):
    """Two ranks' statistics of MoE layers 3-5 (of a model whose first layers are dense), and
    the per-token files TensorRT-LLM writes beside them (not counts: not read)."""
    from safetensors.torch import save_file

    path.mkdir()
    total = np.zeros((len(layers), 8))
    for r in range(ranks):
        counts = {(it, layer): rng.integers(0, 20, 8) for it in iters for layer in layers}
        for (_, layer), c in counts.items():
            total[layers.index(layer)] += c
        write_trtllm(path, counts, 8, 2, rank=r)
        save_file({"50_3": torch.zeros(4, 2, dtype=torch.int32)}, str(path / f"rank{r}_raw.safetensors"))
    return total


def test_trtllm_expert_statistics_become_a_profile(tmp_path):
    total = trtllm_folder(tmp_path / "expert_statistic", np.random.default_rng(12))
    profile = import_profile([tmp_path / "expert_statistic"], "trtllm")
    np.testing.assert_array_equal(profile.counts, total)
    assert profile.meta["moe_layers"] == [3, 4, 5] and profile.meta["iterations"] == [50, 52]
    assert profile.meta["top_k"] == 2


def test_ktransformers_frequency_tables(tmp_path):
    freq = np.random.default_rng(13).random((L_ALL, E)) * 100
    freq[DENSE] = 0
    torch.save(torch.tensor(freq), tmp_path / "freq.pt")
    torch.save(torch.tensor(freq[None].repeat(3, axis=0)), tmp_path / "steps.pt")
    np.testing.assert_allclose(import_profile([tmp_path / "freq.pt"], "ktransformers").counts, freq[MOE])
    np.testing.assert_allclose(import_profile([tmp_path / "steps.pt"], "ktransformers").counts, 3 * freq[MOE])
    from casmoe.presets import get_preset

    with pytest.raises(ProfileError, match="MoE layers"):
        import_profile([tmp_path / "freq.pt"], "ktransformers", model=get_preset("mixtral-8x7b").geometry)


@pytest.mark.parametrize("content", ["negative", "nan", "zeros", "1d", "dict"])
def test_bad_frequency_tables_are_refused(tmp_path, content):
    table = {"negative": -np.ones((2, 4)), "nan": np.full((2, 4), np.nan), "zeros": np.zeros((2, 4)),
             "1d": np.ones(4), "dict": None}[content]
    obj = {"counts": torch.ones(2, 4)} if content == "dict" else torch.tensor(table)
    torch.save(obj, tmp_path / "f.pt")
    with pytest.raises(ProfileError):
        import_profile([tmp_path / "f.pt"], "ktransformers")


def test_profile_round_trip_and_trace_profiles(tmp_path):
    counts = np.arange(12, dtype=float).reshape(3, 4)
    Profile(counts, {"source": "test"}).save(tmp_path / "p.npz")
    back = read_profile(tmp_path / "p.npz")
    np.testing.assert_array_equal(back.counts, counts)
    assert back.meta["source"] == "test"
    rng = np.random.default_rng(14)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, rng, tmp_path / "d.pt")
    tr = import_trace([tmp_path / "d.pt"])
    save_trace(tr, tmp_path / "t.npz")
    np.testing.assert_array_equal(load_profile(tmp_path / "t.npz"), tr.popularity())
    (tmp_path / "bad.npz").write_bytes(b"PK not a zip")
    with pytest.raises(ProfileError):
        load_profile(tmp_path / "bad.npz")


# ---- the commands, end to end -------------------------------------------------------------------


def test_engine_dump_to_trace_and_counts_to_static_profile(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(15)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, rng, tmp_path / "dump.pt")
    code, out, err = cli(["trace", "import", "dump.pt", "-o", "t.npz"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "1 of the engine's 4 layers had no routing (dense) and were dropped" in out
    counts = rng.integers(1, 9, (2, L_ALL, E))
    counts[:, :, 4] = 1000  # expert 4 is the hottest of every MoE layer
    counts[:, DENSE] = 0
    torch.save({"logical_count": torch.tensor(counts)}, tmp_path / "stat.pt")
    code, out, err = cli(["popularity", "import", "--format", "sglang-stat", "stat.pt", "-o", "p.npz"], tmp_path,
                         monkeypatch, capsys)
    assert code == 0, err
    code, out, err = cli(["popularity", "info", "p.npz"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "3 MoE layers x 6 experts" in out, err
    from casmoe.cache import Capacity
    from casmoe.policies import get_policy
    from casmoe.policies.static import Static

    tr = load_trace(tmp_path / "t.npz")
    cache = get_policy("static").create(tr.geometry, Capacity(3), trace=tr, profile=str(tmp_path / "p.npz"))
    assert isinstance(cache, Static) and cache.pinned == frozenset(layer * E + 4 for layer in range(3))
    code, out, err = cli(["replay", "--trace", "t.npz", "--policy", "static[profile=p.npz]", "--capacity", "3"],
                         tmp_path, monkeypatch, capsys)
    assert code == 0 and "static" in out, err


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "import", "dump.pt", "-o", "dump.pt"],
        ["trace", "import", "dump.pt", "-o", "t.npz", "--top-k", "0"],
        ["trace", "import", "dump.pt", "-o", "t.npz", "--model", "mixtral-8x7b"],
        ["trace", "import", "dump.pt", "-o", "t.npz", "--num-experts", "7"],
        ["popularity", "import", "--format", "trtllm", "dump.pt", "-o", "p.npz"],
        ["popularity", "import", "--format", "ktransformers", "dump.pt", "-o", "p.npz"],
        ["popularity", "import", "--format", "nope", "dump.pt", "-o", "p.npz"],
        ["popularity", "info", "dump.pt"],
    ],
)
def test_engine_command_faults_are_one_line(tmp_path, monkeypatch, capsys, argv):
    rng = np.random.default_rng(16)
    reqs, passes = sglang_workload(rng)
    sglang_dump(passes, reqs, rng, tmp_path / "dump.pt")
    before = (tmp_path / "dump.pt").read_bytes()
    code, _, err = cli(argv, tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert (tmp_path / "dump.pt").read_bytes() == before and not (tmp_path / "t.npz").exists()


def test_gap_rows_of_an_engine_dump_stay_gaps(tmp_path):
    """A token-layer an engine left at its fill value inside an MoE layer is not computed, never
    an invented expert 0."""
    rng = np.random.default_rng(17)
    rows, moe = vllm_rows(rng, 5)
    rows[2, 1] = 0
    np.savez(tmp_path / "a.npz", prompt_routed_experts=rows, routed_experts=rows[:0])
    [req] = import_trace([tmp_path / "a.npz"]).requests
    assert (req.topk[2, 0] == NOT_COMPUTED).all() and (req.weights[2, 0] == 0).all()
    np.testing.assert_array_equal(req.topk[3:], moe[3:])


def test_the_shipped_engine_examples_give_back_tiny_mixtrals_routing(tmp_path):
    """examples/engine-dumps holds tiny-mixtral's recorded routing in each engine's format; each
    import gives back the source's expert ids, prompt lengths and counts."""
    source = load_trace(EXAMPLES.parents[1] / "traces" / "tiny-mixtral.npz")
    reqs = [source.requests[i] for i in REQUESTS]
    vllm = import_trace([EXAMPLES / "vllm"], num_experts=8)
    sglang = import_trace([EXAMPLES / "sglang"])
    for tr, want in ((vllm, reqs), (sglang, reqs[:2])):
        assert len(tr.requests) == len(want)
        for got, r in zip(tr.requests, want):
            np.testing.assert_array_equal(got.topk, r.topk)
            assert got.prefill == r.prefill
    assert [r.output for r in vllm.requests] == [r.output for r in reqs]
    [csv] = import_trace([EXAMPLES / "my-engine.csv"]).requests
    np.testing.assert_array_equal(csv.topk, reqs[0].topk)
    counts = Trace(source.geometry, reqs).popularity()
    for fmt, path in (("trtllm", "trtllm"), ("sglang-stat", "sglang-stat.pt"), ("ktransformers", "ktransformers-frequency.pt")):
        np.testing.assert_array_equal(import_profile([EXAMPLES / path], fmt).counts, counts)
