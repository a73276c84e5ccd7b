"""`casmoe plan` end to end (issue 37): one command gives each engine's configuration that fits the
box, its memory map and its expected speed; on a box where everything fits it is all on the GPU;
precisions per placement; one-line errors; and, in the simulator, the routing-aware placement is
never slower than llama.cpp's `--n-cpu-moe` at equal memory on requests it never saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from casmoe.geometry import Geometry
from casmoe.presets import get_preset
from casmoe.shipped import shipped
from casmoe.sim.questions.deploy import PlanRequest, make_plan
from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.questions.deploy.plan import STACKS
from casmoe.sim.trust.uncertainty import spread
from test_fuzz import cli

ROOT = Path(__file__).resolve().parents[1]
BOX = str(ROOT / "examples" / "rtx4090-64g.toml")
QWEN = shipped("synthetic-qwen3-top8.npz")


def _check(plan) -> None:
    """Every candidate: its command parses with the engine's flags, its map never exceeds the box."""
    for c in plan.candidates():
        c.command.check()
        for step in c.prepare:
            step.check()
        for g in c.placement.memory.gpus:
            if c.fits:
                assert g.used <= g.total
        if c.fits:
            assert all(h.used <= h.total for h in c.placement.memory.host)


@pytest.fixture(scope="module")
def gptoss_trace(tmp_path_factory) -> Path:
    """gpt-oss-120b's routing shape, generated (fast), as a user's own --trace."""
    from casmoe.synthetic import SynthConfig, generate
    from casmoe.trace_io import save_trace

    g = get_preset("gpt-oss-120b").geometry
    tr = generate(Geometry(g.layers, g.experts, g.top_k, hidden=g.hidden, intermediate=g.intermediate),
                  SynthConfig(requests=15, prefill=(8, 16), decode=(8, 16), seed=1, meta={"model_preset": "gpt-oss-120b"}))
    path = tmp_path_factory.mktemp("oss") / "oss.npz"
    save_trace(tr, path)
    return path


