"""`casmoe simulate`, `casmoe sweep` and `casmoe hardware list` end to end, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casmoe.policies import PolicySpec, PolicySpecError
from casmoe.options import CapacitySpec, OptionError
from casmoe.sim.run.grid import Grid, GridError
from casmoe.sim.run.runner import run_all
from casmoe.sim.run.spec import RunSpec, file_digest
from casmoe.trace_io import load_trace
from support.paths import REPO

TRACE = REPO / "traces" / "synthetic-mixtral.npz"

needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="shipped trace not generated")


def casmoe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`casmoe ARGS` as a user runs it: the shipped data, and the plots drawn as a user's are by
    default (in the background: the suite's `CASMOE_PLOTS=none` is dropped), unless `env` says."""
    full = {k: v for k, v in os.environ.items() if k != "CASMOE_PLOTS"}
    full.update({"CASMOE_DATA": str(REPO / "traces"), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "casmoe", *args], cwd=cwd, capture_output=True, text=True, env=full, timeout=600
    )


def png(path: Path, wait_s: float = 120.0) -> bytes:
    """The PNG at `path`, once the background plotter (`--plots background`, the default) has
    written it: each file appears whole (atomic), so its existence is its completion."""
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_bytes()


def _figures(x: object) -> object:
    """A record's figures to nine significant digits (a compiled kernel may round the last bit otherwise),
    without its run's key (which names the trace by path: a checkout elsewhere keys the same run anew)."""
    if isinstance(x, dict):
        return {k: _figures(v) for k, v in x.items() if k != "key"}
    if isinstance(x, list):
        return [_figures(v) for v in x]
    return float(f"{x:.9g}") if isinstance(x, float) else x


