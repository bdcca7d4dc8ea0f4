"""Headline figures, coverage breakdowns, crash grouping and worst numerics on a crafted run."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from harness import schema
from harness.ci import coverage as cov
from harness.ci.runs import read_results_csv
from harness.ci.sample import demo_rows, row, write_run


@pytest.fixture
def demo(tmp_path) -> pd.DataFrame:
    # Through the CSV and the validating reader, as the CLIs see it.
    return read_results_csv(write_run(tmp_path / "demo", demo_rows()) / "results.csv")


def test_headline_denominators(demo: pd.DataFrame) -> None:
    h = cov.headline(demo)
    # 22 rows; 5 excluded (2 not_available, 2 baseline_fail, 1 skipped); 6 run failures; 11 ran, 9 passed.
    assert (h.rows, h.excluded) == (22, 5)
    assert (h.crash_free.num, h.crash_free.den) == (11, 17)
    assert (h.numerics_match.num, h.numerics_match.den) == (9, 11)
    assert str(h.crash_free) == "64.7% (11/17)"
    assert cov.Figure(0, 0).pct is None and str(cov.Figure(0, 0)) == "n/a (0/0)"


def test_coverage_by_mode_task_library(demo: pd.DataFrame) -> None:
    by_mode = cov.coverage_by(demo, "mode").set_index("mode")
    assert list(by_mode.index) == ["eager", "compiled"]  # schema order, not alphabetical
    assert by_mode.loc["eager", ["denominator", "crash_free", "ran", "numerics_match"]].tolist() == [9, 6, 6, 5]
    assert by_mode.loc["compiled", ["denominator", "crash_free", "ran", "numerics_match"]].tolist() == [8, 5, 5, 4]
    assert by_mode.loc["compiled", "skipped"] == 1
    # Per-group figures add up to the headline.
    assert by_mode["crash_free"].sum() == 11 and by_mode["denominator"].sum() == 17
    by_task = cov.coverage_by(demo, "task").set_index("task")
    assert by_task.loc["speech", "denominator"] == 0 and pd.isna(by_task.loc["speech", "crash_free_pct"])
    assert by_task.loc["image-classification", "numerics_match_pct"] == 0.0
    by_lib = cov.coverage_by(demo, "library")
    assert list(by_lib["library"]) == ["diffusers", "hub", "test", "transformers"]
    assert by_lib[list(schema.STATUSES)].to_numpy().sum() == len(demo)


def test_normalise_message() -> None:
    a = cov.normalise_message("no lowering for aten::_weight_int4pack_mm at 0x7f3a2c (shape [2, 128])")
    b = cov.normalise_message("no lowering for aten::_weight_int4pack_mm at 0x55aa10 (shape [4, 64])\nTraceback")
    assert a == b == "no lowering for aten::_weight_int4pack_mm at 0x… (shape [N, N])"
    assert cov.normalise_message("float32 vs bfloat16 in conv2d, 3.5e-3 off") == "float32 vs bfloat16 in conv2d, N off"
    assert cov.normalise_message("cannot open /root/.cache/x/model.bin") == "cannot open <path>"
    assert cov.normalise_message("") == ""


def test_crash_table_groups_by_root_cause(demo: pd.DataFrame) -> None:
    t = cov.crash_table(demo)
    assert list(t.columns) == cov.CRASH_COLUMNS
    top = t.iloc[0]
    # t5 (eager+compiled) and mixtral (compiled) share one cause despite different addresses and shapes.
    assert (top["failing_op"], top["entries"], top["rows"]) == ("aten::_weight_int4pack_mm", 2, 3)
    assert top["statuses"] == "compile_fail, fail_to_run" and top["modes"] == "eager, compiled"
    assert t["entries"].is_monotonic_decreasing
    assert t["rows"].sum() == demo["status"].isin(schema.RUN_FAILURES).sum()
    assert cov.crash_table(demo[demo["status"] == "pass"]).empty


def test_worst_numerics_order(demo: pd.DataFrame) -> None:
    w = cov.worst_numerics(demo, n=4)
    assert list(w["status"][:2]) == ["fail_accuracy", "fail_accuracy"]
    assert w.iloc[2]["entry_id"] == "diffusers/unet/UNet2DModel"  # rmse_ratio 1.4, the worst of the passes
    assert len(w) == 4


def test_coverage_markdown_has_the_figures(demo: pd.DataFrame) -> None:
    md = cov.coverage_markdown(demo)
    assert "**crash-free**: 64.7% (11/17)" in md and "**numerics-match**: 81.8% (9/11)" in md
    assert "| eager | 66.7% (6/9) | 66.7% (6/9) | 83.3% (5/6) | 2 |" in md  # no upstream rows: same figure
    assert "## Crashes by root cause (4)" in md


def test_coverage_says_which_precision_the_run_used(demo: pd.DataFrame) -> None:
    md = cov.coverage_markdown(demo)
    (line,) = [x for x in md.splitlines() if x.startswith("- **configuration**")]
    assert "precision highest" in line and "dtype float32" in line
    medium = demo.assign(precision="medium")
    line = [x for x in cov.coverage_markdown(medium).splitlines() if x.startswith("- **configuration**")][0]
    assert "precision medium" in line and "bfloat16 products" in line and "IEEE float32" in line


@pytest.mark.skipif(importlib.util.find_spec("harness.sweep.outputs") is None, reason="harness.sweep not built")
def test_same_headline_as_the_sweep(demo: pd.DataFrame) -> None:
    # The sweep's coverage.md and the dashboard must never disagree on the headline figures.
    from harness.sweep import outputs

    theirs = outputs.headline(demo)
    ours = cov.headline(demo)
    assert (theirs["crash_free"], theirs["counted"]) == (ours.crash_free.num, ours.crash_free.den)
    assert (theirs["passed"], theirs["ran"]) == (ours.numerics_match.num, ours.numerics_match.den)


def test_reader_types_columns(tmp_path) -> None:
    df = read_results_csv(write_run(tmp_path / "r", [row("a", graph_breaks=2, compile_s=1.5), row("b")]) / "results.csv")
    assert df["graph_breaks"].dtype == "Int64" and df["graph_breaks"].tolist()[0] == 2
    assert df["compile_s"].dtype == float and pd.isna(df["compile_s"].iloc[1])
    assert df["error_type"].tolist() == ["", ""]


def _attributed() -> pd.DataFrame:
    rows = [
        row("t/a", status="pass"),
        row("t/b", status="compile_fail", mode="compiled", error_type="TypeError", error_message="immutable list",
            cause="backend"),
        row("t/c", status="compile_fail", mode="compiled", error_type="TorchRuntimeError",
            error_message="no fake impl", cause="upstream", control_error="TorchRuntimeError: no fake impl"),
        row("t/d", status="compile_fail", mode="compiled", error_type="TorchRuntimeError",
            error_message="no fake impl", cause="upstream"),
        row("t/e", status="timeout", mode="compiled", error_type="Timeout"),
        row("t/f", status="fail_to_run", error_type="TpuOpError", error_message="immutable list", cause="backend"),
    ]
    return pd.DataFrame(rows)


def test_crash_free_where_the_control_works() -> None:
    h = cov.headline(_attributed())
    assert str(h.crash_free) == "16.7% (1/6)" and h.upstream == 2
    assert str(h.crash_free_control) == "25.0% (1/4)"  # the two upstream rows leave the denominator
    by_mode = cov.coverage_by(_attributed(), "mode").set_index("mode")
    assert by_mode.loc["compiled", "denominator_control"] == 2 and by_mode.loc["compiled", "upstream"] == 2
    assert by_mode.loc["eager", "denominator_control"] == 2


def test_crash_table_groups_by_cause_first() -> None:
    t = cov.crash_table(_attributed())
    assert list(t.columns) == cov.CRASH_COLUMNS
    # backend groups first, then upstream, then rows without a control (timeouts); the two "immutable list"
    # failures differ in error type, so they are two backend groups
    assert list(t["cause"]) == ["backend", "backend", "upstream", ""]
    assert t.iloc[2]["entries"] == 2
    md = cov.coverage_markdown(_attributed())
    assert "**crash-free where the control works**: 25.0% (1/4) (2 run failures are `upstream`" in md
    assert "| cause | entries |" in md and "| upstream | 2 | 2 |" in md


def test_frames_without_a_cause_column_still_work(demo: pd.DataFrame) -> None:
    h = cov.headline(demo.drop(columns=["cause", "control_error"]))
    assert h.crash_free == h.crash_free_control and h.upstream == 0
    assert set(cov.crash_table(demo.drop(columns="cause"))["cause"]) == {""}


def test_train_rows_have_their_own_figures_and_every_row_its_performance(tmp_path) -> None:
    """coverage.md with both phases: a headline per phase, coverage by phase/mode and by task per phase, and the
    performance section (medians per phase/mode, the slowest rows, rows that recompile after warmup)."""
    perf = {"first_run_s": 2.0, "warmup_s": 1.0, "run_s": 0.5, "peak_rss_mb": 900.0, "warmup_steps": 1}
    rows = [row("m/a", mode="eager", wall_s=3.0, **perf), row("m/b", mode="eager", wall_s=5.0, **perf),
            row("m/a", phase="train", mode="eager", wall_s=40.0, **perf),
            row("m/b", phase="train", mode="eager", status="fail_to_run", error_type="RuntimeError",
                error_message="step 1 optimizer: boom", failed_at="step 1 optimizer", wall_s=1.0),
            row("m/a", phase="train", mode="compiled", status="fail_accuracy", wall_s=60.0,
                recompiles="recompiles", **{**perf, "run_s": 1.5})]
    df = read_results_csv(write_run(tmp_path / "run", rows) / "results.csv")
    md = cov.coverage_markdown(df)
    assert "- **inference**: crash-free 100.0% (2/2)" in md
    assert "- **train**: crash-free 66.7% (2/3)" in md and "numerics-match 50.0% (1/2)" in md
    assert "| train/eager | 50.0% (1/2) |" in md and "| train/compiled | 100.0% (1/1) |" in md
    assert "## By task family (train)" in md and "## By task family (inference)" in md
    perf_md = md.split("## Performance")[1]
    # medians over the rows that ran to the end; the failed train row's wall time is not a step's
    assert "| train/eager | 1 | 2 | 1 | 0.5 | 900 | 40 | 0 |" in perf_md
    assert "| train/compiled | 1 | 2 | 1 | 1.5 | 900 | 60 | 1 |" in perf_md
    slowest = perf_md.split("### Slowest rows")[1].splitlines()
    assert slowest[4].startswith("| `m/a` | train/compiled | fail_accuracy |") and "recompiles" in slowest[4]
    # an inference-only frame keeps the one headline and the mode table
    inf = cov.coverage_markdown(df[df["phase"] == "inference"])
    assert "- **inference**" not in inf and "## By mode\n\n| mode |" in inf and "(train)" not in inf
