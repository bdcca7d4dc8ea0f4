"""`hf-tpu compare` / `hf-tpu accept` on crafted runs: classes, exit codes, accept round trip, bad input."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from harness import schema
from harness.ci.compare import classify
from harness.ci.sample import row, write_run
from harness.cli import main

BASE = {
    ("m/good", "eager"): "pass",
    ("m/good", "compiled"): "pass",
    ("m/regress", "eager"): "pass",
    ("m/regress", "compiled"): "pass",
    ("m/fixed", "eager"): "fail_to_run",
    ("m/gone", "eager"): "pass",
    ("m/flaky", "eager"): "pass",
    ("m/xfail", "eager"): "fail_accuracy",
    ("m/nobase", "eager"): "baseline_fail",
}


def _run(tmp: Path, name: str, statuses: dict[tuple[str, str], str]) -> Path:
    rows = []
    for (e, m), s in statuses.items():
        extra = {"error_type": "RuntimeError", "error_message": f"boom in {e}"} if s in schema.RUN_FAILURES else {}
        rows.append(row(e, mode=m, status=s, **extra))
    return write_run(tmp / name, rows)


def _classes(run_dir: Path) -> dict[tuple[str, str], str]:
    df = pd.read_csv(run_dir / "comparison.csv", dtype=str, keep_default_na=False)
    return {(r["entry_id"], r["mode"]): r["class"] for _, r in df.iterrows()}


@pytest.fixture
def expected(tmp_path: Path) -> Path:
    """Expected results accepted from BASE, with m/flaky listed as flaky in eager."""
    base = _run(tmp_path, "base", BASE)
    exp = tmp_path / "expected"
    assert main(["accept", str(base), "--expected", str(exp)]) == 0
    (exp / "flaky.csv").write_text("name,mode,reason\nm/flaky,eager,nondeterministic kernel\n")
    return exp


def test_accepted_files_have_the_documented_format(expected: Path) -> None:
    eager = list(csv.reader((expected / "eager.csv").open()))
    assert eager[0] == ["name", "status"]
    assert eager[1:] == sorted([e, s] for (e, m), s in BASE.items() if m == "eager")
    assert [r[0] for r in csv.reader((expected / "compiled.csv").open())] == ["name", "m/good", "m/regress"]


def test_each_class_and_exit_codes(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture) -> None:
    now = dict(BASE)
    now[("m/regress", "compiled")] = "compile_fail"  # regression
    now[("m/fixed", "eager")] = "pass"  # improvement
    del now[("m/gone", "eager")]  # missing
    now[("m/flaky", "eager")] = "fail_accuracy"  # flaky: different, but listed
    now[("m/brand_new", "eager")] = "pass"  # not in expected
    run = _run(tmp_path, "now", now)

    assert main(["compare", str(run), "--expected", str(expected)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "m/regress" in out
    cls = _classes(run)
    assert cls[("m/regress", "compiled")] == "FAIL"
    assert cls[("m/fixed", "eager")] == "IMPROVED"
    assert cls[("m/gone", "eager")] == "MISSING"
    assert cls[("m/flaky", "eager")] == "FLAKY"
    assert cls[("m/brand_new", "eager")] == "NEW"
    for key in [("m/good", "eager"), ("m/good", "compiled"), ("m/regress", "eager"), ("m/xfail", "eager"),
                ("m/nobase", "eager")]:
        assert cls[key] == "PASS", key
    md = (run / "comparison.md").read_text()
    assert "| FAIL | `m/regress` | compiled | pass | compile_fail |" in md
    # A regression fails even when improvements are accepted.
    assert main(["compare", str(run), "--expected", str(expected), "--accept-improvements"]) == 1


def test_improvement_alone_fails_unless_accepted(tmp_path: Path, expected: Path) -> None:
    now = dict(BASE)
    now[("m/fixed", "eager")] = "pass"
    run = _run(tmp_path, "now", now)
    assert main(["compare", str(run), "--expected", str(expected)]) == 1
    assert main(["compare", str(run), "--expected", str(expected), "--accept-improvements"]) == 0


def test_missing_alone_fails_unless_allowed(tmp_path: Path, expected: Path) -> None:
    now = {k: v for k, v in BASE.items() if k != ("m/gone", "eager")}
    run = _run(tmp_path, "now", now)
    assert main(["compare", str(run), "--expected", str(expected)]) == 1
    assert main(["compare", str(run), "--expected", str(expected), "--allow-missing"]) == 0


def test_flaky_alone_passes(tmp_path: Path, expected: Path) -> None:
    now = dict(BASE)
    now[("m/flaky", "eager")] = "timeout"
    run = _run(tmp_path, "now", now)
    assert main(["compare", str(run), "--expected", str(expected)]) == 0
    assert _classes(run)[("m/flaky", "eager")] == "FLAKY"


def test_accept_then_compare_has_no_differences(tmp_path: Path, expected: Path) -> None:
    now = dict(BASE)
    now[("m/regress", "compiled")] = "crash"
    now[("m/fixed", "eager")] = "pass"
    del now[("m/gone", "eager")]
    now[("m/brand_new", "compiled")] = "not_available"
    run = _run(tmp_path, "now", now)
    assert main(["compare", str(run), "--expected", str(expected)]) == 1
    assert main(["accept", str(run), "--expected", str(expected)]) == 0
    assert main(["compare", str(run), "--expected", str(expected)]) == 0
    assert set(_classes(run).values()) == {"PASS"}
    assert (expected / "flaky.csv").read_text().startswith("name,mode,reason\nm/flaky"), "accept kept flaky.csv"


def test_accept_update_keeps_other_entries(tmp_path: Path, expected: Path) -> None:
    part = _run(tmp_path, "part", {("m/fixed", "eager"): "pass"})
    assert main(["accept", str(part), "--expected", str(expected), "--update"]) == 0
    eager = dict(csv.reader((expected / "eager.csv").open()))
    assert eager["m/fixed"] == "pass" and eager["m/gone"] == "pass" and len(eager) == 1 + 7
    full_run = _run(tmp_path, "full", BASE)
    assert main(["compare", str(full_run), "--expected", str(expected)]) == 1  # m/fixed: pass -> fail_to_run


@pytest.mark.parametrize(
    "expected_status,actual,flaky,cls",
    [
        ("pass", "pass", False, "PASS"),
        ("crash", "crash", False, "PASS"),  # expected failure, still failing the same way
        ("pass", "fail_accuracy", False, "FAIL"),
        ("fail_accuracy", "crash", False, "FAIL"),  # worse
        ("crash", "fail_to_run", False, "FAIL"),  # a different failure kind is not an improvement
        ("timeout", "fail_accuracy", False, "FAIL"),
        ("compile_fail", "pass", False, "IMPROVED"),
        ("pass", None, False, "MISSING"),
        ("pass", "not_available", False, "MISSING"),  # coverage lost, e.g. the model left the offline cache
        ("pass", "skipped", False, "MISSING"),
        ("baseline_fail", "baseline_fail", False, "PASS"),
        ("baseline_fail", "pass", False, "NEW"),  # newly measured
        ("not_available", "crash", False, "NEW"),
        ("not_available", "skipped", False, "PASS"),  # nothing measured either way
        ("not_available", None, False, "PASS"),
        (None, "pass", False, "NEW"),
        (None, "crash", False, "NEW"),
        (None, "not_available", False, "NEW"),
        ("pass", "crash", True, "FLAKY"),
        ("pass", "pass", True, "PASS"),
        ("pass", None, True, "MISSING"),
    ],
)
def test_classify_rules(expected_status: str | None, actual: str | None, flaky: bool, cls: str) -> None:
    assert classify(expected_status, actual, flaky) == cls


def test_flaky_without_mode_applies_to_every_mode(tmp_path: Path, expected: Path) -> None:
    (expected / "flaky.csv").write_text("name,mode,reason\nm/regress,,\n")
    now = dict(BASE)
    now[("m/regress", "eager")] = "crash"
    now[("m/regress", "compiled")] = "oom"
    run = _run(tmp_path, "now", now)
    assert main(["compare", str(run), "--expected", str(expected)]) == 0
    cls = _classes(run)
    assert cls[("m/regress", "eager")] == cls[("m/regress", "compiled")] == "FLAKY"


# ---------------------------------------------------------------- bad input: exit 2 with a clear message


def _err(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_missing_run_dir(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture) -> None:
    for cmd in ("compare", "accept", "report"):
        argv = [cmd, str(tmp_path / "nope")] + (["--expected", str(expected)] if cmd != "report" else [])
        err = _err(argv, capsys)
        assert f"hf-tpu {cmd}: error:" in err and "does not exist" in err and "hf-tpu sweep --out" in err


def test_missing_results_csv(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty_run").mkdir()
    err = _err(["compare", str(tmp_path / "empty_run"), "--expected", str(expected)], capsys)
    assert "results.csv not found" in err and "hf-tpu sweep --out" in err


@pytest.mark.parametrize(
    "content,needle",
    [
        ("", "is empty"),
        ("entry_id,mode\nm/a,eager\n", "lacks the schema column(s)"),
        ('"unterminated\n', "not a valid CSV"),
    ],
)
def test_malformed_results_csv(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture, content: str,
                               needle: str) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    (d / "results.csv").write_text(content)
    err = _err(["compare", str(d), "--expected", str(expected)], capsys)
    assert needle in err, err


def test_schema_version_mismatch(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "old", [row("m/good", schema_version=schema.SCHEMA_VERSION + 1)])
    err = _err(["compare", str(run), "--expected", str(expected)], capsys)
    assert f"schema_version {schema.SCHEMA_VERSION + 1}" in err and "re-run the sweep" in err


@pytest.mark.parametrize(
    "field,value,needle",
    [("status", "exploded", "unknown status"), ("mode", "jit", "unknown mode"), ("entry_id", "", "empty entry_id")],
)
def test_bad_values(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture, field: str, value: str,
                    needle: str) -> None:
    r = row("m/good")
    r[field] = value
    run = write_run(tmp_path / "r", [r])
    assert needle in _err(["compare", str(run), "--expected", str(expected)], capsys)


def test_duplicate_rows(tmp_path: Path, expected: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "r", [row("m/good"), row("m/good", status="crash")])
    assert "sharing an (entry_id, mode) key" in _err(["compare", str(run), "--expected", str(expected)], capsys)


def test_expected_dir_problems(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _run(tmp_path, "run", BASE)
    err = _err(["compare", str(run), "--expected", str(tmp_path / "none")], capsys)
    assert "does not exist" in err and "hf-tpu accept" in err
    (tmp_path / "bare").mkdir()
    assert "holds no expected results" in _err(["compare", str(run), "--expected", str(tmp_path / "bare")], capsys)
    (tmp_path / "bare" / "eager.csv").write_text("name,state\nm/good,pass\n")
    assert "lacks column(s) status" in _err(["compare", str(run), "--expected", str(tmp_path / "bare")], capsys)
    (tmp_path / "bare" / "eager.csv").write_text("name,status\nm/good,great\n")
    assert "unknown status" in _err(["compare", str(run), "--expected", str(tmp_path / "bare")], capsys)


def test_accept_refuses_an_empty_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "r", [])
    assert "has no rows" in _err(["accept", str(run), "--expected", str(tmp_path / "exp")], capsys)
    assert not (tmp_path / "exp" / "eager.csv").exists()


def test_unknown_option_is_status_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path), "--bogus"])
    assert exc.value.code == 2


def test_an_opt_in_mode_is_compared_only_in_runs_that_swept_it(tmp_path: Path) -> None:
    base = {("m/a", "eager"): "pass", ("m/a", "compiled"): "pass", ("m/a", "fused"): "pass"}
    exp = tmp_path / "expected"
    assert main(["accept", str(_run(tmp_path, "base", base)), "--expected", str(exp)]) == 0
    assert (exp / "fused.csv").exists()
    # the nightly's default modes only: fused's expected rows are not MISSING
    nightly = _run(tmp_path, "nightly", {("m/a", "eager"): "pass", ("m/a", "compiled"): "pass"})
    assert main(["compare", str(nightly), "--expected", str(exp)]) == 0
    assert ("m/a", "fused") not in _classes(nightly)
    # a run that swept fused is held to it
    fused = _run(tmp_path, "fused", {("m/b", "fused"): "pass", **{k: v for k, v in base.items() if k[1] != "fused"}})
    assert main(["compare", str(fused), "--expected", str(exp)]) == 1
    assert _classes(fused)[("m/a", "fused")] == "MISSING"
    # a default mode the run never swept is still MISSING (a nightly that lost its compiled rows fails)
    eager_only = _run(tmp_path, "eager_only", {("m/a", "eager"): "pass"})
    assert main(["compare", str(eager_only), "--expected", str(exp)]) == 1
    assert _classes(eager_only)[("m/a", "compiled")] == "MISSING"


def test_a_medium_run_is_held_to_its_own_expected_directory(tmp_path: Path, expected: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """Statuses accepted at "highest" say nothing about a run at "medium": compare refuses the pair (exit 2,
    naming the fix), accept into a fresh directory records the configuration, and that directory compares."""
    rows = [row(e, mode=m, status=s, precision="medium", **({"error_type": "RuntimeError", "error_message": "boom"}
                                                            if s in schema.RUN_FAILURES else {}))
            for (e, m), s in BASE.items()]
    medium = write_run(tmp_path / "medium", rows)
    assert main(["compare", str(medium), "--expected", str(expected)]) == 2
    err = capsys.readouterr().err
    assert "precision medium" in err and "--expected DIR" in err
    assert main(["accept", str(medium), "--expected", str(expected)]) == 2  # never mixed into one directory
    exp_medium = tmp_path / "expected-medium"
    assert main(["accept", str(medium), "--expected", str(exp_medium)]) == 0
    assert '"precision": "medium"' in (exp_medium / "configuration.json").read_text()
    assert main(["compare", str(medium), "--expected", str(exp_medium)]) == 0
    assert not (expected / "configuration.json").exists()  # the default configuration needs no file


def test_the_train_phase_has_its_own_expected_files_compared_only_in_runs_that_trained(tmp_path: Path) -> None:
    rows = [row("m/a", mode=m) for m in ("eager", "compiled")]
    trained = rows + [row("m/a", phase="train", mode="eager"),
                      row("m/a", phase="train", mode="compiled", status="fail_accuracy")]
    exp = tmp_path / "expected"
    assert main(["accept", str(write_run(tmp_path / "base", trained)), "--expected", str(exp)]) == 0
    assert list(csv.reader((exp / "train-compiled.csv").open())) == [["name", "status"], ["m/a", "fail_accuracy"]]
    assert list(csv.reader((exp / "eager.csv").open())) == [["name", "status"], ["m/a", "pass"]]

    def classes(run: Path) -> dict[tuple[str, str, str], str]:
        df = pd.read_csv(run / "comparison.csv", dtype=str, keep_default_na=False)
        return {(r["entry_id"], r["phase"], r["mode"]): r["class"] for _, r in df.iterrows()}

    # the nightly (inference only) owes no train rows
    nightly = write_run(tmp_path / "nightly", rows)
    assert main(["compare", str(nightly), "--expected", str(exp)]) == 0
    assert set(classes(nightly)) == {("m/a", "inference", "eager"), ("m/a", "inference", "compiled")}
    # a train row that regresses is a FAIL of the train phase only; one it lost is MISSING
    now = rows + [row("m/a", phase="train", mode="eager", status="fail_to_run", error_type="RuntimeError",
                      error_message="step 1 backward: boom", failed_at="step 1 backward")]
    run = write_run(tmp_path / "now", now)
    assert main(["compare", str(run), "--expected", str(exp)]) == 1
    cls = classes(run)
    assert cls[("m/a", "train", "eager")] == "FAIL" and cls[("m/a", "inference", "eager")] == "PASS"
    assert cls[("m/a", "train", "compiled")] == "MISSING"
    assert "| FAIL | `m/a` | train/eager | pass | fail_to_run |" in (run / "comparison.md").read_text()
    # flaky.csv may name a phase: the train row is flaky, the inference row of that mode is not
    (exp / "flaky.csv").write_text("name,mode,reason,phase\nm/a,eager,optimizer nondeterminism,train\n")
    main(["compare", str(run), "--expected", str(exp)])
    assert classes(run)[("m/a", "train", "eager")] == "FLAKY"


def test_a_train_only_run_owes_no_inference_rows(tmp_path: Path) -> None:
    """compare holds a run to the phases its run.json selected: a train-only run (the full zoo's train phase
    run apart) is not MISSING its inference rows, and still owes every train row."""
    import json

    both = [row(e, phase=ph, mode=m) for e in ("m/a", "m/b") for ph in ("inference", "train")
            for m in ("eager", "compiled")]
    exp = tmp_path / "expected"
    assert main(["accept", str(write_run(tmp_path / "base", both)), "--expected", str(exp)]) == 0

    def run(name: str, rows: list[dict], phases: list[str] | None) -> Path:
        d = write_run(tmp_path / name, rows)
        if phases is not None:
            (d / "run.json").write_text(json.dumps({"selection": {"phases": phases}}))
        return d

    def classes(d: Path) -> dict[tuple[str, str, str], str]:
        df = pd.read_csv(d / "comparison.csv", dtype=str, keep_default_na=False)
        return {(r["entry_id"], r["phase"], r["mode"]): r["class"] for _, r in df.iterrows()}

    train_rows = [r for r in both if r["phase"] == "train"]
    train = run("train", train_rows, ["train"])
    assert main(["compare", str(train), "--expected", str(exp)]) == 0
    assert set(classes(train).values()) == {"PASS"} and {k[1] for k in classes(train)} == {"train"}
    # a train row it lost is still MISSING
    lost = run("lost", train_rows[1:], ["train"])
    assert main(["compare", str(lost), "--expected", str(exp)]) == 1
    assert classes(lost)[("m/a", "train", "eager")] == "MISSING"
    assert {k[1] for k in classes(lost)} == {"train"}
    # a run that selected both phases and lost its inference rows fails, as does one that does not say
    for name, phases in (("both", ["inference", "train"]), ("unsaid", None)):
        d = run(name, train_rows, phases)
        assert main(["compare", str(d), "--expected", str(exp)]) == 1
        assert classes(d)[("m/a", "inference", "eager")] == "MISSING"


def test_a_merge_selects_the_phases_of_all_its_runs(tmp_path: Path) -> None:
    import json

    from harness.sweep.merge import merge_runs

    dirs = []
    for ph in ("inference", "train"):
        d = write_run(tmp_path / ph, [row("m/a", phase=ph, mode="eager")])
        (d / "run.json").write_text(json.dumps({"selection": {"zoo": "test", "phases": [ph], "shard": [1, 1]}}))
        dirs.append(d)
    merge_runs(dirs, tmp_path / "merged")
    meta = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert meta["selection"]["phases"] == ["inference", "train"]