def check_report(out: Path, timeline: Path | None = None) -> list[dict]:
    import pandas as pd

    records = json.loads((out / "results.json").read_text())
    frame = pd.read_csv(out / "results.csv")
    assert len(frame) == sum("skipped" not in r for r in records) > 0
    assert {"policy", "decode_tokens_per_s", "token_latency_p99_s", "ttft_mean_s", "stall_demand_s"} <= set(frame)
    one = frame[frame["batch"] == 1]  # a batch-1 decode step is one token: rate x mean step time = 1
    assert ((one["decode_tokens_per_s"] * one["token_latency_mean_s"] - 1).abs() < 1e-9).all()
    for name in ("decode_vs_capacity.png", "stall_by_layer.png"):
        assert png(out / name)[:8] == b"\x89PNG\r\n\x1a\n"
    if timeline is not None:
        events = json.loads(timeline.read_text())["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        assert spans and all(e["dur"] >= 0 and {"pid", "tid", "ts", "name"} <= set(e) for e in spans)
        assert {e["tid"] for e in spans} == {0, 1}  # compute and link tracks
        names = {e["args"]["name"] for e in events if e["ph"] == "M"}
        assert {"compute", "h2d link"} <= names
    return records


@needs_trace
def test_simulate_small_writes_report_and_timeline(tmp_path):
    args = ["simulate", "--requests", "2", "--policy", "lru", "--policy", "casmoe[predictor=exact]"]
    args += ["--capacity", "2", "--capacity", "46GB", "--timeline", "tl.json", "--out", "rep"]
    proc = casmoe(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = check_report(tmp_path / "rep", tmp_path / "tl.json")
    assert {r["policy"] for r in records} == {"lru", "casmoe[predictor=exact]"}
    assert {r["capacity"] for r in records} == {"2/layer", "4/layer"}  # 46 GB holds 4 x 32 experts of 352 MB
    assert "casmoe[predictor=exact]" in proc.stdout


def _headline_checks(stdout: str, records: list[dict]) -> None:
    """Every cache size has a headline naming its fastest deployable method with its tok/s and
    its ratio to the best plain cache, then both priced on their runtimes' stacks; the table
    groups the policies by family, a legend says what each name is, and the last line says how
    to ask the same of one's own box."""
    from casmoe.report import sig
    from casmoe.summary import YOUR_BOX

    def fastest(rs: list[dict]) -> dict:
        return max(rs, key=lambda r: r["decode_tokens_per_s"])

    for cap in {r["capacity"] for r in records}:
        group = [r for r in records if r["capacity"] == cap]
        best = fastest([r for r in group if not r["oracle"]])
        plain = fastest([r for r in group if r["policy"] in ("lru", "lfu", "least-stale")])
        line = next(ln for ln in stdout.splitlines() if ln.strip().startswith(f"{cap} ("))
        speed, base = best["decode_tokens_per_s"], plain["decode_tokens_per_s"]
        assert f": {best['policy']} {sig(speed)} tok/s = {sig(speed / base)}x {plain['policy']} ({sig(base)})" in line
        ours, theirs = best["on_runtime"]["decode_tokens_per_s"], plain["on_runtime"]["decode_tokens_per_s"]
        assert f"; on their runtimes {sig(ours)} vs {sig(theirs)} = {sig(ours / theirs)}x" in line
        for r in group:  # the table cell of every policy
            assert sig(r["decode_tokens_per_s"]) in stdout
    for family in ("reactive caches", "prefetchers", "host-compute placements", "oracles"):
        assert f"│ {family} " in stdout
    legend = stdout[stdout.index("what each name is:"):].splitlines()
    for label in {r["policy"] + "*" * r["oracle"] for r in records}:
        assert any(ln.split() and ln.split()[0] == label and len(ln.split()) > 3 for ln in legend), label
    assert stdout.rstrip().endswith(YOUR_BOX)


def test_simulate_the_shipped_qwen3_synthetic_out_of_the_box(tmp_path):
    """traces/synthetic-qwen3.npz (fitted to the real Qwen3-30B-A3B trace) simulates with no
    --model: the preset of its shape, priced at the bytes its source recorded (Q4_K_M)."""
    trace = REPO / "traces" / "synthetic-qwen3.npz"
    args = ["simulate", "--trace", str(trace), "--hardware", "rtx4090x4", "--requests", "2"]
    proc = casmoe(*args, "--policy", "lru", "--policy", "belady", "--capacity", "6", "--capacity", "12", "--out", "rep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = check_report(tmp_path / "rep")
    assert {r["model"] for r in records} == {"qwen3-30b-a3b"} and {r["quant"] for r in records} == {"trace"}
    recorded = 6 * sum(load_trace(trace).geometry.layer_expert_bytes) / 1e9  # the source's Q4_K_M bytes
    assert all(r["capacity_gb"] == pytest.approx(recorded) for r in records if r["capacity_slots"] == 6)
    rate = {(r["policy"], r["capacity_slots"]): r["hit_rate"] for r in records}
    assert 0 < rate["lru", 6] < rate["lru", 12] < rate["belady", 12] < 1  # realistic routing: caches differ


@needs_trace
def test_simulate_with_no_arguments(tmp_path):
    """The README's main job exactly as written, `casmoe simulate` (~13 s of CPU, plus ~7-18 s
    once per trace content to fit CasMoE's planner into the user cache; tests/project/test_readme.py
    leaves it to this test): every policy at the sizes the box holds."""
    proc = casmoe("simulate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = check_report(tmp_path / "casmoe-sim")
    policies = {r["policy"] for r in records}
    assert {"ondemand", "lru", "semoe", "speculative", "moe-infinity", "n-cpu-moe", "ktransformers",
            "casmoe[planner=auto]", "casmoe[predictor=exact]", "casmoe[predictor=noisy]"} <= policies
    # static's and ktransformers' profiles, moe-infinity's collection and CasMoE's planner come
    # from the train split: only held-out requests are scored
    seen = ("the first 12 of the requests moe-infinity, static, ktransformers, fiddler, routed-placement, "
            "casmoe[planner=auto] never saw")
    assert f"tiny-mixtral.npz: 12 of 800 requests ({seen})" in proc.stdout
    assert {r["scored"] for r in records} == {f"12 of 800 requests ({seen})"}
    fitted = ("static", "moe-infinity", "ktransformers", "fiddler", "routed-placement", "casmoe[planner=auto]")
    assert not any(r["oracle"] for r in records if r["policy"] in fitted)
    assert "casmoe[planner=auto]: a planner fitted on the trace's 679 train requests" in proc.stdout
    assert "model mixtral-8x7b" in proc.stdout
    _headline_checks(proc.stdout, records)
    assert "e+0" not in proc.stdout  # three significant digits, never exponents
    # the README's and docs' figures of the main job are read from this file: they are what it answers now
    quoted = json.loads((REPO / "bench" / "readme-figures" / "simulate" / "results.json").read_text())
    stale = [(a["policy"], a["capacity"]) for a, b in zip(quoted, records, strict=True) if _figures(a) != _figures(b)]
    assert not stale, ("rerun: casmoe simulate --out bench/readme-figures/simulate --plots none; python "
                       f"bench/readme_figures.py; python bench/docs_figures.py --write (stale: {stale[:4]})")


@needs_trace
@pytest.mark.parametrize(
    "args,message",
    [
        (["--hardware", "nope"], "unknown hardware profile 'nope'"),
        (["--capacity", "-1", "--policy", "lru"], "bad capacity '-1'; give slots"),
        (["--model", "qwen3-30b-a3b"], "pass --model mixtral-8x7b"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--quant", "fp3"], "unknown --quant"),
        (["--miss-mode", "pray"], "unknown --miss-mode"),
        (["--arrival", "poisson"], "needs --rate"),
        (["--arrival", "burst", "--rate", "1"], "unknown --arrival"),
        (["--arrival", "trace"], "needs a trace with per-request arrival times"),
        (["--rate", "1", "--users", "2"], "not both"),
        (["--rate", "1", "--batch", "2"], "use --max-batch"),
        (["--rate", "1", "--schedule", "lifo"], "unknown --schedule"),
        (["--host-cache", "1", "--policy", "lru"], "fewer than the 2"),
        (["--host-cache", "4", "--host-policy", "belady", "--policy", "lru"], "reads the future"),
    ],
)
def test_clear_errors(args, message, tmp_path, monkeypatch, capsys):
    """In-process through the console entry point: exit status 2 and one line, no traceback."""
    from casmoe.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["casmoe", "simulate", "--requests", "1", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "Traceback" not in err, err


def test_profiles_lists_every_shipped_profile(tmp_path):
    proc = casmoe("hardware", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = {p["name"] for p in json.loads(proc.stdout)}
    assert {"rtx4090x4", "a100-80g", "h100-sxm", "h200-sxm", "rtx5090"} <= names


# ---- sweep ------------------------------------------------------------------------------------


def _points(tmp_path: Path, policies=("lru", "ondemand"), hardware=("rtx4090x4", "rtx5090")) -> list[RunSpec]:
    cfg = tmp_path / "grid.toml"
    cfg.write_text(
        f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = {json.dumps(list(hardware))}\n'
        f"policies = {json.dumps(list(policies))}\ncapacities = [2, 4]\nrequests = 1\n"
    )
    return Grid.from_toml(cfg).specs(strict=False).specs


@needs_trace
def test_sweep_resumes_and_matches_a_serial_run(tmp_path):
    points = _points(tmp_path)
    assert len(points) == 2 * 2 * 2
    first, computed = run_all(points[:3], tmp_path / "out", jobs=2)
    assert computed == 3
    records, computed = run_all(points, tmp_path / "out", jobs=2)
    assert computed == len(points) - 3  # the stored points were skipped
    assert records[:3] == first
    serial, _ = run_all(points, tmp_path / "serial", jobs=1)
    assert records == serial
    keys = {p.key for p in points}
    assert len(keys) == len(points)
    assert {p.stem for p in (tmp_path / "out" / "points").glob("*.json")} == keys


@needs_trace
def test_runs_in_one_block_share_one_pool_that_ends_with_it(tmp_path, monkeypatch):
    """A search's rounds run in one pool (`workers`): started for the first round that needs
    processes, reused by the next, terminated on leaving; a single point runs in this process."""
    import casmoe.sim.run.runner as runner

    points = _points(tmp_path)
    started = []
    real = runner._pool
    monkeypatch.setattr(runner, "_pool", lambda n: started.append(n) or real(n))
    with runner.workers(2):
        one, _ = run_all(points[:1], tmp_path / "out", jobs=2)
        assert started == []  # one run: no process to start
        first, _ = run_all(points[1:4], tmp_path / "out", jobs=2)
        second, _ = run_all(points[4:], tmp_path / "out", jobs=2)
        pool = runner._shared["pool"]
    assert started == [2] and runner._shared == {}
    with pytest.raises(ValueError, match="not running"):  # terminated with the block
        pool.apply(len, ([],))
    serial, _ = run_all(points, tmp_path / "serial", jobs=1)
    assert one + first + second == serial


@needs_trace
def test_sweep_cli_from_toml(tmp_path):
    _points(tmp_path, ("lru",), ("rtx5090",))
    proc = casmoe("sweep", "grid.toml", "--out", "sw", "--jobs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    check_report(tmp_path / "sw")
    again = casmoe("sweep", "grid.toml", "--out", "sw", "--jobs", "1", cwd=tmp_path)
    assert "0 computed now" in again.stdout


@needs_trace
def test_sweep_table_shows_every_varied_axis(tmp_path):
    _points(tmp_path, ("lru", "ondemand"), ("rtx4090x4", "rtx5090"))
    proc = casmoe("sweep", "grid.toml", "--out", "sw", "--jobs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout[proc.stdout.index("decode tokens/s by family, policy"):]
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert "hardware" in table and len(rows) == 4  # lru and ondemand on each box
    assert {ln.split("│")[3].strip() for ln in rows} == {"rtx4090x4", "rtx5090"}
    assert sum("2/layer" in ln and "rtx5090" in ln for ln in proc.stdout.splitlines()) == 1  # its headline


@needs_trace
@pytest.mark.slow
def test_sweep_on_local_ray(tmp_path):
    points = _points(tmp_path, ("lru",))[:2]
    records, computed = run_all(points, tmp_path / "ray", jobs=2, ray_address="local")
    assert computed == 2
    local, _ = run_all(points, tmp_path / "local", jobs=1)
    assert records == local


def test_specs_parse_and_reject():
    spec = PolicySpec.parse("casmoe[predictor=noisy, noise=0.5]")
    assert spec.name == "casmoe" and dict(spec.options) == {"predictor": "noisy", "noise": 0.5}
    assert spec.label == "casmoe[noise=0.5,predictor=noisy]"
    with pytest.raises(PolicySpecError):
        PolicySpec.parse("casmoe[predictor]")
    assert CapacitySpec("6GB").resolve([1_000_000_000] * 2).slots == 3
    assert CapacitySpec("6GB", per_layer=False).resolve([1_000_000_000] * 2).slots == 6
    with pytest.raises(OptionError):
        CapacitySpec("6 parsecs")


def test_bad_sweep_file_names_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('traces = ["x.npz"]\npolicys = ["lru"]\n')
    with pytest.raises(GridError, match="policys"):
        Grid.from_toml(cfg)
    import hashlib

    assert file_digest(cfg) == hashlib.sha256(cfg.read_bytes()).hexdigest()[:16]
    before = file_digest(cfg)
    cfg.write_text(cfg.read_text() + "\n")
    assert file_digest(cfg) != before  # an edited trace file is a new sweep point


@needs_trace
def test_simulate_serves_poisson_arrivals_with_latency_percentiles_and_plots(tmp_path):
    args = ["simulate", "--arrival", "poisson", "--rate", "0.2", "--requests", "6", "--policy", "lru",
            "--policy", "ondemand", "--capacity", "4", "--max-batch", "4", "--out", "rep", "--timeliness"]
    proc = casmoe(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = check_report(tmp_path / "rep")
    for r in records:
        assert r["arrival"] == "poisson" and r["rate"] == 0.2 and r["peak_batch"] <= 4
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] and 0 < r["tpot_p50_s"] <= r["tpot_p99_s"]
        assert r["e2e_p99_s"] >= r["ttft_p99_s"] and r["requests_per_s"] > 0
    by = {r["policy"]: r for r in records}
    assert by["ondemand"]["e2e_p50_s"] > by["lru"]["e2e_p50_s"]  # every layer loads: far slower
    for name in ("queue.png", "timeliness.png"):
        assert png(tmp_path / "rep" / name)[:4] == b"\x89PNG"
    assert "TTFT p99" in proc.stdout and "bandwidth-bound stall" in proc.stdout


@needs_trace
def test_closed_loop_users_and_a_ram_tier(tmp_path):
    args = ["simulate", "--users", "2", "--think", "1", "--requests", "4", "--policy", "lru", "--capacity", "4",
            "--host-cache", "200GB", "--out", "rep", "--json"]
    proc = casmoe(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads(proc.stdout)
    assert r["arrival"] == "closed" and r["users"] == 2 and r["host_misses"] > 0
    assert r["storage_bytes"] == r["host_misses"] * 352321536 and r["host_cache_gb"] > 190


@needs_trace
def test_sweep_over_rates_plots_latency_vs_load(tmp_path):
    args = ["sweep", "--requests", "4", "--policy", "lru", "--policy", "semoe", "--capacity", "4",
            "--rate", "0.1", "--rate", "1", "--rate", "10", "--jobs", "1", "--out", "sw"]
    proc = casmoe(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert sorted({r["rate"] for r in records}) == [0.1, 1.0, 10.0] and len(records) == 6
    lru = sorted((r for r in records if r["policy"] == "lru"), key=lambda r: r["rate"])
    assert lru[-1]["queue_wait_mean_s"] >= lru[0]["queue_wait_mean_s"]  # more load, more waiting
    assert png(tmp_path / "sw" / "latency_vs_load.png")[:4] == b"\x89PNG"


def test_sweep_file_takes_rates_and_serving_keys(tmp_path):
    (tmp_path / "g.toml").write_text(
        f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = ["rtx4090x4"]\npolicies = ["lru"]\n'
        'capacities = [4]\nrates = [0.5, 2]\nmax_batch = 2\nschedule = "chunked"\nchunk = 64\nhost_cache = "100GB"\n'
    )
    grid = Grid.from_toml(tmp_path / "g.toml")
    points = grid.specs().specs
    assert [p.traffic.rate for p in points] == [0.5, 2.0]
    assert all(p.traffic.max_batch == 2 and p.traffic.chunk == 64 for p in points)
    assert all(p.host_cache.nbytes([352321536] * 32) / 1e9 == pytest.approx(100, rel=0.01) for p in points)
    (tmp_path / "bad.toml").write_text((tmp_path / "g.toml").read_text().replace('"chunked"', '"fifo"'))
    with pytest.raises(Exception, match="unknown --schedule"):
        Grid.from_toml(tmp_path / "bad.toml").specs()


def test_sweep_points_carry_the_parsed_miss_mode(tmp_path):
    """" LOAD" in a sweep file is the miss mode "load": same point key as when written so."""
    body = (f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = ["rtx4090x4"]\npolicies = ["lru"]\n'
            'capacities = [4]\n')
    (tmp_path / "a.toml").write_text(body + 'miss_modes = [" LOAD"]\n')
    (tmp_path / "b.toml").write_text(body + 'miss_modes = ["load"]\n')
    a, b = (Grid.from_toml(tmp_path / f"{n}.toml").specs().specs for n in "ab")
    assert [p.miss_mode.value for p in a] == ["load"] and [p.key for p in a] == [p.key for p in b]


@needs_trace
def test_plots_in_the_background_wait_or_none(tmp_path):
    """The default draws the PNGs in a detached process and says so (a stale PNG of an earlier
    run is removed first, so an existing file is this run's); `--plots wait` (here as the
    default `CASMOE_PLOTS` sets) has them written when the command ends; `--plots none`, given
    over that default, draws nothing."""
    args = ["simulate", "--requests", "2", "--policy", "lru", "--capacity", "4", "--out", "rep"]
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "stall_by_layer.png").write_bytes(b"stale")
    proc = casmoe(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "being drawn in the background" in proc.stdout
    assert png(tmp_path / "rep" / "stall_by_layer.png")[:4] == b"\x89PNG"
    proc = casmoe(*args[:-1], "wait", cwd=tmp_path, env={"CASMOE_PLOTS": "wait"})
    assert proc.returncode == 0, proc.stderr
    assert "background" not in proc.stdout
    assert all((tmp_path / "wait" / n).read_bytes()[:4] == b"\x89PNG" for n in ("decode_vs_capacity.png", "timeliness.png"))
    proc = casmoe(*args[:-1], "none", "--plots", "none", cwd=tmp_path, env={"CASMOE_PLOTS": "wait"})
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / "none").glob("*.png")) and (tmp_path / "none" / "results.csv").exists()


def test_a_point_runs_after_the_trace_cache_let_its_trace_go(tmp_path):
    """The per-process caches of traces and step plans evict apart (in-process callers run many
    points): a plan whose trace object the trace cache has let go must still run its point."""
    import casmoe.sim.run.runner as run

    (tmp_path / "g.toml").write_text(f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = ["rtx4090x4"]\n'
                                     'policies = ["lru"]\ncapacities = [4]\nrequests = 2\n')
    (point,) = Grid.from_toml(tmp_path / "g.toml").specs().specs
    first = run.run(point)
    run.scored_trace.cache_clear()  # a new trace object for the same key; the plan cache keeps the old one
    assert run.run(point)["decode_tokens_per_s"] == first["decode_tokens_per_s"]
