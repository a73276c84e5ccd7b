"""`casmoe calibrate measured` reads what llama.cpp users already have: llama-bench's output in each
of its formats and llama-server's timing lines (tests/data/llama-bench/, recorded from a real
build), each test a row of the published schema, the box and model given where the file says none."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from casmoe.sim.questions import measured_files as mf
from support import paths

DATA = paths.DATA / "llama-bench"
CPU_BOX = """name = "cpu"
description = "no GPU"
gpu = ""
gpus = 0
{gpu}
cpu = "2 cores"
cpu_cores = 2
layer_overhead_us = 0
expert_overhead_us = 0
cpu_tflops = 0.13
cpu_mem_bw_gbs = 11.0
host_ram_gib = 23.0
[sources]
{sources}
"""


@pytest.fixture
def cpu_box(tmp_path) -> str:
    from casmoe.sim.box.hardware import GPU_FIELDS

    gpu = "\n".join(f"{n} = 0" for n in GPU_FIELDS)
    names = (*GPU_FIELDS, "gpus", "cpu_tflops", "cpu_mem_bw_gbs", "host_ram_gib", "layer_overhead_us", "expert_overhead_us", "cpu_cores")
    path = tmp_path / "cpu.toml"
    path.write_text(CPU_BOX.format(gpu=gpu, sources="\n".join(f'{n} = "test"' for n in names)))
    return str(path)


@pytest.mark.parametrize("name, kind", [("bench.json", "json"), ("bench.jsonl", "jsonl"), ("bench.csv", "csv"),
                                        ("bench.md", "md"), ("server.log", "server")])
def test_each_format_is_told_by_its_text(name, kind) -> None:
    assert mf.kind_of((DATA / name).read_text(encoding="utf-8-sig")) == kind
    assert mf.is_engine_output(DATA / name)


@pytest.mark.parametrize("name", ["bench.json", "bench.jsonl", "bench.csv", "bench.md"])
def test_a_llama_bench_test_is_a_row(name, cpu_box) -> None:
    read = mf.read(DATA / name, mf.Context(cpu_box, "qwen3-30b-a3b"))
    by_metric = {r["metric"]: r for r in read.rows}
    assert set(by_metric) == {"prefill_tok_s", "decode_tok_s"}
    pp, tg = by_metric["prefill_tok_s"], by_metric["decode_tok_s"]
    assert pp["prompt_tokens"] == 8 and "prompt_tokens" not in tg
    assert pp["value"] > 0 and tg["value"] > 0
    threads = 2 if name in ("bench.json", "bench.md") else 1
    assert pp["run"] == {"model": "qwen3-30b-a3b", "hardware": cpu_box, "stack": "llama.cpp", "cpu_threads": threads,
                         "policy": "n-cpu-moe[n=48]", "global_capacity": "0"}  # no GPU: the host runs every part


def test_the_json_rates_are_the_files_own(cpu_box) -> None:
    import json

    tests = json.loads((DATA / "bench.json").read_text())
    read = mf.read(DATA / "bench.json", mf.Context(cpu_box, "qwen3-30b-a3b"))
    assert [r["value"] for r in read.rows] == [t["avg_ts"] for t in tests]


def test_placements_follow_the_flags_on_a_gpu_box() -> None:
    ctx = mf.Context("rtx4090x4@gpus=1", "qwen3-30b-a3b")
    path = Path("x.json")
    assert mf._placement({"n_gpu_layers": 99, "n_cpu_moe": 0}, "qwen3-30b-a3b", ctx, "t", path) == {
        "policy": "n-cpu-moe[n=0]", "global_capacity": str(48 * 128)}
    assert mf._placement({"n_gpu_layers": 99, "n_cpu_moe": 20}, "qwen3-30b-a3b", ctx, "t", path) == {
        "policy": "n-cpu-moe[n=20]", "global_capacity": str(28 * 128)}
    with pytest.raises(mf.MeasuredFileError, match="keeps whole layers off the GPU"):
        mf._placement({"n_gpu_layers": 20, "n_cpu_moe": 0}, "qwen3-30b-a3b", ctx, "t", path)
    with pytest.raises(mf.MeasuredFileError, match="-ngl 0 on a box with a GPU"):
        mf._placement({"n_gpu_layers": 0, "n_cpu_moe": 0}, "qwen3-30b-a3b", ctx, "t", path)


def test_server_timing_lines_are_a_prefill_and_a_decode_row_per_request(cpu_box) -> None:
    read = mf.read(DATA / "server.log", mf.Context(cpu_box, "qwen3-30b-a3b"))
    assert [r["id"] for r in read.rows] == ["request-1-prefill", "request-1-decode", "request-2-prefill",
                                            "request-2-decode"]
    assert read.rows[0]["prompt_tokens"] == 512 and math.isclose(read.rows[0]["value"], 512 / 0.8124)
    assert math.isclose(read.rows[1]["value"], 128 / 6.4031)
    assert any("every expert is taken to be" in n for n in read.notes)


def test_what_the_files_do_not_say_is_asked_for(tmp_path, cpu_box) -> None:
    with pytest.raises(mf.MeasuredFileError, match="give --model"):
        mf.read(DATA / "bench.md", mf.Context(cpu_box))  # the table names no file
    with pytest.raises(mf.MeasuredFileError, match="give --model"):
        mf.read(DATA / "server.log", mf.Context(cpu_box))
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")
    assert not mf.is_engine_output(junk)


def test_calibrate_reads_llama_bench_output_and_refuses_a_missing_box(tmp_path, cpu_box) -> None:
    from casmoe.sim.questions.calibration import CalibrationError, load_measured

    rows = load_measured(DATA / "bench.jsonl", mf.Context(cpu_box, "qwen3-30b-a3b"))
    assert {r.metric for r in rows} == {"prefill_tok_s", "decode_tok_s"}
    with pytest.raises(CalibrationError, match="give --hardware"):
        load_measured(DATA / "bench.jsonl")
    toml = tmp_path / "m.toml"
    toml.write_text('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "rtx4090x4", '
                    'policy = "lru", capacity = "4" }\n')
    with pytest.raises(CalibrationError, match="leave --hardware and --model out"):
        load_measured(toml, mf.Context(cpu_box, "qwen3-30b-a3b"))


def test_a_spreadsheets_byte_order_mark_and_a_row_written_twice(tmp_path) -> None:
    from casmoe.sim.questions.calibration import CalibrationError, load_measured

    csv = tmp_path / "m.csv"
    line = "mixtral-8x7b,rtx4090x4,lru,4"
    csv.write_text("\ufeffid,rate,model,hardware,policy,capacity\na,2.0," + line + "\n", encoding="utf-8")
    (row,) = load_measured(csv)
    assert row.id == "a"
    csv.write_text("\ufeffid,rate,model,hardware,policy,capacity\na,2.0," + line + "\nb,2.0," + line + "\n",
                   encoding="utf-8")
    with pytest.raises(CalibrationError, match="rows a and b are the same run"):
        load_measured(csv)
