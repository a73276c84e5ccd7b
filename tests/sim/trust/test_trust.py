"""Answers a user can trust: no what-if reports a number its inputs no longer
produce, no oracle or fitted-on-the-test-set comparison unmarked, a box simulated with the
memory it has, API misuse refused. Errors are one line on stderr with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import casmoe.sim
from support.builders import shaped_preset, sim_run
from casmoe.cache import CacheConfigError, Capacity
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.planner.fitdata import FitData
from casmoe.planner.patterns import expert_patterns, normalise
from casmoe.policies import POLICIES, PolicySpec, parse_policies
from casmoe.policies.lru import LRU
from casmoe.replay import replay
from casmoe.selection import Selection, SelectionError, split_indices
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine, SimConfigError
from casmoe.sim.box.hardware import load_profile, profile_paths
from casmoe.sim.run.grid import Grid, GridError
from casmoe.sim.run.runner import run_all
from casmoe.sim.run.spec import policy_inputs
from casmoe.trace import Request, Trace, TraceError
from casmoe.trace_io import load_trace, save_trace
from support.paths import REPO

SHIPPED = REPO / "traces" / "tiny-mixtral.npz"
SYNTH = REPO / "traces" / "synthetic-mixtral.npz"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CASMOE_DATA": str(REPO / "traces")}
    return subprocess.run([sys.executable, "-m", "casmoe", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=600)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("casmoe: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """10 requests, 2 of them held out (every fifth), with prompts and two tasks."""
    g = Geometry(4, 8, 2, hidden=64, intermediate=32, layer_expert_bytes=(1_000_000,) * 4)
    rng = np.random.default_rng(5)
    reqs = []
    for i in range(10):
        topk = np.stack([[rng.choice(8, 2, replace=False) for _ in range(4)] for _ in range(12)]).astype(np.int16)
        reqs.append(Request(topk, np.full(topk.shape, 0.5, np.float32), 4, prompt=f"prompt {i}", task="ab"[i % 2]))
    path = tmp_path_factory.mktemp("trust") / "small.npz"
    save_trace(Trace(g, reqs, {"source": "test"}), path)
    return path


def box(tmp: Path, name: str = "box", **changes: float) -> Path:
    """A copy of the rtx4090x4 profile with `changes` (the TOML a user edits)."""
    text = profile_paths()["rtx4090x4"].read_text()
    for key, value in changes.items():
        lines = [ln for ln in text.splitlines() if ln.startswith(f"{key} =")]
        assert lines, key
        text = text.replace(lines[0], f"{key} = {value}", 1)
    text = text.replace('name = "rtx4090x4"', f'name = "{name}"', 1)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


# ---- stale sweep points ----------------------------------------------------------------------------


def _specs(trace: Path, hardware: str, policies: list[str], **kw) -> list:
    """The first 2 requests of `trace` (a Mixtral-shaped one) at 2 slots per layer."""
    grid = Grid.of({"trace": str(trace), "model": "mixtral-8x7b", "hardware": hardware, "policy": policies,
                    "capacity": "2", "requests": 2, "split": "all", **kw})
    return grid.specs(strict=False).specs


def test_an_edited_profile_recomputes_its_points(tmp_path):
    hw = box(tmp_path, h2d_pinned_gbs=24.0)
    out = tmp_path / "sweep"
    first, computed = run_all(_specs(SHIPPED, str(hw), ["lru"]), out)
    assert computed == 1 and "skipped" not in first[0]
    again, computed = run_all(_specs(SHIPPED, str(hw), ["lru"]), out)
    assert computed == 0 and again == first
    box(tmp_path, h2d_pinned_gbs=2.4)  # the same path, another link
    slow, computed = run_all(_specs(SHIPPED, str(hw), ["lru"]), out)
    assert computed == 1
    assert slow[0]["decode_tokens_per_s"] < first[0]["decode_tokens_per_s"] / 2


def test_a_resumed_leaderboard_recomputes_what_an_edited_profile_changes(tmp_path):
    """The leaderboard once stored its points without the profile's content, so a
    resumed run reused results of the box as it was. Its runs are keyed like every command's now."""
    hw = box(tmp_path, h2d_pinned_gbs=24.0)
    out = tmp_path / "board"
    args = ["leaderboard", "--trace", str(SHIPPED), "--hardware", str(hw), "--requests", "2", "--jobs", "1",
            "--no-fit-planner", "--out", str(out)]
    first = cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "computed now" in first.stdout
    ran = lambda: {r["key"]: r for r in json.loads((out / "results.json").read_text()) if "skipped" not in r}  # noqa: E731
    before = ran()
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "(0 computed now)" in again.stdout
    box(tmp_path, h2d_pinned_gbs=2.4)  # the same file, a slower link
    edited = cli(*args, cwd=tmp_path)
    assert edited.returncode == 0 and f"({len(before)} computed now)" in edited.stdout
    after = ran()
    assert after.keys().isdisjoint(before)  # keys are content: the edit made new ones
    lru = [r for r in after.values() if r["policy"] == "lru"]
    assert lru and all(r["hardware"] == "box" for r in lru)
    was = {r["capacity"]: r["decode_tokens_per_s"] for r in before.values() if r["policy"] == "lru"}
    assert any(r["decode_tokens_per_s"] < was[r["capacity"]] for r in lru)  # a tenth of the link: LRU waits longer


