"""Tensor-parallel rows (harness/sweep/tensor_parallel.py, `hf-tpu sweep --tp 2`).

Fast: a model without a tp plan is `skipped` as not applicable and counted apart, without starting ranks; the
verdict catches one rank's wrong logits; the CLI's --tp. Slow (two rank processes each start torch and JAX,
~2 min on this machine): a tiny Llama's tp2 row passes against CPU and the single-device run, and a wrong
all_reduce result in the ranks is fail_accuracy with cause `backend` (the CPU control with gloo passes)."""

from __future__ import annotations

import argparse

import pytest
import torch

from harness.sweep import numerics, tensor_parallel
from harness.sweep.options import SweepOptions


def _tol():
    return numerics.tolerance_for("x", "highest", "float32")


def test_model_without_tp_plan_is_not_applicable_and_counted_apart():
    import transformers

    from harness.sweep.results import to_frame

    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    assert not config.base_model_tp_plan
    built = argparse.Namespace(model=transformers.GPT2LMHeadModel(config), inputs={}, call=None)
    asked = []
    row = tensor_parallel.run_tp_mode("tp2", built, {}, None, lambda: asked.append(1), SweepOptions(), _tol())
    assert row["status"] == "skipped"
    assert row["error_message"].startswith("not applicable: no tensor-parallel plan (GPT2Config")
    assert not asked  # no single-device run, no ranks, for a model that cannot be split

    rows = [{"entry_id": "a", "mode": "tp2", "status": "skipped", "error_message": row["error_message"]},
            {"entry_id": "b", "mode": "tp2", "status": "pass"},
            {"entry_id": "c", "mode": "tp2", "status": "skipped", "error_message": "excluded by tolerances"},
            {"entry_id": "b", "mode": "eager", "status": "pass"}]
    s = tensor_parallel.summary(to_frame(rows))
    assert s["rows"] == 3 and s["no_tp_plan"] == 1 and s["with_plan"] == {"pass": 1, "skipped": 1}


def test_judge_catches_one_rank_off_and_passes_equal_logits():
    g = torch.Generator().manual_seed(0)
    ref = {"logits": torch.randn(2, 8, 99, generator=g), "past_key_values.0": torch.randn(2, 4, 8, 8, generator=g)}
    fp64 = {k: v.double() for k, v in ref.items()}
    tol = _tol()
    # the split model's cache holds each rank's own heads: a shape that differs is not compared
    same = {"logits": ref["logits"].clone(), "past_key_values.0": ref["past_key_values.0"][:, :2].clone()}
    row = tensor_parallel.judge(ref, dict(ref), [same, same], fp64, tol)
    assert row["status"] == "pass", row
    assert "compared: logits" in row["error_message"]

    wrong = {"logits": ref["logits"] * 1.01}  # as an all-reduce result 1% off on one rank
    row = tensor_parallel.judge(ref, dict(ref), [same, wrong], fp64, tol)
    assert row["status"] == "fail_accuracy" and row["error_type"] == "AccuracyError"
    assert "rank 1 vs cpu" in row["error_message"] and "rank 1 vs single-device tpu" in row["error_message"]
    assert "rank 0" not in row["error_message"]
    assert row["max_abs_err"] > 1e-3  # the metric columns are the worst rank's

    # no single-device output (its run failed): judged against CPU alone, and the row says so
    row = tensor_parallel.judge(ref, None, [same, same], fp64, tol)
    assert row["status"] == "pass" and "compared with cpu only" in row["error_message"]


def _options(*argv):
    from harness.sweep.cli import add_arguments, build_options

    p = argparse.ArgumentParser()
    add_arguments(p)
    return build_options(p.parse_args(list(argv)))


def test_cli_tp_adds_the_mode(tmp_path):
    from harness.sweep.cli import BadInput

    assert _options("--tp", "2", "--out", str(tmp_path / "a")).modes == ("eager", "tp2")
    assert _options("--tp", "2", "--modes", "compiled", "--out", str(tmp_path / "b")).modes == ("compiled", "tp2")
    with pytest.raises(BadInput, match="bad --tp 3"):
        _options("--tp", "3", "--out", str(tmp_path / "c"))
    with pytest.raises(BadInput, match="inference only"):
        _options("--tp", "2", "--phases", "train", "--out", str(tmp_path / "d"))


