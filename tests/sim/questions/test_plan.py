"""`casmoe plan` end to end: from the user's box and files to a command that runs.

A GGUF on the machine it runs on, detected; the one-4090 box's Qwen3-30B-A3B all on the GPU at a
4-bit quant; no command its engine cannot run; the printed figure is what the printed `casmoe
simulate` line and the best script's configuration give; every option changes the answer or is
refused in one line; --n-cpu-moe counts blocks as llama.cpp does; a dual-socket box is planned on
both nodes; two boxes of one file name get two folders; scripts run from anywhere and check the
engine's version; experts beyond host RAM are priced with the drive's reads, never lifted."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import assert_one_line, cli

from casmoe.presets import get_preset
from casmoe.shipped import shipped
from casmoe.sim.questions.deploy import PlanError, PlanRequest, make_plan
from casmoe.sim.questions.deploy import engines as eng
from support.paths import REPO

ROOT = REPO
BOX = str(ROOT / "examples" / "rtx4090-64g.toml")
ONE_4090 = "rtx4090x4@gpus=1,host_ram_gib=64"
QWEN = shipped("synthetic-qwen3-top8.npz")
FOUR_BIT = {"q4_k_m", "q4_k_s", "q4_0", "iq4_xs", "iq4_nl", "mxfp4_moe"}


def _check(plan) -> None:
    """Every candidate: its command parses with the engine's flags, its map never exceeds the box."""
    for c in plan.candidates():
        c.command.check()
        for step in c.prepare:
            step.check()
        if c.fits:
            assert all(g.used <= g.total for g in c.placement.memory.gpus)


def tiny_gguf(tmp_path: Path, kind: str = "qwen3moe") -> Path:
    pytest.importorskip("gguf")
    from support import gguf_files

    return getattr(gguf_files, kind)(tmp_path / f"tiny-{kind}.gguf")