def test_gpt_oss_120b_on_one_4090_with_64_gb_at_32k(gptoss_trace, tmp_path, monkeypatch, capsys):
    """The issue's 'done': a llama.cpp command line that fits the box, its memory map and its
    expected speed with an uncertainty; the same for KTransformers and casmoe's backend."""
    code, out, err = cli(["plan", "--model", "gpt-oss-120b", "--hardware", BOX, "--engine", "llama.cpp", "--engine",
                          "ktransformers", "--engine", "casmoe", "--context", "32768", "--trace", str(gptoss_trace),
                          "--requests", "3", "--out", "p"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "== llama.cpp (flags as read in its source: b8914" in out and "llama-server" in out
    assert "--n-cpu-moe" in out or "-ot" in out
    assert "memory map, GiB" in out and "expected: decode" in out and "uncertainty: " in out
    assert "== ktransformers" in out and "--kt-expert-placement-strategy frequency" in out
    assert "== casmoe" in out and "casmoe bench" in out and "no adapter for gpt_oss" in out
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    for e in plan["engines"]:
        best = e["best"]
        assert best["fits"] and best["memory"]["fits"], e["engine"]
        for g in best["memory"]["gpus"]:
            assert g["used_gib"] <= g["total_gib"]
        assert best["speed"]["decode_tok_s"] > 0 and best["speed"]["uncertainty"].startswith("uncertainty: " + spread(
            {"stack": STACKS[e["engine"]], "policy": best["simulated_policy"] or ""}))
        assert best["memory"]["gpus"][0]["kv_gib"] > 0
        assert sum(map(sum, best["gpu_experts_by_layer"])) == best["gpu_experts"]  # which layers' experts live where
    assert sorted(p.name for p in (tmp_path / "p").glob("*.png")) == ["plan_memory.png", "plan_speed.png"]
    import pandas as pd

    frame = pd.read_csv(tmp_path / "p" / "candidates.csv")
    assert set(frame["engine"]) == {"llama.cpp", "ktransformers", "casmoe"} and frame["fits"].all()
    assert len(pd.read_json(tmp_path / "p" / "candidates.json")) == len(frame)
    assert (tmp_path / "p" / "kt-expert-order.pt").is_file() and (tmp_path / "p" / "llama.cpp.sh").is_file()
    assert (tmp_path / "p" / "casmoe-profile.npz").is_file()


def test_every_engine_on_qwen3_fits_and_parses(tmp_path):
    plan = make_plan(PlanRequest("qwen3-30b-a3b", BOX, context=32768, requests=2, compare=False, gpu_precision="bf16"),
                     tmp_path / "q")
    _check(plan)
    by = {e.engine: e for e in plan.engines}
    assert set(by) == set(eng.ENGINES)
    for e in plan.engines:
        assert e.best is not None and e.best.fits and e.best.speed is not None
        assert e.best.speed.decode and e.best.speed.decode > 0
    # the per-expert placements use the routing; llama.cpp's layers with q8_0 KV hold more layers than with f16
    assert by["ktransformers"].best.placement.unit == "expert"
    assert by["sglang"].best.speed.how == "closed form (not simulated)"
    assert by["vllm"].best.command.has("--cpu-offload-params")
    counts = [c.placement.count for c in [by["llama.cpp"].best, *by["llama.cpp"].others]]
    assert counts[0] == max(counts)


def test_a_plan_note_never_gives_simulates_remedies(tmp_path):
    """llama.cpp's placement fills the 4090 past the profile's reserved_gib: simulated anyway, and
    said so, without the refusal's 'give --context 53 ... or --allow-overcommit' (simulate's
    remedies, for a placement the plan chose itself)."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", BOX, engines=("llama.cpp",), requests=2, compare=False),
                     tmp_path / "q")
    notes = [n for c in plan.candidates() for n in c.notes]
    assert any(n.startswith("simulated past the simulator's own memory check") for n in notes)
    assert not any("--allow-overcommit" in n or "give --" in n for n in notes), notes


def test_a_box_where_everything_fits_is_all_on_the_gpu(tmp_path):
    plan = make_plan(PlanRequest("qwen3-30b-a3b", "h200-sxm@gpus=1", context=8192, requests=2, compare=False,
                                 gpu_precision="bf16"), tmp_path / "h")
    _check(plan)
    for e in plan.engines:
        best = e.best
        assert best.placement.rule == "all", e.engine
        assert sum(h.expert_count for h in best.placement.memory.host) == 0
        argv = best.command.argv()
        assert not {"--n-cpu-moe", "-ot", "--cpu-offload-gb"} & set(argv), (e.engine, argv)
    llama = next(e for e in plan.engines if e.engine == "llama.cpp").best
    assert llama.label == "all on GPU" and llama.command.value("-ngl") == "all"


def test_gpu_and_host_experts_at_two_precisions(tmp_path):
    """llama.cpp PR #12511: GPU layers' experts at q8_0, the host's at Q4_K_M, in one GGUF made by
    llama-quantize --tensor-type; the map counts each at its own size."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", BOX, ("llama.cpp", "ktransformers"), context=8192, requests=2,
                                 compare=False, gpu_precision="q8_0", host_precision="q4_k_m"), tmp_path / "m")
    _check(plan)
    p = get_preset("qwen3-30b-a3b")
    llama = next(e for e in plan.engines if e.engine == "llama.cpp").best
    quantize = llama.prepare[0]
    assert quantize.program == eng.LLAMA_QUANTIZE and quantize.argv()[-1] == "Q4_K_M"
    pattern, _, kind = quantize.value("--tensor-type").partition("=")
    assert kind == "q8_0"
    gpu_layers = {layer for gl in llama.placement.gpu_layers() for layer in gl}
    overrides = [(pattern, "GPU")]
    for layer in range(p.geometry.layers):
        hit = eng.override_target(overrides, f"blk.{layer}.ffn_down_exps.weight")
        assert (hit == "GPU") == (layer in gpu_layers)
    m = llama.placement.memory
    q8 = p.expert_bytes_per_layer("q8_0")[0]
    assert m.gpus[0].experts == m.gpus[0].expert_count * q8
    assert sum(h.experts for h in m.host) == sum(p.expert_bytes_per_layer("q4_k_m")[layer] * p.geometry.experts
                                                 for layer in range(p.geometry.layers) if layer not in gpu_layers)
    kt = next(e for e in plan.engines if e.engine == "ktransformers").best
    assert kt.command.value("--kt-method") == "LLAMAFILE"  # GGUF host experts: kt-kernel's llamafile backend


@pytest.mark.parametrize("batch", [1, 4])
def test_routed_placement_is_never_slower_than_n_cpu_moe_at_equal_memory(batch):
    """On the shipped Qwen3 routing, held-out requests: the routing-aware layers (what llama.cpp's
    -ot can place) and experts (what KTransformers' mask can) against --n-cpu-moe, same slots."""
    from casmoe.sim.run.grid import Grid
    from casmoe.sim.run.runner import run

    b = f"batch={batch}"
    for gpu_layers in (16, 30):
        policies = [f"n-cpu-moe[n={48 - gpu_layers}]", f"routed-placement[unit=layer,{b}]", f"routed-placement[{b}]"]
        runs = Grid.of({"trace": str(QWEN), "hardware": BOX, "global_capacity": str(gpu_layers * 128),
                        "split": "heldout", "requests": 4, "batch": batch, "devices": 1, "policy": policies}).specs()
        speed = {s.policy.name + str(dict(s.policy.options).get("unit", "")): run(s)["decode_tokens_per_s"]
                 for s in runs.specs}
        base = speed["n-cpu-moe"]
        assert speed["routed-placementlayer"] >= base * (1 - 1e-9)
        assert speed["routed-placement"] > base


