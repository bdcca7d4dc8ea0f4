"""`hf-tpu sweep --diagnose` fills located_module, located_op and repro_path for failing rows."""

from __future__ import annotations

import diagnose_faults
import pytest

from harness.schema import COLUMN_NAMES


@pytest.fixture
def perturbed():
    with diagnose_faults.applied("perturb_gelu"):
        yield


def test_sweep_diagnose_fills_the_columns(perturbed, tmp_path) -> None:
    from harness.sweep.options import SweepOptions
    from harness.sweep.results import check_writable, read_csv
    from harness.sweep.sweep import run_sweep

    opts = SweepOptions(zoo="test:pass,raise", device="tpu", modes=("eager",), executor="inline", diagnose=True,
                        out=str(tmp_path / "run"), run_id="t", repeats=0, progress="none")
    check_writable(tmp_path / "run")  # as the CLI does before any work
    result = run_sweep(opts)
    df = read_csv(result.paths["results"]).set_index("entry_id")
    assert list(df.reset_index().columns) == COLUMN_NAMES
    # the test zoo's `pass` MLP calls gelu in its own forward: the perturbed lowering makes it fail_accuracy
    ok = df.loc["test/pass"]
    assert ok["status"] == "fail_accuracy"
    assert (ok["located_module"], ok["located_op"]) == ("<model>", "aten::gelu.default")
    assert ok["repro_path"].endswith("repro.py") and (tmp_path / "run" / "diagnose").is_dir()
    raised = df.loc["test/raise"]
    assert raised["status"] == "fail_to_run" and raised["located_op"] == "aten::foo.default"
    assert raised["located_module"] == "<model>"
    coverage = (tmp_path / "run" / "coverage.md").read_text()
    assert "## Accuracy failures by located op" in coverage and "aten::gelu.default" in coverage