# ------------------------------------------------------------------------------ the "done"
def test_a_gguf_on_this_box_with_no_hardware_is_planned_for_this_box(tmp_path, monkeypatch, capsys):
    """No --hardware: the machine it runs on, detected, each number marked read, measured or
    assumed, its profile written beside the plan; a box without a GPU runs llama.cpp on the CPU."""
    from casmoe.sim.box.detect import detect_profile

    model = tiny_gguf(tmp_path)
    code, out, err = cli(["plan", "--model", str(model), "--requests", "2", "--out", "p"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "this machine, detected (" in out and (tmp_path / "p" / "detected-box.toml").is_file()
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    fields = plan["detected_box"]["fields"]
    assert {f["field"] for f in fields} >= {"GPUs", "host RAM GiB", "CPU cores", "host memory GB/s"}
    assert all(f["how"] in ("read", "measured", "assumed") for f in fields)
    llama = next(e for e in plan["engines"] if e["engine"] == "llama.cpp")
    best = llama["best"]
    assert best["fits"] and best["speed"]["decode_tok_s"] > 0 and str(model) in best["argv"]
    if detect_profile().profile.gpus == 0:  # this machine: the host runs every part
        assert best["argv"][best["argv"].index("-ngl") + 1] == "0"
        assert all("needs a GPU" in e["refused"] for e in plan["engines"] if e["engine"] != "llama.cpp")


def test_qwen3_on_one_4090_is_all_on_the_gpu_at_a_4_bit_quant(tmp_path):
    plan = make_plan(PlanRequest("qwen3-30b-a3b", ONE_4090, ("llama.cpp",), requests=2, compare=False), tmp_path / "q")
    _check(plan)
    (llama,) = plan.engines
    best = llama.best
    assert best.placement.rule == "all" and best.precisions.gpu.name in FOUR_BIT
    assert best.command.value("-ngl") == "all" and not best.command.has("--n-cpu-moe") and not best.command.has("-ot")
    assert best.speed.decode > 0 and "llama.cpp stack" in best.speed.how
    rows = {r["precision"]: r for r in llama.precisions}
    assert {"q8_0", "q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m"} <= set(rows)
    assert rows["q3_k_m"]["at_floor"] == "no" and "Meta-Llama-3-8B" in rows["q4_k_m"]["quality"]
    assert "a dense model" in rows["q4_k_m"]["quality"]  # a dense model's figure is never passed off as this one's
    faster_below = [r for r in llama.precisions if r["at_floor"] == "no" and r["decode_tok_s"] > best.speed.decode]
    assert all(not r["chosen"] for r in faster_below)  # the floor, not speed alone, picks


def test_the_best_configuration_never_does_not_fit(tmp_path):
    """Mixtral-8x7B at bf16 on one 24 GiB card with 16 GiB of RAM: nothing fits, so nothing is best
    (it was printed as the best, with a command, beside DOES NOT FIT)."""
    plan = make_plan(PlanRequest("mixtral-8x7b", f"{BOX}@host_ram_gib=16", ("ktransformers",), precision="bf16",
                                 requests=2, compare=False), tmp_path / "m")
    (kt,) = plan.engines
    assert kt.best is None and "fits this box" in kt.why_none
    assert not (tmp_path / "m" / "ktransformers.sh").exists()
    assert "exit 1" in (tmp_path / "m" / "ktransformers-1.sh").read_text()


# ------------------------------------------------------------------------------ only what the engine runs
@pytest.mark.parametrize("argv, says", [
    (["--model", "gpt-oss-120b", "--engine", "ktransformers"], "#1472"),
    (["--model", "qwen3-30b-a3b", "--engine", "llama.cpp", "--precision", "fp8"], "no GGUF type"),
    (["--model", "qwen3-30b-a3b", "--engine", "llama.cpp", "--precision", "hqq4"], "no GGUF type"),
    (["--model", "qwen3-30b-a3b", "--engine", "vllm", "--precision", "q4_k_m"], "needs a checkpoint of its own"),
    (["--model", "switch-base-8", "--engine", "sglang"], "no sglang support"),
])
def test_an_engine_that_cannot_run_it_is_one_line_and_never_a_command(argv, says, tmp_path, monkeypatch, capsys):
    code, _, err = cli(["plan", "--hardware", ONE_4090, "--requests", "2", "--no-compare", "--out", "p", *argv], tmp_path,
                       monkeypatch, capsys)
    assert_one_line(code, err)
    assert says in err and not list((tmp_path / "p").glob("*.sh"))


def test_a_gguf_is_loaded_by_llama_cpp_only_and_an_old_split_expert_file_by_none(tmp_path):
    model = tiny_gguf(tmp_path)
    plan = make_plan(PlanRequest(str(model), BOX, requests=2, compare=False), tmp_path / "g")
    by = {e.engine: e for e in plan.engines}
    assert by["llama.cpp"].best is not None and by["llama.cpp"].best.command.value("-m") == str(model.resolve())
    for e in ("vllm", "sglang", "casmoe"):
        assert "Hugging Face checkpoints, not GGUF" in by[e].refused
    assert "KTransformers loads the model's GPU part" in by["ktransformers"].refused
    old = tiny_gguf(tmp_path, "mixtral_split")
    with pytest.raises(PlanError, match="b3990"):
        make_plan(PlanRequest(str(old), BOX, ("llama.cpp",), requests=2, compare=False), tmp_path / "s")


def test_every_path_a_command_loads_is_the_users_written_here_or_made_by_a_printed_step(tmp_path):
    """No placeholder: what a command names exists, is a file this plan wrote, or a step makes it;
    every script checks the engine's version first; the best is <engine>.sh, runners-up after it."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", ONE_4090, ("llama.cpp", "ktransformers"), precision="q8_0",
                                 requests=2, compare=False), tmp_path / "q")
    for e in plan.engines:
        for rank, c in enumerate(e.ranked()):
            made = {s.creates for s in c.prepare} | set(c.files)
            for flag in ("-m", "--model-path", "--kt-weight-path", "--init-expert-location"):
                if c.command.has(flag):
                    path = c.command.value(flag)
                    assert path in made or Path(path).is_absolute() and Path(path).exists(), (e.engine, flag, path)
            text = (tmp_path / "q" / f"{e.engine}{'' if rank == 0 else f'-{rank}'}.sh").read_text()
            assert c.command.text() in text and 'cd "$(dirname "$0")"' in text and "have=$(" in text
            assert c.reproduce and f"# reproduce the figure: {c.reproduce}" in text


# ------------------------------------------------------------------------------ one object: figure, line, script
def _simulate(line: str, tmp_path: Path, monkeypatch, capsys) -> float:
    argv = shlex.split(line)[2:]  # past "casmoe simulate"
    code, out, err = cli(["simulate", *argv, "--json", "--plots", "none", "--out", "replay"], tmp_path, monkeypatch,
                         capsys)
    assert code == 0, err
    (record,) = json.loads(out)
    return record["decode_tokens_per_s"]


def test_the_reproduce_line_gives_the_plans_figure(tmp_path, monkeypatch, capsys):
    """Every option (the stack, the context, the host precision included) is in the line: run as
    printed, it gives the figure printed beside it, for each engine's best and the comparison's rows."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", ONE_4090, ("llama.cpp", "ktransformers"), precision="q8_0",
                                 context=4096, requests=2), tmp_path / "q")
    for e in plan.engines:
        c = e.best
        assert "--stack" in c.reproduce and "--context 4096" in c.reproduce
        assert _simulate(c.reproduce, tmp_path, monkeypatch, capsys) == pytest.approx(c.speed.decode, rel=1e-9)
    comp = plan.comparison
    assert comp is not None and {r["stack"] for r in comp.rows} == {"llama.cpp", "ktransformers"}
    for row in comp.rows:
        assert _simulate(row["reproduce"], tmp_path, monkeypatch, capsys) == pytest.approx(row["decode_tok_s"],
                                                                                           rel=1e-3)


