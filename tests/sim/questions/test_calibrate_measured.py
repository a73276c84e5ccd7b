"""A stack calibrated on a user's own measurements (`casmoe.sim.questions.calibration`,
`casmoe calibrate measured`): rows "measured" by a known stack are fitted back to it, the
fields chosen are those the rows determine, each row is checked by a refit without it, the stack
written is one `casmoe simulate --stack FILE` runs, and bad input is one line and exit 2."""

from __future__ import annotations

import dataclasses
import math

import pytest

from casmoe.sim.questions import calibration as c
from casmoe.sim.questions import validation as v
from casmoe.sim.cost.stack import load_shared, load_stack
from support.cli import cli

RUN = {"model": "mixtral-8x7b", "hardware": "a100-80g", "quant": "int4"}
CONFIGS = {"od": {"policy": "ondemand", "capacity": "2"}, "lru4": {"policy": "lru", "capacity": "4"},
           "lru6": {"policy": "lru", "capacity": "6"}}
TRUTH = {"layer_us": 400.0, "copy_efficiency": 0.5}


@pytest.fixture(scope="module", autouse=True)
def small_traces():
    """A request of 8 decode tokens per row: the fit's arithmetic, not a settled decode rate,
    is what is tested; a fresh memo of predictions for these sizes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(v, "REQUESTS", 1)
        mp.setattr(v, "DECODE_TOKENS", 8)
        mp.setattr(v, "_PREDICTED", {})
        yield


def _measured(ids: list[str]) -> list[v.Row]:
    """Rows whose rates a known stack (ideal with TRUTH) made."""
    truth = dataclasses.replace(load_stack("ideal"), **TRUTH).resolved()
    rows = []
    for i in ids:
        row = v.row_from_dict({"id": i, "system": "mine", "kind": "user measurement", "source": "test",
                               "metric": "decode_tok_s", "value": 1.0, "run": {**RUN, **CONFIGS[i]}}, "test")
        rows.append(dataclasses.replace(row, value=v.predict(row, truth)))
    return rows


def _toml(rows: list[v.Row]) -> str:
    out = []
    for r in rows:
        run = ", ".join(f'{k} = "{x}"' for k, x in r.run.items())
        out += ["[[row]]", f'id = "{r.id}"', f"rate = {r.rate!r}", f"run = {{ {run} }}", ""]
    return "\n".join(out)


@pytest.fixture(scope="module")
def three() -> c.Calibration:
    return c.calibrate(_measured(["od", "lru4", "lru6"]), load_stack("ideal"), source="test", when="2026-01-01")


def test_rows_made_by_a_known_stack_are_fitted_back(three) -> None:
    """Three runs copying different amounts determine both the per-layer cost and the copies'
    share of the link; with a row to spare, each is predicted by the other two."""
    assert three.fields == ["layer_us", "copy_efficiency"]
    assert three.stack.layer_us == pytest.approx(TRUTH["layer_us"], rel=0.02)
    assert three.stack.copy_efficiency == pytest.approx(TRUTH["copy_efficiency"], rel=0.02)
    assert all(math.isfinite(e) and e >= 0 for e in three.errors.values())
    for check in three.checks:
        assert check.fitted == pytest.approx(check.row.rate, rel=0.02)
        assert check.left_out is not None and check.left_out == pytest.approx(check.row.rate, rel=0.05)
    assert three.left_out_median_abs_log_ratio() < 0.05
    host = next(ch for ch in three.choices if ch.field == "host_efficiency")
    assert not host.fitted and "host" in host.why


def test_the_stack_says_where_each_fitted_number_came_from(three) -> None:
    s = three.stack
    assert s.fitted_on == {"layer_us": ["od", "lru4", "lru6"], "copy_efficiency": ["od", "lru4", "lru6"]}
    for f in three.fields:
        assert "fitted by `test` on rows od, lru4, lru6 (2026-01-01)" in s.sources[f] and "standard error" in s.sources[f]
    assert s.sources["step_us"] == load_stack("ideal").sources["step_us"]  # what was not fitted keeps its source


def test_one_row_determines_the_per_layer_cost_only() -> None:
    (row,) = _measured(["lru4"])
    cal = c.calibrate([row], load_stack("ideal"), source="test", when="today")
    assert cal.fields == ["layer_us"] and math.isinf(cal.errors["layer_us"])
    assert cal.checks[0].left_out is None and cal.checks[0].fitted == pytest.approx(row.rate, rel=0.02)
    assert "not determined" in cal.describe("layer_us")


def test_repeats_of_one_configuration_do_not_separate_the_link() -> None:
    """Two runs of the same configuration move with every field alike: only layer_us is fitted."""
    (row,) = _measured(["lru4"])
    again = dataclasses.replace(row, id="lru4-again", value=row.value * 1.02)
    choices = {ch.field: ch for ch in c.choose_fields([row, again], load_stack("ideal"), load_shared())}
    assert choices["layer_us"].fitted and not choices["copy_efficiency"].fitted
    assert "separ" in choices["copy_efficiency"].why


def test_two_policies_fit_two_fields_with_no_row_to_spare() -> None:
    cal = c.calibrate(_measured(["od", "lru4"]), load_stack("ideal"), source="test", when="today")
    assert cal.fields == ["layer_us", "copy_efficiency"]
    assert all(math.isinf(e) for e in cal.errors.values())
    assert all(ch.left_out is None for ch in cal.checks)
    assert cal.stack.layer_us == pytest.approx(TRUTH["layer_us"], rel=0.05)


def test_csv_says_what_the_toml_says(tmp_path) -> None:
    rows = _measured(["od", "lru4"])
    (tmp_path / "m.toml").write_text(_toml(rows))
    lines = ["id,rate,model,hardware,quant,policy,capacity"] + [
        f"{r.id},{r.rate!r},{r.run['model']},{r.run['hardware']},{r.run['quant']},{r.run['policy']},{r.run['capacity']}"
        for r in rows]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    from_toml, from_csv = c.load_measured(tmp_path / "m.toml"), c.load_measured(tmp_path / "m.csv")
    assert [(r.id, r.rate, r.metric) for r in from_toml] == [(r.id, r.rate, r.metric) for r in from_csv]
    assert from_csv[1].run == {**RUN, "policy": "lru", "capacity": 4}  # cells typed as the TOML would type them
    ideal = load_stack("ideal").resolved()
    assert [v.predict(r, ideal) for r in from_toml] == [v.predict(r, ideal) for r in from_csv]


# ---- the command line ---------------------------------------------------------------------------


def test_calibrate_writes_a_stack_simulate_runs(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from casmoe.cli import app

    rows = _measured(["od", "lru4"])
    measured = tmp_path / "m.toml"
    measured.write_text(_toml(rows))
    out = tmp_path / "mine.toml"
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "measured", str(measured), "--fit", "layer_us", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "left-out tok/s" in result.output and "layer_us = " in result.output and "named by --fit" in result.output
    stack = load_stack(out)
    assert stack.name == "mine" and stack.fitted_on == {"layer_us": ["od", "lru4"]}
    assert stack.label == "mine (mine.toml)"  # a user's stack, told apart from any shipped one
    assert "casmoe calibrate measured" in stack.sources["layer_us"]
    sim = runner.invoke(app, ["simulate", "--stack", str(out), "--model", "mixtral-8x7b", "--hardware", "a100-80g",
                              "--quant", "int4", "--policy", "lru", "--capacity", "4", "--requests", "1",
                              "--allow-overcommit", "--plots", "none", "--out", str(tmp_path / "sim"), "--json"])
    assert sim.exit_code == 0, sim.output
    (record,) = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert record["stack"] == "mine (mine.toml)" and record["decode_tokens_per_s"] > 0


def test_calibrate_json_names_the_choices(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from casmoe.cli import app

    measured = tmp_path / "m.toml"
    measured.write_text(_toml(_measured(["lru4"])))
    result = CliRunner().invoke(app, ["calibrate", "measured", str(measured), "--out", str(tmp_path / "s.toml"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert list(record["fitted"]) == ["layer_us"] and record["fitted"]["layer_us"]["standard_error"] is None
    assert {ch["field"]: ch["fitted"] for ch in record["choices"]} == {
        "layer_us": True, "copy_efficiency": False, "host_efficiency": False}
    assert record["rows"][0]["left_out_tok_s"] is None


@pytest.mark.parametrize("text, args, message", [
    (None, [], "measurements file"),
    ('[[row]]\nid = "a"\nrun = { model = "mixtral-8x7b", hardware = "a100-80g" }\n', [], "row a: no rate"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "a100-80g", policy = "lru", capacity = "4" }\n',
     ["--fit", "layer_us,speed_us"], "unknown field speed_us"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "a100-80g", policy = "lru", capacity = "4" }\n',
     ["--fit", "layer_us,copy_efficiency"], "2 fields but the file has 1 row"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "a100-80g", policy = "lru" }\n',
     [], "row a: its run expands to 4 runs, differing in capacity"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "a100-80g", policy = "nosuch" }\n',
     [], "row a: unknown policy 'nosuch'"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", hardware = "a100-80g", capacit = "4" }\n',
     [], "row a: unknown option 'capacit'"),
    ('[[row]]\nid = "a"\nrate = 2.0\nrun = { model = "mixtral-8x7b", policy = "lru" }\n', [], "row a: its run names no hardware"),
    ('[[row]]\nid = "a"\nrate = -1\nrun = { model = "mixtral-8x7b", hardware = "a100-80g" }\n', [], "a number > 0"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, text, args, message) -> None:
    measured = tmp_path / "m.toml"
    if text is not None:
        measured.write_text(text)
    code, out, err = cli(["calibrate", "measured", str(measured), "--out", str(tmp_path / "s.toml"), *args],
                         tmp_path, monkeypatch, capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.toml").exists()


def test_each_calibration_is_its_own_command(tmp_path, monkeypatch, capsys) -> None:
    code, out, _ = cli(["calibrate", "--help"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "backend" in out and "measured" in out
    code, _, err = cli(["calibrate", "backend"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "--model" in err


def test_the_base_is_the_stack_the_rows_name_unless_given() -> None:
    (row,) = _measured(["lru4"])
    named = dataclasses.replace(row, run={**row.run, "stack": "llama.cpp"})
    assert c.base_stack([row], None).name == "ideal"
    assert c.base_stack([named], None).name == "llama.cpp"
    assert c.base_stack([row], "vllm").name == "vllm"
    with pytest.raises(c.CalibrationError, match="--stack vllm but the rows name stack llama.cpp"):
        c.base_stack([named], "vllm")
    other = dataclasses.replace(named, id="b", run={**row.run, "stack": "vllm"})
    with pytest.raises(c.CalibrationError, match="different stacks"):
        c.base_stack([named, other], None)


def test_measuring_and_fitting_are_not_mixed(tmp_path, monkeypatch, capsys) -> None:
    """An option of the other calibration is refused in one line, never ignored."""
    measured = tmp_path / "m.toml"
    measured.write_text(_toml(_measured(["lru4"])))
    code, _, err = cli(["calibrate", "measured", str(measured), "--model", "tiny-mixtral"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "--model" in err and err.count("\n") == 1
    code, _, err = cli(["calibrate", "backend", "--model", "tiny-mixtral", "--fit", "layer_us"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "--fit" in err and err.count("\n") == 1


@pytest.mark.parametrize("old, new", [
    (["calibrate", "--measured", "F", "--fit", "layer_us"], ["calibrate", "measured", "F", "--fit", "layer_us"]),
    (["calibrate", "--model", "m"], ["calibrate", "backend", "--model", "m"]),
    (["validate", "--published", "--out", "v"], ["validate", "published", "--out", "v"]),
    (["validate", "--model", "m"], ["validate", "backend", "--model", "m"]),
    (["profiles", "--published"], ["hardware", "list", "--published"]),
    (["profile", "info", "p.npz"], ["popularity", "info", "p.npz"]),
])
def test_old_command_names_run_and_say_the_new_one(old, new) -> None:
    from casmoe.cli import renamed

    argv, note = renamed(old)
    assert argv == new and note.startswith("note: `casmoe ") and "is now `casmoe " in note


def test_an_old_name_runs_through_the_command_line(tmp_path, monkeypatch, capsys) -> None:
    code, out, err = cli(["profiles"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "rtx4090x4" in out and "`casmoe hardware list`" in err


def test_a_row_faster_than_its_configuration_can_run_is_flagged(three) -> None:
    assert not any(ch.beyond_bound for ch in three.checks)
    (row,) = _measured(["od"])
    bound = v.bound(row)
    cal = c.calibrate([dataclasses.replace(row, value=bound * 1.3)], load_stack("ideal"), source="test", when="today")
    (check,) = cal.checks
    assert check.beyond_bound and check.bound == pytest.approx(bound)
    assert "at its bound" in cal.describe("layer_us")  # no software cost makes it fast enough
    with pytest.raises(c.CalibrationError, match="faster than its configuration can run"):  # and beyond any fit
        c.calibrate([dataclasses.replace(row, value=bound * 3)], load_stack("ideal"), source="test", when="today")


def test_a_rate_in_the_wrong_unit_is_refused_not_fitted_at_a_bound(three) -> None:
    """Tokens per millisecond written as per second: 1000x too slow, no runtime cost explains it."""
    (row,) = _measured(["od"])
    with pytest.raises(c.CalibrationError, match="per millisecond"):
        c.calibrate([dataclasses.replace(row, value=row.value / 1000)], load_stack("ideal"), source="test", when="today")


def test_the_command_warns_of_a_row_beyond_its_bound(tmp_path) -> None:
    from typer.testing import CliRunner

    from casmoe.cli import app

    (row,) = _measured(["od"])
    measured = tmp_path / "m.toml"
    measured.write_text(_toml([dataclasses.replace(row, value=v.bound(row) * 1.3)]))
    result = CliRunner().invoke(app, ["calibrate", "measured", str(measured), "--out", str(tmp_path / "s.toml")])
    assert result.exit_code == 0, result.output
    assert "warning: row od measured" in result.output and "faster than its configuration can run" in result.output
