"""`casmoe plan`'s command lines against the flags each engine's source has.

The flag lists are data read at a named version (casmoe/engines/*.toml, casmoe/sim/questions/deploy/verified.toml);
every command a plan writes must parse with them: each flag a name or alias of the list, its
value of the flag's kind, llama.cpp's `-ot` in its parser's syntax, and the regexes naming
exactly the tensors meant. KTransformers' statistics file is read back as kt-kernel reads it,
and casmoe's own `bench` line through the installed command's parser.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from casmoe.presets import get_preset
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy.engines import Command, EngineFlagError


def test_the_held_flag_lists_hold_what_a_plan_writes():
    """The flags a plan prints are in the lists read from the engines' source, with the version."""
    server = eng.flag_list(eng.LLAMA_SERVER)
    assert "b8914" in server.version
    for f in ("-m", "-ngl", "--n-cpu-moe", "-ot", "-c", "-np", "-b", "-ub", "-ctk", "-ctv", "-fa", "-t", "--numa",
              "--fit", "-ts"):
        assert server.get(f) is not None, f
    assert server.get("-ot").kind == "regex-list" and server.get("--numa").choices == ("distribute", "isolate", "numactl")
    kt = eng.flag_list(eng.SGLANG + " (ktransformers)")
    for f in ("--model-path", "--kt-weight-path", "--kt-method", "--kt-cpuinfer", "--kt-threadpool-count",
              "--kt-num-gpu-experts", "--kt-gpu-experts-ratio", "--kt-expert-placement-strategy",
              "--init-expert-location", "--context-length", "--max-running-requests", "--mem-fraction-static",
              "--kv-cache-dtype"):
        assert kt.get(f) is not None, f
    assert "frequency" in kt.get("--kt-expert-placement-strategy").choices
    assert "04653fa8" in kt.get("--kt-num-gpu-experts").source  # the fork's own line, not upstream's
    vllm = eng.flag_list(eng.VLLM)
    for f in ("--cpu-offload-gb", "--cpu-offload-params", "--max-model-len", "--max-num-seqs", "--gpu-memory-utilization"):
        assert vllm.get(f) is not None, f
    assert eng.flag_list(eng.LLAMA_QUANTIZE).get("--tensor-type") is not None
    assert "9a276d63" in eng.program_source(eng.VLLM) and "b8914" in eng.program_source(eng.LLAMA_QUANTIZE)


@pytest.mark.parametrize("args, message", [
    ((("--no-such-flag", "1"),), "not a flag of llama.cpp"),
    ((("-ngl", "most"),), "number, auto or all"),
    ((("--numa", "spread"),), "one of distribute"),
    ((("-c", "32k"),), "whole number"),
    ((("--kv-unified", "yes"),), "switch"),
    ((("-ot", r"blk\.3\.ffn_up_exps"),), "no '='"),
    ((("-ot", r"blk\.3\.ffn_up_exps=GPU0"),), "unknown buffer type"),
    ((("-ot", r"blk\.(3\.ffn_up_exps=CPU"),), "not a regex"),
    ((("-ot", r"blk\.{1,3}\.ffn_up_exps=CPU"),), "has no '='"),  # a comma splits the item, as llama.cpp's parser does
])
def test_a_command_the_engine_would_refuse_is_refused(args, message):
    with pytest.raises(EngineFlagError, match=re.escape(message)):
        Command(eng.LLAMA_SERVER, args).check()


def test_kt_flags_of_upstream_sglang_and_the_fork_are_told_apart():
    cmd = Command(eng.SGLANG, (("--model-path", "x"), ("--kt-gpu-experts-ratio", "0.25")))
    with pytest.raises(EngineFlagError, match="not a flag of sglang"):
        cmd.check()  # upstream SGLang has no --kt-gpu-experts-ratio (casmoe/engines/README.md)
    Command(eng.SGLANG, cmd.args, eng.SGLANG + " (ktransformers)").check()


EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_up_exps.weight",
                  "ffn_down_chexps.weight", "ffn_up_exps.bias")
