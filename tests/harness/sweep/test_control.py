"""Attribution of failing rows by a control run (harness/sweep/control.py) and the `cause` column: the test
entries `compile` (only the backend refuses it: cause=backend) and `opaque` (a custom op without a fake kernel:
aot_eager on CPU fails too, cause=upstream), in process and through a sweep's worker."""

from __future__ import annotations

from harness.sweep import control, testzoo
from harness.sweep.device import get_device
from harness.sweep.runner import run_entry
from harness.sweep.worker import Death, Task, merge_cause, resolve_death


def _rows(kind: str, opts, device: str = "cpu") -> dict:
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    rows: list[dict] = []

    def emit(k, p):
        if k == "row":
            rows.append(p)
        elif k == "cause":
            merge_cause(rows, p)

    run_entry(entry, ("eager", "compiled"), opts, get_device(device), emit)
    return {r["mode"]: r for r in rows}


def test_backend_only_failure_is_cause_backend(cpu_opts) -> None:
    rows = _rows("compile", cpu_opts)
    assert rows["eager"]["status"] == "pass" and "cause" not in rows["eager"]
    assert rows["compiled"]["status"] == "compile_fail"
    assert rows["compiled"]["cause"] == "backend" and rows["compiled"]["control_error"] == ""


def test_failure_under_aot_eager_too_is_cause_upstream(cpu_opts) -> None:
    rows = _rows("opaque", cpu_opts)
    assert rows["eager"]["status"] == "pass"
    assert rows["compiled"]["status"] == "compile_fail"
    assert rows["compiled"]["cause"] == "upstream"
    assert "fake tensor" in rows["compiled"]["control_error"]


def test_eager_failure_is_the_backends(cpu_opts) -> None:
    rows = _rows("raise", cpu_opts)  # eager: the CPU baseline is the control, and it ran
    assert rows["eager"]["status"] == "fail_to_run" and rows["eager"]["cause"] == "backend"


def test_a_worker_dying_in_the_control_keeps_the_row(cpu_opts) -> None:
    (entry,) = testzoo.parse_spec("test:compile")
    task = Task(entry, ("eager", "compiled"))
    sent = [{"mode": "eager", "status": "fail_to_run"}]
    rows, cont = resolve_death(task, sent, Death("crash", "control", -11), cpu_opts)
    assert rows == [] and cont.modes == ("compiled",)  # the eager row stays; compiled runs on a fresh worker


def test_sweep_through_workers_writes_cause(tmp_path) -> None:
    from harness.sweep.options import SweepOptions
    from harness.sweep.results import check_writable, read_csv
    from harness.sweep.sweep import run_sweep

    opts = SweepOptions(zoo="test:compile,opaque,pass", device="cpu", out=str(tmp_path / "run"), run_id="t",
                        timeout=60, memory_cap_gb=2, progress="none", repeats=1, jobs=1)
    check_writable(opts.out)  # as the CLI does before a run
    run_sweep(opts)
    df = read_csv(tmp_path / "run" / "results.csv").set_index(["entry_id", "mode"])
    assert df.loc[("test/compile", "compiled"), "cause"] == "backend"
    assert df.loc[("test/opaque", "compiled"), "cause"] == "upstream"
    assert df.loc[("test/pass", "compiled"), "cause"] == ""
    md = (tmp_path / "run" / "coverage.md").read_text()
    # 6 rows, 2 run failures, 1 of them upstream
    assert "**crash-free**: 66.7% (4/6)" in md and "**crash-free where the control works**: 80.0% (4/5)" in md
    crashes = (tmp_path / "run" / "crashes.md").read_text()
    assert crashes.index("| backend |") < crashes.index("| upstream |")


def test_compiled_accuracy_failure_under_aot_eager_too_is_cause_upstream(cpu_opts) -> None:
    """A model that computes something else while Dynamo traces it (Aimv2's and PaliGemma's masks in
    Transformers): no backend can match its eager baseline compiled, and the control says so."""
    rows = _rows("tracediff", cpu_opts)
    assert rows["eager"]["status"] == "pass" and "cause" not in rows["eager"]
    assert rows["compiled"]["status"] == "fail_accuracy"
    assert rows["compiled"]["cause"] == "upstream"
    assert rows["compiled"]["control_error"].startswith("aot_eager on CPU fails the rule too: logits")


def test_compiled_accuracy_failure_of_the_backend_only_is_cause_backend(cpu_opts) -> None:
    rows = _rows("perturb", cpu_opts)  # +1e-2 on the backend only: aot_eager on CPU matches the baseline
    assert rows["compiled"]["status"] == "fail_accuracy"
    assert rows["compiled"]["cause"] == "backend" and rows["compiled"]["control_error"] == ""
    assert rows["eager"]["status"] == "fail_accuracy" and "cause" not in rows["eager"]  # no control in eager


def test_control_traces_through_the_modes_shared_draws() -> None:
    """VITS: with the shared-draws TorchFunctionMode active, Dynamo fails on NumPy arithmetic in a forward
    (`'ndarray' object has no attribute 'sub'`, a Dynamo bug). The compiled mode runs inside that mode, so its
    control must too: without it the control worked and the row was wrongly the backend's."""
    import numpy as np
    import torch

    from harness.sweep.draws import shared_draws
    from harness.zoo.entry import BuiltEntry

    class NumpyConst(torch.nn.Module):
        def forward(self, x):
            return x * float(np.log(np.exp(1 - 1e-3) - 1))

    built = BuiltEntry(model=NumpyConst(), inputs={"x": torch.ones(3)})
    assert control.run_control(built) is None
    exc = control.run_control(built, context=lambda: shared_draws(0))
    assert exc is not None and "fake tensor" in str(exc)


def test_model_that_draws_nothing_compiles_outside_the_shared_draws(cpu_opts) -> None:
    """LightGlue: NumPy arithmetic in a forward made compiled mode fail under the shared-draws mode (a Dynamo
    bug), though the model draws nothing; outside the mode it compiles and passes."""
    rows = _rows("numpy", cpu_opts)
    assert rows["compiled"]["status"] == "pass", rows["compiled"].get("error_message")
    assert rows["compiled"]["drew"] == ""


def _train_rows(kind: str, tmp_path) -> dict:
    from harness.sweep.options import SweepOptions

    opts = SweepOptions(zoo=f"test:{kind}", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",))
    return _rows(kind, opts, "tpu")


def test_compiled_train_accuracy_failure_under_aot_eager_too_is_cause_upstream(tmp_path) -> None:
    """Aimv2Model and ColPaliForRetrieval's compiled train rows: their loss differs under tracing on CPU with
    aot_eager as on tpu (Transformers builds the mask another way under Dynamo). The train phase had no
    accuracy control, and the rows read as a tpu error."""
    rows = _train_rows("tracediff", tmp_path)
    assert rows["eager"]["status"] == "pass" and "cause" not in rows["eager"]
    assert rows["compiled"]["status"] == "fail_accuracy"
    assert rows["compiled"]["cause"] == "upstream"
    assert rows["compiled"]["control_error"].startswith("aot_eager on CPU fails the rule too: loss.step1")


def test_compiled_train_accuracy_failure_of_the_backend_only_is_cause_backend(tmp_path) -> None:
    rows = _train_rows("perturb", tmp_path)  # +1e-2 on the device only: aot_eager on CPU trains as the baseline
    assert rows["compiled"]["status"] == "fail_accuracy"
    assert rows["compiled"]["cause"] == "backend" and rows["compiled"]["control_error"] == ""
    assert rows["eager"]["status"] == "fail_accuracy" and "cause" not in rows["eager"]  # no control in eager
