"""The crash and numerics tables group by the op `hf-tpu sweep --diagnose` located (harness/ci/coverage.py)."""

from __future__ import annotations

from harness.ci import coverage as cov
from harness.ci.runs import read_results_csv
from harness.ci.sample import row, write_run


def frame(tmp_path, rows):
    return read_results_csv(write_run(tmp_path / "r", rows) / "results.csv")


def test_crash_table_groups_by_located_op(tmp_path) -> None:
    df = frame(tmp_path, [
        # the same missing lowering, located by diagnose in two models' modules
        row("a", status="fail_to_run", error_type="NoLowering", failing_op="aten::erfinv.default",
            error_message="hf_tpu: no JAX lowering for aten::erfinv.default on tpu",
            located_op="aten::erfinv.default", located_module="encoder.layer.0.act"),
        row("b", status="compile_fail", mode="compiled", error_type="NoLowering", failing_op="aten::erfinv.default",
            error_message="hf_tpu: no JAX lowering for aten::erfinv.default on tpu",
            located_op="aten::erfinv.default", located_module="decoder.mlp"),
        # a Python-level error the sweep could not name an op for; diagnose located the op it came from
        row("c", status="fail_to_run", error_type="TpuOpError", failing_op="",
            error_message="index out of range in self", located_op="aten::index.Tensor", located_module="embed"),
        row("d", status="fail_to_run", error_type="TpuOpError", failing_op="aten::index.Tensor",
            error_message="index out of range in self"),
    ])
    t = cov.crash_table(df)
    assert list(t.columns) == cov.CRASH_COLUMNS
    first = t.iloc[0]
    assert first["entries"] == 2 and first["located_op"] == "aten::erfinv.default"
    assert set(first["located_modules"].split(", ")) == {"encoder.layer.0.act", "decoder.mlp"}
    idx = t[t["failing_op"].str.contains("aten::index.Tensor")]
    assert len(idx) == 1 and idx.iloc[0]["entries"] == 2  # c (located) and d (failing_op) are one cause
    md = cov.coverage_markdown(df)
    assert "| located op | modules |" in md


def test_numerics_grouped_by_located_op(tmp_path) -> None:
    df = frame(tmp_path, [
        row("a", status="fail_accuracy", max_rel_err=0.02, cosine=0.99, located_op="aten::gelu.default",
            located_module="mlp.act"),
        row("b", status="fail_accuracy", max_rel_err=0.5, cosine=0.9, located_op="aten::gelu.default",
            located_module="ffn.act"),
        row("c", status="fail_accuracy", max_rel_err=0.1, cosine=0.95, located_module="attn"),
        row("d", status="pass"),
    ])
    t = cov.numerics_by_op(df)
    assert list(t["located_op"]) == ["aten::gelu.default", ""]
    assert t.iloc[0]["entries"] == 2 and t.iloc[0]["max_rel_err"] == 0.5 and t.iloc[0]["cosine"] == 0.9
    w = cov.worst_numerics(df)
    assert w.iloc[0]["located_op"] == "aten::gelu.default" and w.iloc[0]["located_module"] == "ffn.act"
    md = cov.coverage_markdown(df)
    assert "## Accuracy failures by located op (2)" in md and "(not located)" in md


def test_tables_unchanged_without_diagnosis(tmp_path) -> None:
    df = frame(tmp_path, [row("a", status="fail_to_run", error_type="E", failing_op="aten::x.default",
                              error_message="boom"),
                          row("b", status="fail_accuracy", max_rel_err=0.1)])
    md = cov.coverage_markdown(df)
    assert "located op" not in md and "Accuracy failures by located op" not in md
    assert cov.crash_table(df).iloc[0]["failing_op"] == "aten::x.default"


def test_cli_unknown_entry_exits_2(capsys) -> None:
    from harness.cli import main

    assert main(["diagnose", "test/no_such_kind"]) == 2
    assert "unknown test entry" in capsys.readouterr().err
