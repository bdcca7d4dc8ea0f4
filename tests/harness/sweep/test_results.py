import json

import pandas as pd
import pytest

from harness.schema import COLUMN_NAMES, SCHEMA_VERSION
from harness.sweep.merge import MergeError, merge_frames
from harness.sweep.results import ResultStore, entry_filename, read_csv, to_frame, validate, write_csv


def _row(eid, mode="eager", status="pass", **kw):
    return {"entry_id": eid, "library": "test", "model_type": "t", "model_class": "M", "task": "x", "mode": mode,
            "precision": "highest", "dtype": "float32", "status": status, "max_abs_err": 0.5, "compilations": 2,
            "schema_version": SCHEMA_VERSION, **kw}


def test_entry_rows_roundtrip_and_csv_validates(tmp_path):
    store = ResultStore(tmp_path)
    store.rows_dir.mkdir()
    store.write_entry("lib/a/A", [_row("lib/a/A"), _row("lib/a/A", "compiled", "fail_to_run", error_type="X")])
    store.write_entry("lib/b/B", [_row("lib/b/B", max_abs_err=float("nan"), rmse_ratio=float("inf"))])
    assert set(store.completed()) == {"lib/a/A", "lib/b/B"}
    assert not list(store.rows_dir.glob(".*tmp"))  # no temp files left behind
    df = to_frame(store.all_rows())
    assert validate(df) == []
    write_csv(df, tmp_path / "results.csv")
    back = read_csv(tmp_path / "results.csv")
    assert list(back.columns) == COLUMN_NAMES and validate(back) == []
    assert back["timestamp"].str.len().gt(0).all() and back["compilations"].dtype == "Int64"
    from harness.ci.runs import load_run  # the dashboard's reader accepts it

    assert len(load_run(tmp_path).df) == 3


def test_validate_catches_problems():
    df = to_frame([_row("a"), _row("a")])
    assert any("duplicate" in p for p in validate(df))
    df = to_frame([_row("a", status="exploded")])
    assert any("unknown statuses" in p for p in validate(df))
    assert validate(df.drop(columns="cosine"))


def test_filenames_are_safe_and_distinct():
    a, b = entry_filename("hub/org/model:v1"), entry_filename("hub/org/model_v1")
    assert a != b and "/" not in a and a.endswith(".json")


def test_merge_frames_and_conflicts():
    s1 = to_frame([_row("a"), _row("c")])
    s2 = to_frame([_row("b")])
    m = merge_frames([s1, s2], ["s1", "s2"])
    assert list(m["entry_id"]) == ["a", "b", "c"]
    same = to_frame([_row("a")])
    assert len(merge_frames([s1, same], ["s1", "s3"])) == 2  # identical duplicate: kept once
    # the same result measured differently (memory, times, compile counts) is the same row, kept once
    measured = to_frame([_row("a", peak_rss_mb=873.078, run_s=0.5, compilations=3, recompiles="recompiles")])
    assert len(merge_frames([s1, measured], ["s1", "s5"])) == 2
    with pytest.raises(MergeError, match=r"\(a, inference, eager\) has different results in s1, s4"):
        merge_frames([s1, to_frame([_row("a", status="crash")])], ["s1", "s4"])


def test_merge_later_wins_takes_a_rerun_over_the_sweep():
    sweep = to_frame([_row("a", status="fail_to_run"), _row("a", mode="compiled"), _row("b")])
    rerun = to_frame([_row("a", status="pass")])
    m = merge_frames([sweep, rerun], ["sweep", "rerun"], later_wins=True)
    got = {(r.entry_id, r.mode): r.status for r in m.itertuples()}
    assert got == {("a", "eager"): "pass", ("a", "compiled"): "pass", ("b", "eager"): "pass"}
    # the order given decides: the sweep given last wins back
    m = merge_frames([rerun, sweep], ["rerun", "sweep"], later_wins=True)
    assert {(r.entry_id, r.mode): r.status for r in m.itertuples()}[("a", "eager")] == "fail_to_run"