def test_the_plan_compares_its_placement_with_llama_cpps_on_held_out_requests(tmp_path):
    plan = make_plan(PlanRequest("qwen3-30b-a3b", BOX, ("llama.cpp",), context=8192, concurrency=2, requests=3,
                                 gpu_precision="bf16"), tmp_path / "c")
    comp = plan.comparison
    assert comp is not None and {r["split"] for r in comp.rows} == {"heldout", "train"}
    assert all("heldout" in r["scored"] or "train" in r["scored"] for r in comp.rows)
    assert comp.gain("routed experts", "heldout") > 0 and comp.gain("routed layers", "heldout") >= 0
    assert "casmoe simulate" in comp.command and "--split heldout" in comp.command


def test_a_checkpoint_config_is_priced_as_its_preset(tmp_path):
    from casmoe.sim.questions.deploy.model import ModelError, resolve_model

    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "hidden_size": 2048, "moe_intermediate_size": 768}))
    choice = resolve_model(str(folder))
    assert choice.preset == "qwen3-30b-a3b" and choice.weights == str(folder)
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 7, "num_experts": 3, "num_experts_per_tok": 1,
                                                    "hidden_size": 64}))
    with pytest.raises(ModelError, match="no preset has its shape"):
        resolve_model(str(folder / "config.json"))


@pytest.mark.parametrize("argv, message", [
    (["--model", "qwen3-30b-a3b", "--engine", "tensorrt"], "unknown engine 'tensorrt'"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "qwen3-30b-a3b", "--gpu-memory", "24", "--gpu-memory", "12"], "--gpu-memory gives 2 GPUs"),
    (["--model", "qwen3-30b-a3b", "--trace", "missing.npz"], "trace missing.npz not found"),
    (["--model", "gpt-oss-120b", "--trace", str(QWEN)], "has 48 MoE layers x 128 experts"),
    (["--model", "qwen3-30b-a3b", "--precision", "q5x"], "unknown precision 'q5x'"),
])
def test_bad_input_is_one_line(argv, message, tmp_path, monkeypatch, capsys):
    code, _, err = cli(["plan", "--hardware", BOX, *argv], tmp_path, monkeypatch, capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("casmoe: error: ") and message in lines[-1] and "Traceback" not in err


def test_a_shape_without_any_routing_gets_a_generated_one_and_says_so():
    from casmoe.sim.questions.deploy.routing import resolve
    from casmoe.trace_io import load_trace

    preset = get_preset("mixtral-8x22b")
    routing = resolve(preset, None)
    assert routing.how.startswith("GENERATED routing of mixtral-8x22b's shape") and "a guess" in routing.how
    tr = load_trace(routing.path)
    assert (tr.geometry.layers, tr.geometry.experts) == (preset.geometry.layers, preset.geometry.experts)
    assert resolve(get_preset("qwen3-30b-a3b"), None).path.name == "synthetic-qwen3-top8.npz"


@pytest.mark.parametrize("name", ["q4_k_m", "q8_0", "q3_k_m", "mxfp4", "int4", "bf16"])
def test_the_plan_simulates_experts_at_the_precision_it_plans(name):
    """A llama.cpp mix was priced at the nearest of bf16/fp16/int8/int4 (q4_k_m's 4.5-6.6 bits as
    int4's 4: Mixtral on one 4090 at 22.4 tok/s instead of 19.1); the simulator takes every name."""
    from casmoe.precision import parse_precision
    from casmoe.sim.questions.deploy.plan import sim_quant

    quant, note = sim_quant(parse_precision(name), get_preset("mixtral-8x7b"), ())
    assert (quant, note) == (name, None)


def test_a_script_of_a_configuration_that_does_not_fit_refuses_to_run(tmp_path):
    """The .sh of a best that does not fit (a concurrency no box holds) says so and exits 1
    before starting the engine; one that fits runs its command."""
    import subprocess

    make_plan(PlanRequest("qwen3-30b-a3b", BOX, engines=("llama.cpp",), concurrency=100000, requests=2, compare=False),
              tmp_path / "q")
    script = (tmp_path / "q" / "llama.cpp.sh").read_text()
    assert "# DOES NOT FIT this box: GPU 0: over by" in script
    proc = subprocess.run(["sh", str(tmp_path / "q" / "llama.cpp.sh")], capture_output=True, text=True)
    assert proc.returncode == 1 and "does not fit" in proc.stderr
    make_plan(PlanRequest("qwen3-30b-a3b", BOX, engines=("llama.cpp",), requests=2, compare=False), tmp_path / "f")
    assert "DOES NOT FIT" not in (tmp_path / "f" / "llama.cpp.sh").read_text()