OTHER_TENSORS = ("attn_q.weight", "attn_k.weight", "ffn_gate_inp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                 "attn_norm.weight", "exp_probs_b.bias")


@pytest.mark.parametrize("placement", [
    [([0, 1, 2, 3], "CPU")],
    [([1, 11, 21, 35], "CPU")],
    [([10, 11, 12], "CUDA0"), ([30, 31], "CUDA1"), ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 20], "CPU")],
])
def test_ot_regexes_name_exactly_the_expert_tensors_of_their_layers(placement):
    """llama.cpp places tensors by the first -ot regex found in the name (regex_search): every
    expert tensor of a named layer goes where meant, every other tensor (and other layers) stays."""
    text = eng.overrides_text(placement)
    overrides = eng.parse_overrides(text)
    assert len(overrides) == len(placement)
    where = {b: buft for blocks, buft in placement for b in blocks}
    for block in range(40):
        for name in EXPERT_TENSORS:
            assert eng.override_target(overrides, f"blk.{block}.{name}") == where.get(block), (block, name)
        for name in OTHER_TENSORS:
            assert eng.override_target(overrides, f"blk.{block}.{name}") is None
    assert eng.override_target(overrides, "token_embd.weight") is None
    Command(eng.LLAMA_SERVER, (("-ot", text),)).check()


def test_n_cpu_moe_is_the_ot_of_the_first_layers():
    """`--n-cpu-moe N` appends blk\\.i + llama.cpp's expert pattern for i < N (llama.cpp.toml,
    its implementation): the regexes a plan writes for the first N layers place the same tensors."""
    data = eng._read(eng.ENGINE_DATA / "llama.cpp.toml")
    n_cpu_moe = next(f for f in data["flag"] if f["name"] == "--n-cpu-moe")
    assert eng.FFN_EXPS.replace("\\", "\\\\") in n_cpu_moe["implementation"]
    theirs = [(rf"blk\.{i}{eng.FFN_EXPS}", "CPU") for i in range(5)]
    ours = eng.parse_overrides(eng.overrides_text([(range(5), "CPU")]))
    for block in range(12):
        for name in EXPERT_TENSORS + OTHER_TENSORS:
            tensor = f"blk.{block}.{name}"
            assert eng.override_target(ours, tensor) == eng.override_target(theirs, tensor)


def test_tensor_type_takes_a_regex_and_a_ggml_type():
    ok = Command(eng.LLAMA_QUANTIZE, (("--tensor-type", eng.blocks_regex([2, 3]) + "=q8_0"), ("", "in.gguf"),
                                      ("", "out.gguf"), ("", "Q4_K_M")))
    ok.check()
    with pytest.raises(EngineFlagError, match="tensor_name=ggml_type"):
        Command(eng.LLAMA_QUANTIZE, (("--tensor-type", "blk=q9_9"),)).check()


def test_the_kt_statistics_file_makes_kt_kernels_mask_the_planned_experts(tmp_path):
    """Read back as kt_ep_wrapper.py reads it (weights_only, 'logical_count', summed over dim 0, as
    float32) and masked as generate_gpu_experts_masks masks (torch.topk of the flattened table):
    the GPU experts are exactly the first of the plan's order, whatever the count."""
    torch = pytest.importorskip("torch")
    from casmoe.sim.questions.deploy.placement import write_kt_order

    preset = get_preset("deepseek-v2-lite")  # dense blocks first: the file counts every block
    g = preset.geometry
    rng = np.random.default_rng(0)
    order = [int(e) for e in rng.permutation(g.total_experts)]
    path = tmp_path / "order.pt"
    write_kt_order(path, order, preset)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    counts = loaded["logical_count"]
    assert tuple(counts.shape) == (1, preset.blocks, g.experts)
    freq = counts.sum(dim=0).float()
    assert float(freq[: preset.dense_layers].sum()) == 0
    for n in (1, 7, g.experts * 3 + 5, g.total_experts):
        _, top = torch.topk(freq.view(-1), k=n, largest=True, sorted=False)
        chosen = {int(i) - preset.dense_layers * g.experts for i in top}
        assert chosen == set(order[:n])


def test_casmoes_bench_line_parses_with_the_installed_command(tmp_path):
    import typer

    from casmoe.cli import app
    from casmoe.policies.spec import parse_policy

    bench = typer.main.get_command(app).commands["bench"]
    for argv in (["--model", "Qwen/Qwen3-30B-A3B", "--policy", "routed-placement[profile=p.npz]", "--global-capacity",
                  "1800", "--miss-mode", "cpu", "--device", "cuda:0", "--threads", "12", "--batch", "2"],
                 ["--model", "m", "--policy", "lru", "--capacity", "38", "--miss-mode", "load", "--device", "cuda:0"]):
        ctx = bench.make_context("bench", list(argv))
        assert ctx.params["model"] == argv[1]
        parse_policy(ctx.params["policy"])