def _llama_tp_row(tmp_path, env=None):
    from harness.sweep.results import check_writable, read_csv, validate
    from harness.sweep.sweep import run_sweep

    opts = SweepOptions(zoo="smoke", match="llama/LlamaForCausalLM$", modes=("eager", "tp2"), out=str(tmp_path),
                        run_id="t", timeout=600, progress="none", repeats=0, env=env or {})
    check_writable(tmp_path)
    run_sweep(opts)
    df = read_csv(tmp_path / "results.csv")
    assert validate(df) == []
    rows = {r["mode"]: r for r in df.to_dict("records")}
    assert rows["eager"]["status"] == "pass"
    return rows["tp2"]


@pytest.mark.slow
def test_tiny_llama_tp2_row_passes(tmp_path):
    row = _llama_tp_row(tmp_path)
    assert row["status"] == "pass", row["error_message"]
    assert "vs single-device tpu" in row["error_message"]
    assert "parameters sharded on tpu:0" in row["error_message"]
    assert not row["error_message"].startswith("0 of")
    assert row["rel_rmse"] < 1e-5


@pytest.mark.slow
def test_wrong_collective_result_is_fail_accuracy_with_cause_backend(tmp_path):
    from harness.sweep.tp_child import FAULT_ENV

    row = _llama_tp_row(tmp_path, env={FAULT_ENV: "1.01"})
    assert row["status"] == "fail_accuracy", row
    assert "rank 0 vs cpu" in row["error_message"]
    assert row["cause"] == "backend", row["control_error"]  # Transformers' TP on CPU with gloo passes


def test_a_timed_out_rank_says_where_it_waited(tmp_path):
    """The rank's faulthandler dump (tp_child's dump_after) names the frame the main thread was stuck in."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "tp_child.py"  # the name stuck_at looks for in the main thread's frames
    script.write_text(textwrap.dedent("""
        import faulthandler, threading, time
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()  # another thread in the dump
        def wait_in_collective():
            time.sleep(3)
        faulthandler.dump_traceback_later(0.5, exit=True)
        wait_in_collective()
    """))
    log = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60).stderr
    where = tensor_parallel.stuck_at(log)
    assert where.startswith("wait_in_collective (tp_child.py:"), (where, log)  # innermost Python frame first
    assert "<module> (tp_child.py:" in where
    assert tensor_parallel.stuck_at("no dump here") == ""


def test_a_worker_dying_in_the_tp2_phase_costs_the_tp2_row_only():
    """The tp2 phase is the backend's: a death there is that row's timeout, not the CPU baseline's fault."""
    from harness.sweep import testzoo
    from harness.sweep.worker import Death, Task, resolve_death

    (entry,) = testzoo.parse_spec("test:pass")
    task = Task(entry, ("eager", "tp2"))
    rows, cont = resolve_death(task, [{"mode": "eager", "status": "pass"}], Death("timeout", "tp2", -9),
                               SweepOptions(timeout=7))
    assert [(r["mode"], r["status"], r["error_message"]) for r in rows] == [("tp2", "timeout", "timeout after 7 s")]
    assert cont is None


def test_a_control_out_of_time_gives_no_cause(tmp_path, monkeypatch):
    """A CPU control that times out proves nothing about Transformers' plan (the row stays without a cause);
    one that fails does (upstream)."""
    got = {}
    for status, error_type in (("timeout", "Timeout"), ("fail_to_run", "ValueError")):
        def fake_launch(workdir, n, timeout, device, status=status, error_type=error_type):
            raise tensor_parallel.RankFailure(status, error_type, "boom")

        monkeypatch.setattr(tensor_parallel, "launch", fake_launch)
        got[status] = tensor_parallel.control(tmp_path, 2, 10.0, {}, None, _tol())
    assert got["timeout"]["cause"] == "" and got["timeout"]["control_error"].startswith("control did not finish")
    assert got["fail_to_run"] == {"cause": "upstream", "control_error": "ValueError: boom"}
