"""`hf-tpu zoo list` / `zoo check` through the real command-line entry point."""

import io
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
import pytest

from harness.cli import main


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse errors exit
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_list_csv_filters():
    code, out, _ = run(["zoo", "list", "--library", "transformers", "--task", "causal-lm", "--match", "llama/",
                        "--format", "csv"])
    assert code == 0
    df = pd.read_csv(io.StringIO(out))
    assert "transformers/llama/LlamaForCausalLM" in set(df["id"])
    assert set(df["task"]) == {"causal-lm"}


def test_list_table_and_tasks():
    code, out, _ = run(["zoo", "list", "--zoo", "smoke"])
    assert code == 0 and "transformers/llama/LlamaForCausalLM" in out
    code, out, _ = run(["zoo", "list", "--format", "tasks"])
    assert code == 0 and "causal-lm" in out and "total:" in out


@pytest.mark.parametrize("argv, message", [
    (["zoo", "list", "--match", "("], "invalid --match regex"),
    (["zoo", "list", "--task", "no-such-task"], "unknown task family"),
    (["zoo", "list", "--zoo", "nonsense"], "unknown zoo spec"),
    (["zoo", "check", "--limit", "0"], "positive integer"),
    (["zoo", "check", "--jobs", "-1"], "non-negative integer"),
    (["zoo", "list", "--format", "xml"], "invalid choice"),
    (["zoo"], "required"),
])
def test_bad_input_exits_2(argv, message):
    code, _, err = run(argv)
    assert code == 2
    assert message in err


def _check(tmp_path, jobs: str):
    out_csv = tmp_path / "check.csv"
    code, out, _ = run(["zoo", "check", "--zoo", "full", "--match", r"^(transformers/bert/BertModel|diffusers/AutoencoderTiny)$",
                        "--quiet", "--jobs", jobs, "--out", str(out_csv)])
    assert code == 0
    df = pd.read_csv(out_csv)
    assert list(df["id"]) == ["diffusers/AutoencoderTiny", "transformers/bert/BertModel"]
    assert df["ok"].all()
    assert "pass" in out and "total" in out


def test_check_in_process(tmp_path):
    _check(tmp_path, "0")


@pytest.mark.slow  # spawns a worker that imports torch/transformers/diffusers afresh
def test_check_in_worker_processes(tmp_path):
    _check(tmp_path, "2")


def test_check_reports_not_available_rows(tmp_path):
    models = tmp_path / "models.csv"
    models.write_text("model_id\nnobody/nothing\n")
    code, out, _ = run(["zoo", "check", "--zoo", str(models), "--quiet", "--jobs", "0"])
    assert code == 0 and "not_available" in out