# ------------------------------------------------------------------------------ every option
BASE = ["plan", "--model", "qwen3-30b-a3b", "--hardware", BOX, "--engine", "llama.cpp", "--precision", "q6_k",
        "--requests", "2", "--no-compare", "--jobs", "1", "--json"]
HOW_IT_RUNS = {"out", "jobs", "ray", "ray_address", "as_json", "plots"}
"""Options that say where the plan goes and how its points run, not what it answers: --out (the
folder, walked below), --jobs / --ray / --ray-address (processes or a cluster), --json (the format),
--plots (when its pictures are drawn: `test_the_plan_draws_its_pictures_as_plots_asks`)."""
CHANGES = {
    "model": ["--model", "mixtral-8x7b"],
    "engine": ["--engine", "casmoe"],
    "context": ["--context", "16384"],
    "concurrency": ["--concurrency", "2"],
    "trace": ["--trace", str(shipped("synthetic-qwen3.npz"))],
    "precision": ["--precision", "q8_0"],
    "host_precision": ["--gpu-precision", "q6_k", "--host-precision", "q4_k_m"],  # in place of --precision q6_k
    "gpu_memory": ["--gpu-memory", "16"],
    "threads": ["--threads", "4"],
    "weights": ["--weights", "Qwen/Qwen3-30B-A3B-Base"],
    "requests": ["--requests", "3"],
    "compare": ["--compare"],
    "stack": ["--stack", "ideal"],
    "hardware": ["--hardware", ONE_4090],
    "gpus": ["--gpus", "2"],
    "link": ["--link", "pcie3"],
    "host_ram": ["--host-ram", "24"],
}
"""Each option, and a value that must change the plan's answer from BASE's (the precisions' in place
of BASE's --precision)."""
OWN_PRECISION = {"precision", "host_precision"}
REFUSED = {
    "gpu_precision": (["--gpu-precision", "q8_0"], "not both"),  # beside --precision
    "quality_floor": (["--quality-floor", "q8_0"], "--quality-floor chooses among"),  # beside --precision
}
"""Options BASE makes meaningless, refused in one line (with what to change)."""