def test_a_user_policy_edit_and_a_new_profile_file_change_the_key(tmp_path, monkeypatch):
    pkg = tmp_path / "mine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("SLOTS = 1\n")
    (pkg / "pol.py").write_text("from casmoe.policies.lru import LRU\n\nclass Mine(LRU):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    key = lambda policy: _specs(SHIPPED, "rtx4090x4", [policy])[0].key  # noqa: E731
    before = key("mine.pol:Mine")
    assert key("mine.pol:Mine") == before
    (pkg / "helper.py").write_text("SLOTS = 2\n")  # a module of its package, not the policy's own
    assert key("mine.pol:Mine") != before
    profile = tmp_path / "profile.npz"
    spec = PolicySpec.parse(f"static[profile={profile}]")
    with pytest.raises(CasmoeError, match="no such file"):  # refused before any point runs
        _specs(SHIPPED, "rtx4090x4", [spec.label])
    missing = policy_inputs(spec)
    save_trace(load_trace(SHIPPED).subset(range(3)), profile)  # the file appears: another input
    present = key(spec.label)
    assert policy_inputs(spec) != missing
    save_trace(load_trace(SHIPPED).subset(range(4)), profile)  # and its content changes
    assert key(spec.label) != present


def test_a_stored_point_that_is_not_a_record_is_recomputed(tmp_path):
    specs = _specs(SHIPPED, "rtx4090x4", ["lru"])
    stored = tmp_path / "sweep" / "points" / f"{specs[0].key}.json"
    stored.parent.mkdir(parents=True)
    for garbage in (b"{}", b"[]", b'{"key": "x"}', b"\xff\xfe", json.dumps({"key": specs[0].key, "skipped": 3}).encode()):
        stored.write_bytes(garbage)
        records, computed = run_all(specs, tmp_path / "sweep")
        assert computed == 1 and records[0]["decode_tokens_per_s"] > 0


def test_two_runs_into_one_folder_at_once_are_refused(tmp_path):
    from casmoe.sim.run.runner import RunStoreError, one_writer

    with one_writer(tmp_path):
        with pytest.raises(RunStoreError, match="being written by another casmoe run"):
            run_all(_specs(SHIPPED, "rtx4090x4", ["lru"]), tmp_path)
    records, computed = run_all(_specs(SHIPPED, "rtx4090x4", ["lru"]), tmp_path)  # free again
    assert computed == 1


def test_grid_values_that_are_no_what_if_are_refused_and_duplicates_run_once(small, tmp_path):
    for text, message in (("requests = -1", "requests must be >= 0"), ("batch = [0]", "batch must be >= 1"),
                          ("devices = -2", "devices must be >= 0")):
        toml = tmp_path / "g.toml"
        toml.write_text(f'traces = ["{small}"]\nmodels = ["mixtral-8x7b"]\nhardware = ["rtx4090x4"]\n'
                        f'policies = ["lru"]\ncapacities = [2]\n{text}\n')
        with pytest.raises(GridError, match=message):
            Grid.from_toml(toml)
    specs = _specs(SHIPPED, "rtx4090x4", ["lru", "lru", "lfu"], capacity=["2", "2"])
    assert [s.policy.label for s in specs] == ["lru", "lfu"]


# ---- oracles and fitted policies --------------------------------------------------------------------


def test_static_without_a_profile_is_profiled_on_the_train_split_and_scored_on_the_rest():
    whole = load_trace(SHIPPED)
    specs = parse_policies(["lru", "static"], POLICIES)
    scored = Selection().resolve(whole, specs)
    heldout = split_indices(whole, "heldout")
    assert scored.indices == tuple(heldout) and scored.starred == () and len(heldout) == 121
    assert "static never saw" in scored.describe()
    everything = Selection("all").resolve(whole, specs)
    assert everything.starred == ("static",)  # the train split is among the scored requests
    bound = specs[1].bound(whole)["profile"]
    assert len(bound.requests) == 800 - 121
    without_static = Selection().resolve(whole, specs[:1])
    assert without_static.everything


def test_the_main_headline_never_calls_an_oracle_the_fastest_deployable():
    res = casmoe.sim.simulate(policies=["lfu", "static", "belady"], capacities=[4], requests=4)
    line = res.headline().splitlines()[0]
    winner, bound = line.split(": ", 1)[1].split("; bound: ")
    assert bound.startswith("belady* ") and "*" not in winner
    static = next(r for r in res.records if r["policy"] == "static")
    assert not static["oracle"] and "static never saw" in static["scored"]
    starred = casmoe.sim.simulate(policies=["lfu", "static"], capacities=[4], requests=4, split="train")
    assert next(r for r in starred.records if r["policy"] == "static")["oracle"]


def _planner_folder(trace: Trace, fitted: list[int], folder: Path) -> Path:
    """The parts of a planner folder that say what it saw: planner.json and fit.npz (FitData),
    written as a planner writes its folder (casmoe/folder.py: a manifest, all at once)."""
    from casmoe.folder import write_folder
    from casmoe.planner.planner import FORMAT, META, VERSION

    part = trace.subset(fitted)
    fit = FitData.of(trace, part, normalise(expert_patterns(part)))
    with write_folder(folder, FORMAT, marker=META) as tmp:
        fit.save(tmp)
        meta = {"format": FORMAT, "version": VERSION, "geometry": trace.geometry.to_dict(), "fit": fit.to_dict()}
        (tmp / META).write_text(json.dumps(meta))
    return folder


def test_a_planner_is_scored_only_on_prompts_it_was_not_fitted_on(small, tmp_path):
    whole = load_trace(small)
    folder = _planner_folder(whole, [0, 1, 2, 3, 5, 6], tmp_path / "planner")
    spec = PolicySpec.parse(f"casmoe[planner={folder}]")
    assert spec.fitted_requests(whole) == {0, 1, 2, 3, 5, 6}
    scored = Selection().resolve(whole, [spec, PolicySpec("lru")])
    assert scored.indices == (4, 7, 8, 9) and scored.starred == ()
    assert Selection("all").resolve(whole, [spec]).starred == (spec.label,)
    assert Selection("train").resolve(whole, [spec]).starred == (spec.label,)


def test_a_selection_by_split_task_and_range():
    whole = load_trace(SYNTH)
    tasks = sorted({r.task for r in whole.requests})
    sel = Selection.of("all", [tasks[0]], "10:60", 5).resolve(whole)
    assert len(sel.indices) == 5 and all(10 <= i < 60 and whole.requests[i].task == tasks[0] for i in sel.indices)
    with pytest.raises(SelectionError, match="no request of task 'nope'"):
        Selection.of("all", ["nope"]).resolve(whole)
    with pytest.raises(SelectionError, match="bad --range"):
        Selection.of(span="a:b")
    with pytest.raises(SelectionError, match="unknown --split"):
        Selection.of("test")


def test_replay_split_flag(small, tmp_path):
    proc = cli("replay", "--trace", str(small), "--policy", "lru", "--policy", "static", "--capacity", "2",
               "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert {r["policy"]: r["oracle"] for r in records} == {"lru": False, "static": False}
    proc = cli("replay", "--trace", str(small), "--policy", "static", "--capacity", "2", "--split", "all", "--json",
               cwd=tmp_path)
    assert json.loads(proc.stdout)[0]["oracle"] is True
    one_line_error(cli("replay", "--trace", str(small), "--split", "test", cwd=tmp_path), "unknown --split")


# ---- the box's memory ----------------------------------------------------------------------------


def test_capacities_and_devices_the_box_lacks_are_refused_unless_overcommitted(tmp_path):
    lru = {"policy": "lru"}
    Grid.of({**lru, "capacity": "78.9GB"}).specs()  # 7 per layer: what 4 GPUs hold
    with pytest.raises(CasmoeError, match="experts per layer, but rtx4090x4 x1 holds 1 beside"):
        Grid.of({**lru, "capacity": "78.9GB", "devices": 1}).specs()
    with pytest.raises(CasmoeError, match="has 4 GPUs"):
        Grid.of({**lru, "capacity": "4", "devices": 5}).specs()
    runs = Grid.of({**lru, "capacity": "4", "devices": 5, "allow_overcommit": True}).specs()
    assert runs.specs[0].machine.devices == 5 and "5 of its 4 GPUs" in runs.specs[0].machine.box()
    one_line_error(cli("simulate", "--policy", "lru", "--capacity", "78.9GB", "--devices", "1", cwd=tmp_path),
                   "--allow-overcommit")
    one_line_error(cli("simulate", "--policy", "lru", "--devices", "5", cwd=tmp_path), "has 4 GPUs")
    assert not (tmp_path / "casmoe-sim").exists()


def test_experts_beyond_host_ram_get_a_ram_tier(tmp_path):
    small_ram = box(tmp_path, "ram64", host_ram_gib=64.0)  # Mixtral's bf16 experts are about 90 GB
    res = casmoe.sim.simulate(hardware=str(small_ram), policies=["lru"], capacities=[4], requests=2)
    assert any("do not fit the 60 GiB of host RAM" in n and "4 GiB kept for the OS" in n for n in res.notes)
    (rec,) = res.records  # the RAM tier is the RAM less the profile's reserve for the OS and runtime
    assert rec["host_cache_gb"] == pytest.approx(60 * 2**30 / 1e9, rel=0.01) and rec["storage_bytes"] > 0
    full = casmoe.sim.simulate(policies=["lru"], capacities=[4], requests=2)  # 256 GiB: every expert in RAM
    assert full.records[0]["host_cache_gb"] == 0 and full.notes == []
    no_storage = box(tmp_path, "ram64nvme0", host_ram_gib=64.0, storage_read_gbs=0.0)
    with pytest.raises(CasmoeError, match="no storage tier"):
        casmoe.sim.simulate(hardware=str(no_storage), policies=["lru"], capacities=[4], requests=2)
    with pytest.raises(CasmoeError, match="exceeds the 60 GiB of host RAM .* left beside the 4 GiB"):
        casmoe.sim.simulate(hardware=str(small_ram), policies=["lru"], capacities=[4], requests=2, host_cache="62GiB")


def test_timeliness_bound_per_device_on_four_gpus():
    trace = load_trace(SHIPPED).subset(range(3))
    res = sim_run(trace, "ondemand", 2, devices=4, compute=FixedCompute(layer_s=1e-5), detail=True)
    per_device = res.stall_bound_by_device_s
    assert len(per_device) == 4 and all(b > 0 for b in per_device)  # every device's link is short of bandwidth
    assert max(per_device) == pytest.approx(res.stall_bound_s)
    assert all(b <= res.stall_s * (1 + 1e-9) for b in per_device)
    # Per layer a true lower bound on that layer's own stall. On-demand leaves each link idle while
    # the other devices compute and stall, so a device's later loads could have been hidden there:
    # only what no earlier issuing could have saved counts, far less than each device's B_d.
    by_layer, stall = res.stall_bound_by_layer_s, res.stall_by_layer_s
    assert all(0 <= b <= s * (1 + 1e-9) for b, s in zip(by_layer, stall, strict=True))
    assert 0 < sum(by_layer) <= res.stall_s


# ---- Python API misuse -------------------------------------------------------------------------------


def test_replay_refuses_what_would_count_wrong():
    tr = load_trace(SHIPPED).subset(range(2))
    g = tr.geometry
    cache = LRU(g, 4)
    first = replay(tr, cache).stats
    with pytest.raises(CacheConfigError, match="already replayed"):
        replay(tr, cache)
    assert replay(tr, LRU(g, 4)).stats == first  # a fresh cache gives the same counts
    with pytest.raises(CacheConfigError, match="not the class LRU"):
        replay(tr, LRU)
    with pytest.raises(CacheConfigError, match="built for 16 MoE layers x 64 experts"):
        replay(tr, LRU(Geometry(16, 64, 8), 8))
    with pytest.raises(CacheConfigError, match="whole number of slots"):
        LRU(g, 4.7)
    r = tr.requests[0]
    bad = r.topk.copy()
    bad[0, 0, 0] = 99
    with pytest.raises(TraceError, match="expert id 99 outside"):
        replay(Trace(g, [Request(bad, r.weights, r.prefill)]), LRU(g, 4))
    with pytest.raises(TraceError, match="integer array"):
        replay(Trace(g, [Request(r.topk.astype(float), r.weights, r.prefill)]), LRU(g, 4))
    with pytest.raises(SimConfigError, match="takes a policy class"):
        run_trace(Run(tr, LRU(g, 4), Capacity(4), Machine(shaped_preset(g), load_profile("rtx4090x4"))))


def test_the_python_api_takes_the_cli_options_and_defaults():
    res = casmoe.sim.simulate(policies="lru", capacities=[2, "24GB"], quant="bf16", requests=2)
    frame = res.frame()
    assert list(frame["policy"]) == ["lru", "lru"] and set(frame["devices"]) == {4}  # every GPU of the profile
    assert list(frame["capacity"]) == ["2/layer", "2/layer"]  # 24 GB of bf16 Mixtral experts: 2 per layer
    with pytest.raises(CasmoeError, match="unknown --quant"):
        casmoe.sim.simulate(policies="lru", capacities=[2], quant="fp3", requests=2)
    with pytest.raises(CasmoeError, match="batch must be"):
        casmoe.sim.simulate(policies="lru", capacities=[2], batch=0, requests=2)


@pytest.mark.parametrize("kw,needle", [
    (dict(hardware=3), "hardware = 3 is not a string"), (dict(seed="a", arrival="poisson", rate=0.5), "seed = 'a' is not a whole"),
    (dict(rate="fast"), "rate = 'fast' is not a finite number"), (dict(pinned="yes"), "pinned = 'yes' is not true or false"),
    (dict(batch=True), "batch = True is not a whole number"), (dict(users=2.5), "users = 2.5 is not a whole"),
    (dict(timeline=3), "timeline must be"), (dict(allow_overcommit=1), "allow_overcommit = 1 is not true or false"),
    (dict(split=3), "split = 3 is not a string"), (dict(global_capacity=4.5), "global_capacity = 4.5 is not a whole number of slots or a memory size"),
    (dict(colour="red"), "unknown option 'colour'"),
])
def test_the_python_api_refuses_arguments_of_the_wrong_type_in_one_line(kw, needle):
    with pytest.raises(CasmoeError, match=needle) as info:
        casmoe.sim.simulate(policies="lru", capacities=[2], requests=2, **kw)
    assert "\n" not in str(info.value)


def test_a_what_if_none_of_whose_runs_can_run_is_refused():
    # every policy built with an option out of range: each run is skipped, so there is nothing to report
    # (a capacity below top_k is no longer one: staging slots price it)
    with pytest.raises(CasmoeError, match="no run could be simulated.*must lie in"):
        casmoe.sim.simulate(policies=["n-cpu-moe[n=99]", "layer-offload[n=99]"], capacities=[2], requests=2)
    res = casmoe.sim.simulate(policies=["n-cpu-moe[n=99]", "lru"], capacities=[0, 2], requests=2)  # some runs: they are reported
    assert sorted((r["policy"], r["capacity_spec"], "skipped" in r) for r in res.records) == [
        ("lru", "0", False), ("lru", "2", False), ("n-cpu-moe[n=99]", "0", True), ("n-cpu-moe[n=99]", "2", True)]


# ---- serving flags, files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--think", "2"], "--think shapes serving; add --arrival or --users"),
        (["--max-batch", "4", "--schedule", "chunked"], "--max-batch, --schedule shape serving"),
        (["--users", "2", "--think", "inf"], "--think must be a finite number"),
        (["--timeline", str(SHIPPED), "--trace", str(SHIPPED)], "is the trace being simulated"),
    ],
)
def test_serving_and_file_flags_are_refused_in_one_line(args, needle, tmp_path):
    one_line_error(cli("simulate", "--policy", "lru", "--capacity", "2", "--requests", "1", *args, cwd=tmp_path), needle)
    assert not (tmp_path / "casmoe-sim").exists()


