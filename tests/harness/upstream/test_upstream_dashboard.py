"""The dashboard shows `hf-tpu upstream-tests` results found in the run directory."""

from __future__ import annotations

from pathlib import Path

from harness.ci.sample import demo_rows, write_run
from harness.cli import main
from harness.upstream import table


def _rec(nodeid: str, outcome: str, **kw: object) -> dict:
    return {"nodeid": nodeid, "when": "call", "outcome": outcome, "xfail": False, "duration": 1.0, **kw}


def test_dashboard_has_the_upstream_section(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", demo_rows())
    base = "tests/models/bert/test_modeling_bert.py::BertModelTest::"
    cpu = [_rec(base + n, "passed") for n in ("test_a", "test_b", "test_c")]
    tpu = [_rec(base + "test_a", "passed"),
           _rec(base + "test_b", "failed", error_type="TpuOpError", op="aten::mean.dim",
                message="aten::mean.dim failed on tpu: TypeError: unexpected keyword argument 'dtype'"),
           _rec(base + "test_c", "failed", error_type="WorkerCrash", op="", message="worker died")]
    (run / "upstream").mkdir()
    table.write(run / "upstream", table.build(cpu, tpu))  # where the nightly puts it
    assert main(["report", str(run), "--out", str(tmp_path / "d.html")]) == 0
    page = (tmp_path / "d.html").read_text()
    assert 'id="upstream"' in page and 'id="upstream-share">33.3% (1/3)' in page
    assert "aten::mean.dim" in page and "WorkerCrash" in page and "BertModelTest::test_b" in page


def test_dashboard_without_upstream_results_has_no_section(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", demo_rows())
    assert main(["report", str(run), "--out", str(tmp_path / "d.html")]) == 0
    assert 'id="upstream"' not in (tmp_path / "d.html").read_text()