ECHO = {"hardware", "simulated_now", "reproduce", "key", "evidence", "trace", "routing", "notes", "published"}
"""What a plan echoes of the request or says of its own bookkeeping: not its answer."""


def _answer(out: str) -> object:
    """The plan's answer: its configurations, commands, maps and figures, without the echoes."""
    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ECHO}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(json.loads(out))


def test_the_plan_draws_its_pictures_as_plots_asks(tmp_path, monkeypatch, capsys):
    """In the background by default (the command says so and does not wait), before it ends
    with wait, not at all with none; a repeated plan does not draw what it drew before."""
    monkeypatch.delenv("CASMOE_PLOTS")  # the suite's default is none: a user's is background
    argv = [a for a in BASE if a != "--json"]
    pictures = ("plan_memory.png", "plan_speed.png")
    code, out, err = cli([*argv, "--out", "bg"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "plan_memory.png, plan_speed.png appear in bg when done" in out, err
    deadline = time.monotonic() + 120
    while not all((tmp_path / "bg" / n).exists() for n in pictures) and time.monotonic() < deadline:
        time.sleep(0.1)  # each file appears whole
    assert all((tmp_path / "bg" / n).read_bytes()[:4] == b"\x89PNG" for n in pictures)
    code, out, err = cli([*argv, "--plots", "wait", "--out", "now"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "background" not in out, err
    drawn = {n: (tmp_path / "now" / n).stat().st_mtime_ns for n in pictures}
    code, out, err = cli([*argv, "--out", "now"], tmp_path, monkeypatch, capsys)  # the same plan again
    assert code == 0 and "background" not in out, err
    assert {n: (tmp_path / "now" / n).stat().st_mtime_ns for n in pictures} == drawn
    code, out, err = cli([*argv, "--plots", "none", "--out", "none"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "background" not in out and (tmp_path / "none" / "plan.json").exists(), err
    assert not list((tmp_path / "none").glob("*.png"))


def test_every_option_plan_accepts_changes_its_answer_or_is_refused(tmp_path, monkeypatch, capsys):
    import typer

    from casmoe.cli import app

    command = typer.main.get_command(app).commands["plan"]
    options = {p.name for p in command.params}
    assert options == set(CHANGES) | set(REFUSED) | HOW_IT_RUNS, "a new option of plan: say what it changes"
    code, base, err = cli([*BASE, "--out", "base"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    base = _answer(base)
    for name, extra in CHANGES.items():
        argv = [a for a in BASE if a not in ("--precision", "q6_k")] if name in OWN_PRECISION else list(BASE)
        if extra[0] in argv and name != "engine":  # a value in place of BASE's (one model, one box)
            argv[argv.index(extra[0]) + 1:argv.index(extra[0]) + 2], extra = extra[1:2], extra[2:]
        code, out, err = cli([*argv, *extra, "--out", name], tmp_path, monkeypatch, capsys)
        assert code == 0, (name, err)
        assert _answer(out) != base, f"--{name.replace('_', '-')} changed nothing"
    for name, (extra, says) in REFUSED.items():
        code, _, err = cli([*BASE, *extra, "--out", name], tmp_path, monkeypatch, capsys)
        assert_one_line(code, err)
        assert says in err, name
    code, out, err = cli([a for a in BASE if a not in ("--precision", "q6_k")] + ["--quality-floor", "q8_0", "--out",
                                                                               "floor"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["engines"][0]["best"]["precision"].startswith("experts q8_0")  # the floor picks


@pytest.mark.parametrize("argv, message", [
    (["--model", "qwen3-30b-a3b", "--engine", "tensorrt"], "unknown engine 'tensorrt'"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "qwen3-30b-a3b", "--gpu-memory", "24", "--gpu-memory", "12"], "--gpu-memory gives 2 GPUs"),
    (["--model", "qwen3-30b-a3b", "--trace", "missing.npz"], "trace missing.npz not found"),
    (["--model", "gpt-oss-120b", "--trace", str(QWEN)], "has 48 MoE layers x 128 experts"),
    (["--model", "qwen3-30b-a3b", "--precision", "q5x"], "unknown precision 'q5x'"),
    (["--model", "qwen3-30b-a3b", "--context", "100"], "below the longest request"),
    (["--model", "qwen3-30b-a3b", "--stack", "ideal"], "give --engine too"),
    (["--model", "qwen3-30b-a3b", "--quality-floor", "q9"], "no published quality figure"),
    (["--model", "qwen3-30b-a3b", "--cpu-threads", "4"], "No such option"),
])
def test_bad_input_is_one_line(argv, message, tmp_path, monkeypatch, capsys):
    code, _, err = cli(["plan", "--hardware", BOX, *argv], tmp_path, monkeypatch, capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert message in err and "Traceback" not in err and len([ln for ln in lines if "rror" in ln]) == 1


# ------------------------------------------------------------------------------ the engine's own terms
def test_n_cpu_moe_counts_blocks_dense_ones_included(tmp_path):
    """DeepSeek-V2-Lite's first block is dense: --n-cpu-moe N keeps blocks 0..N-1's experts on the
    host, i.e. MoE layers 0..N-2, which must be the map's host layers (it once printed 7 for 7)."""
    p = get_preset("deepseek-v2-lite")
    plan = make_plan(PlanRequest("deepseek-v2-lite", f"{BOX}@host_ram_gib=128", ("llama.cpp",), precision="bf16",
                                 gpu_memory=(16.0,), requests=2, compare=False), tmp_path / "d")
    c = next(c for c in plan.candidates() if c.command.has("--n-cpu-moe"))
    n = int(c.command.value("--n-cpu-moe"))
    overrides = [(rf"blk\.{i}{eng.FFN_EXPS}", "CPU") for i in range(n)]  # what llama.cpp does with it
    on_host = [layer for layer in range(p.geometry.layers)
               if eng.override_target(overrides, f"blk.{p.dense_layers + layer}.ffn_down_exps.weight") == "CPU"]
    assert on_host == c.placement.host_layers(p.geometry.layers) and n == p.dense_layers + len(on_host)


def test_a_dual_socket_box_is_planned_on_both_numa_nodes(tmp_path):
    plan = make_plan(PlanRequest("qwen3-30b-a3b", ONE_4090, ("llama.cpp", "ktransformers"), precision="q8_0",
                                 requests=2, compare=False), tmp_path / "n")
    by = {e.engine: e.best for e in plan.engines}
    assert plan.box.numa_nodes == 2  # '2x Intel Xeon Gold 6330'
    assert by["llama.cpp"].command.value("--numa") == "distribute"
    assert by["ktransformers"].command.value("--kt-threadpool-count") == "2"


def test_two_hardware_files_of_one_name_get_two_folders(tmp_path, monkeypatch, capsys):
    for folder, ram in (("a", 64), ("b", 32)):
        (tmp_path / folder).mkdir()
        text = Path(BOX).read_text().replace("host_ram_gib = 64.0", f"host_ram_gib = {ram}.0")
        (tmp_path / folder / "box.toml").write_text(text)
    code, _, err = cli(["plan", "--model", "qwen3-30b-a3b", "--hardware", "a/box.toml", "--hardware", "b/box.toml",
                          "--engine", "llama.cpp", "--precision", "q8_0", "--requests", "2", "--no-compare", "--out",
                          "p", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    plans = list((tmp_path / "p").glob("*/plan.json"))
    assert len(plans) == 2
    assert {json.loads(p.read_text())["box"]["host_ram_gib"] for p in plans} == {64.0, 32.0}


# ------------------------------------------------------------------------------ scripts and limits
def test_the_best_script_runs_from_anywhere_and_checks_the_engines_version(tmp_path):
    """llama.cpp.sh cds to its folder, refuses a build older than its flags need, and starts the
    configuration planned (a stand-in llama-server on PATH records what it was given)."""
    model = tiny_gguf(tmp_path)
    plan = make_plan(PlanRequest(str(model), BOX, ("llama.cpp",), requests=2, compare=False), tmp_path / "g")
    best = plan.engines[0].best
    fake = tmp_path / "bin"
    fake.mkdir()
    for build in (8914, 5000):
        (fake / "llama-server").write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "version: {build} (x)" >&2; '
                                           f'exit 0; fi\necho "$PWD $*" > {tmp_path}/called\n')
        (fake / "llama-server").chmod(0o755)
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
        proc = subprocess.run(["sh", str(tmp_path / "g" / "llama.cpp.sh")], cwd="/", env=env, capture_output=True,
                              text=True)
        if build >= int(best.minimum or 0):
            assert proc.returncode == 0, proc.stderr
            called = (tmp_path / "called").read_text()
            assert called.startswith(str(tmp_path / "g")) and " ".join(best.command.argv()[1:]) in called
        else:
            assert proc.returncode == 1 and f"needs llama.cpp b{best.minimum} or newer" in proc.stderr


def test_experts_beyond_host_ram_are_priced_with_the_drives_reads(tmp_path):
    """A 12 GiB-RAM box under Qwen3 at Q8_0: llama.cpp memory-maps the model, so what RAM does not
    hold is read from the drive; priced so (a RAM tier over the storage), not by lifting the limit."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", f"{BOX}@host_ram_gib=12", ("llama.cpp",), precision="q8_0",
                                 requests=2, compare=False), tmp_path / "r")
    best = plan.engines[0].best
    assert any(n.startswith("host RAM: over by") for n in best.placement.memory.notes)
    assert "--allow-overcommit" not in best.reproduce and any("RAM tier" in n for n in best.notes)
    record = json.loads((tmp_path / "r" / best.speed.evidence).read_text())
    assert record["host_cache_gb"] > 0


def test_a_box_without_a_gpu_or_a_drive_rate_says_what_to_add(tmp_path):
    """A CPU-only box whose RAM is smaller than the model and whose profile states no drive: llama.cpp
    would read the rest from the drive, which nothing prices; said in the plan's terms (the field to
    add), no traceback, no command."""
    from casmoe.sim.box.hardware import GPU_FIELDS, load_profile

    cpu = load_profile(BOX).with_values({}, name="cpu-box", gpus=0, storage_read_gbs=0.0, storage_latency_us=0.0,
                                        **{f: 0 for f in GPU_FIELDS})
    path = cpu.write(tmp_path / "cpu-box.toml")
    plan = make_plan(PlanRequest("qwen3-30b-a3b", f"{path}@host_ram_gib=16", ("llama.cpp",), precision="q4_k_m",
                                 requests=2, compare=False), tmp_path / "c")
    (llama,) = plan.engines
    assert llama.best is None and "storage_read_gbs" in llama.why_none and "cpu-box.toml" in llama.why_none
    assert all(c.command.value("-ngl") == "0" for c in llama.others)


def test_a_script_of_a_configuration_that_does_not_fit_refuses_to_run(tmp_path):
    """A concurrency no box holds: nothing is best, each script says it does not fit and exits 1
    before starting the engine."""
    plan = make_plan(PlanRequest("qwen3-30b-a3b", BOX, engines=("llama.cpp",), precision="q4_k_m", concurrency=100000,
                                 requests=2, compare=False), tmp_path / "q")
    assert plan.engines[0].best is None
    script = (tmp_path / "q" / "llama.cpp-1.sh").read_text()
    assert "# DOES NOT FIT this box: GPU 0: over by" in script
    proc = subprocess.run(["sh", str(tmp_path / "q" / "llama.cpp-1.sh")], capture_output=True, text=True)
    assert proc.returncode == 1 and "does not fit" in proc.stderr


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


def test_a_shape_without_any_routing_gets_a_generated_one_and_says_so():
    from casmoe.sim.questions.deploy.routing import resolve
    from casmoe.trace_io import load_trace

    preset = get_preset("mixtral-8x22b")
    routing = resolve(preset, None)
    assert routing.how.startswith("GENERATED routing of mixtral-8x22b's shape") and "a guess" in routing.how
    tr = load_trace(routing.path)
    assert (tr.geometry.layers, tr.geometry.experts) == (preset.geometry.layers, preset.geometry.experts)
    assert resolve(get_preset("qwen3-30b-a3b"), None).path.name == "synthetic-qwen3-top8.npz"
    assert resolve(get_preset("gpt-oss-120b"), None).path.name == "synthetic-gpt-oss-120b-top4.npz"


# ------------------------------------------------------------------------------ real files, real widths
GGUF_DIR = Path("/work/llama/gguf")


@pytest.mark.slow
@pytest.mark.skipif(not GGUF_DIR.is_dir(), reason="no real GGUF files here")
@pytest.mark.parametrize("name", ["qwen3-30b-a3b-3L-Q4_K_M.gguf", "gpt-oss-20b-2L-MXFP4_MOE.gguf",
                                  "deepseek-v2-lite-4L-Q8_0.gguf", "mixtral-8x7b-2L-Q4_0.gguf"])
def test_a_real_gguf_is_planned_on_a_4090_and_on_this_box(name, tmp_path):
    path = GGUF_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    for hardware in (BOX, None):
        req = PlanRequest(str(path), hardware or _this_box(tmp_path), ("llama.cpp",), requests=2, compare=False)
        plan = make_plan(req, tmp_path / (hardware and "gpu" or "cpu"))
        _check(plan)
        best = plan.engines[0].best
        assert best is not None and best.command.value("-m") == str(path) and best.speed.decode > 0


def _this_box(tmp_path: Path) -> str:
    from casmoe.sim.box.detect import detect_profile

    path = tmp_path / "this.toml"
    detect_profile(measure=False).profile.write(path)
    return str(path)


@pytest.mark.slow
def test_a_cold_plan_of_gpt_oss_120b_takes_under_30_s_and_a_warm_one_under_5(tmp_path):
    import time

    env = {**os.environ, "CASMOE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    import sys

    argv = [sys.executable, "-m", "casmoe", "plan", "--model", "gpt-oss-120b", "--hardware", ONE_4090, "--out", str(tmp_path / "p")]
    times = []
    for _ in range(2):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
    assert times[0] < 30 and times[1] < 5, times


# ------------------------------------------------------------------------------ the figures the docs quote
def _quoted(plan: dict) -> list[tuple]:
    """What docs/plan.md and the pictures read of a plan: each engine's configurations and their speeds."""
    rows = []
    for e in plan["engines"]:
        for c in [e["best"], *e["runners_up"]] if e["best"] else []:
            s = c["speed"]
            rows.append((e["engine"], c["label"], c["precision"], round(s["decode_tok_s"], 3),
                         round(s["prefill_tok_s"] or 0.0, 3)))
    return rows


def test_the_plan_the_docs_quote_is_what_plan_answers_now(tmp_path, monkeypatch, capsys):
    """bench/readme-figures/plan/plan.json (docs/plan.md's figures, the README's plan pictures) is the plan
    of the README's box as the code makes it now: a change to the model that moves it fails here."""
    code, out, err = cli(["plan", "--model", "qwen3-30b-a3b", "--hardware", ONE_4090, "--out", "p", "--json",
                          "--jobs", "1"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    quoted = json.loads((REPO / "bench" / "readme-figures" / "plan" / "plan.json").read_text())
    assert _quoted(json.loads(out)) == _quoted(quoted), (
        "rerun: casmoe plan --model qwen3-30b-a3b --hardware rtx4090x4@gpus=1,host_ram_gib=64 --out P, copy "
        "P/plan.json to bench/readme-figures/plan/, python bench/readme_figures.py; python bench/docs_figures.py --write")