def test_bench_refuses_a_nan_link(tmp_path):
    one_line_error(cli("bench", "--model", "tiny-mixtral", "--link-gbps", "nan", cwd=tmp_path), "--link-gbps must be")


def test_a_trace_without_prompts_is_served_by_the_trajectory_stage(tmp_path):
    """A prompt-free trace is not refused and never predicted from an empty prompt:
    the planner fits its trajectory stage alone and casmoe serves from the routing it sees."""
    from casmoe.planner import PlannerConfig, fit_planner
    from casmoe.replay import replay

    tr = load_trace(SHIPPED).subset(range(4))
    for r in tr.requests:
        r.prompt = None
    planner = fit_planner(tr, PlannerConfig(holdout_every=0))
    assert planner.stages == ["trajectory"]
    planner.save(tmp_path / "pl")
    cache = PolicySpec.parse(f"casmoe[planner={tmp_path / 'pl'}]").create(tr.geometry, Capacity(4), trace=tr)
    stats = replay(tr, cache).stats
    assert stats.hits + stats.late_hits + stats.misses == stats.accesses > 0


def test_presets_lists_every_model_preset(tmp_path):
    from casmoe.presets import load_presets

    proc = cli("presets", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert set(listed) == set(load_presets()) and listed["mixtral-8x7b"]["experts"] == 8


def test_a_static_profile_holding_scored_requests_marks_them_seen(small, tmp_path):
    whole = load_trace(small)
    profile = tmp_path / "first3.npz"
    save_trace(whole.subset(range(3)), profile)
    spec = PolicySpec.parse(f"static[profile={profile}]")
    assert spec.fitted_requests(whole) == {0, 1, 2}
    assert Selection().resolve(whole, [spec]).indices == tuple(range(3, 10))
    assert Selection("all").resolve(whole, [spec]).starred == (spec.label,)
    other = tmp_path / "other.npz"
    save_trace(load_trace(SHIPPED).subset(range(2)), other)  # another model's routing: nothing seen
    assert PolicySpec.parse(f"static[profile={other}]").fitted_requests(whole) == set()