def test_run_json(tmp_path):
    store = ResultStore(tmp_path)
    store.write_run({"x": 1})
    assert store.read_run() == {"x": 1}
    assert json.loads((tmp_path / "run.json").read_text()) == {"x": 1}
    assert isinstance(pd.DataFrame, type)


def test_a_dead_worker_costs_the_row_of_its_phase_and_the_rest_continue():
    from harness.sweep import testzoo
    from harness.sweep.options import SweepOptions
    from harness.sweep.worker import Death, Task, resolve_death

    (entry,) = testzoo.parse_spec("test:abort")
    opts = SweepOptions(timeout=7)
    task = Task(entry, ("eager", "compiled"))
    rows, cont = resolve_death(task, [], Death("crash", "eager", -6), opts)
    assert [(r["mode"], r["status"], r["error_message"]) for r in rows] == [("eager", "crash", "worker died: SIGABRT")]
    assert cont.modes == ("compiled",) and cont.attempt == 1
    done = [{"mode": "eager", "status": "pass"}]
    rows, cont = resolve_death(task, done, Death("timeout", "compiled", -9), opts)
    assert [(r["mode"], r["status"]) for r in rows] == [("compiled", "timeout")] and cont is None
    assert rows[0]["error_message"] == "timeout after 7 s"
    rows, cont = resolve_death(task, [], Death("oom", "baseline", -9), opts)  # the CPU baseline's fault
    assert [r["status"] for r in rows] == ["baseline_fail", "baseline_fail"] and cont is None
    rows, cont = resolve_death(task, [], Death("crash", "reference", -11), opts)  # fp64 is an extra
    assert rows == [] and cont.skip_reference and cont.modes == ("eager", "compiled")


def test_schema_v2_adds_cause_and_reads_v1_files(tmp_path):
    from harness import schema

    v3 = ["rel_rmse", "reference", "uninformative", "nondeterministic", "canary"]
    later = ["drew", "ties"]
    v6 = ["phase", "warmup_steps", "steady_compilations", "recompiles", "peak_rss_mb", "failed_at", "optimizer",
          "warmup_s", "wall_s"]  # the last two: version 7
    assert SCHEMA_VERSION == 7 and "ties" in COLUMN_NAMES and "phase" in COLUMN_NAMES and "cause" in COLUMN_NAMES
    assert schema.absent_in(1) == ["cause", "control_error", *v3, *later, *v6]
    assert schema.absent_in(2) == [*v3, *later, *v6] and schema.absent_in(3) == [*later, *v6]
    assert schema.absent_in(4) == ["ties", *v6] and schema.absent_in(5) == v6
    assert schema.absent_in(6) == ["warmup_s", "wall_s"] and schema.absent_in(7) == []
    with pytest.raises(ValueError, match="schema_version 8"):
        schema.absent_in(8)
    # a version-1 file: no cause/control_error columns nor the v3 numerics columns, schema_version 1
    v1_cols = [c for c in COLUMN_NAMES if c not in ("cause", "control_error", *v3, *later, *v6)]
    v1 = to_frame([_row("lib/a/A", status="compile_fail", mode="compiled", schema_version=1)])[v1_cols]
    v1.to_csv(tmp_path / "results.csv", index=False)
    back = read_csv(tmp_path / "results.csv")
    assert list(back.columns) == COLUMN_NAMES and back.loc[0, "cause"] == "" and validate(back) == []
    assert back.loc[0, "phase"] == "inference"  # files before version 6 hold inference rows
    from harness.ci.runs import load_run  # the dashboard's reader too

    df = load_run(tmp_path).df
    assert df.loc[0, "cause"] == "" and df.loc[0, "status"] == "compile_fail"
    bad = to_frame([_row("a", cause="gremlins")])
    assert any("unknown causes" in p for p in validate(bad))
    future = to_frame([_row("a", schema_version=9)])
    assert any("unknown schema_version" in p for p in validate(future))
