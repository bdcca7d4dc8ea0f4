"""One entry's runs, in this process, with the cpu stand-in as the backend (no worker, no device)."""

import pytest

from harness.sweep import testzoo
from harness.sweep.device import get_device
from harness.sweep.runner import run_entry


def _run(kind, opts, modes=("eager", "compiled")):
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    events = []
    run_entry(entry, modes, opts, get_device("cpu"), lambda k, p: events.append((k, p)))
    phases = [p for k, p in events if k == "phase"]
    rows = {p["mode"]: p for k, p in events if k == "row"}
    return phases, rows


@pytest.mark.parametrize("kind", ["pass", "raise", "perturb", "baseline", "missing", "compile"])
def test_in_process_statuses(kind, cpu_opts):
    phases, rows = _run(kind, cpu_opts)
    expected = testzoo.EXPECTED_STATUS[kind]
    assert rows["compiled"]["status"] == expected
    assert rows["eager"]["status"] == ("pass" if kind == "compile" else expected)
    if kind == "pass":
        assert phases == ["build", "baseline", "reference", "eager", "compiled"]
    if kind == "perturb":  # a compiled accuracy failure's control (aot_eager on CPU, judged by the rule)
        assert phases == ["build", "baseline", "reference", "eager", "compiled", "control"]
    if kind == "raise":  # each failing row's control runs after the row
        assert phases == ["build", "baseline", "reference", "eager", "control", "compiled", "control"]
    if kind == "compile":
        assert phases == ["build", "baseline", "reference", "eager", "compiled", "control"]
    if kind == "pass":
        r = rows["compiled"]
        # float32 noise only: the baseline runs ATen's own kernels (cpu_reference), the cpu backend oneDNN's
        assert r["max_abs_err"] < 1e-6 and r["cosine"] > 1 - 1e-9 and r["first_run_s"] > 0 and r["compile_s"] >= 0
        assert r["compilations"] >= 1 and r["graph_breaks"] == 0
    if kind == "raise":
        assert rows["eager"]["failing_op"] == "aten::foo.default"
        assert rows["eager"]["error_type"] == "NotImplementedError"
    if kind == "compile":
        assert rows["compiled"]["failing_op"] == "aten::cosh.default"
    if kind == "perturb":
        assert rows["eager"]["max_abs_err"] == pytest.approx(1e-2, rel=1e-3) and rows["eager"]["rmse_ratio"] > 2
    if kind == "baseline":
        assert phases == ["build", "baseline"] and rows["eager"]["error_type"] == "ValueError"
    if kind == "missing":
        assert "not cached" in rows["eager"]["error_message"]


def test_skip_override_and_bfloat16(cpu_opts, tmp_path):
    p = tmp_path / "tol.yaml"
    p.write_text('entries:\n  "test/pass":\n    skip: known flaky\n')
    from harness.sweep.numerics import load_overrides

    (entry,) = testzoo.parse_spec("test:pass")
    events = []
    run_entry(entry, ("eager",), cpu_opts, get_device("cpu"), lambda k, v: events.append((k, v)),
              overrides=load_overrides(p))
    assert [v["status"] for k, v in events if k == "row"] == ["skipped"]
    cpu_opts.dtype = "bfloat16"
    _, rows = _run("pass", cpu_opts, modes=("eager",))
    assert rows["eager"]["status"] == "pass" and rows["eager"]["dtype"] == "bfloat16"


def test_compiled_pipeline_compiles_its_denoiser_and_matches_cpu(tmp_path):
    """A Diffusers pipeline's compiled mode compiles the denoiser (as Diffusers documents), not __call__."""
    from harness.sweep.options import SweepOptions
    from harness.zoo import load_zoo

    (entry,) = [e for e in load_zoo("smoke") if e.id == "diffusers/pipeline/DDPMPipeline"]
    opts = SweepOptions(zoo="smoke", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest")
    events = []
    run_entry(entry, ("compiled",), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    (row,) = [p for k, p in events if k == "row"]
    assert row["status"] == "pass", row
    assert row["compilations"] >= 1 and row["graph_breaks"] == 0


def test_state_from_the_baseline_run_does_not_reach_the_device_runs(tmp_path):
    """A model that caches a weight-derived tensor as a plain attribute at its first forward (Transformers'
    Mimi codebook) ran its CPU baseline on the built model itself, so the tpu copies inherited a CPU tensor
    that `.to("tpu")` does not move: "X1 and X2 must have the same device type" in the full-zoo sweep."""
    from harness.sweep.options import SweepOptions

    (entry,) = testzoo.parse_spec("test:stateful")
    opts = SweepOptions(zoo="test:stateful", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest")
    events = []
    run_entry(entry, ("eager", "compiled"), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    rows = {p["mode"]: p for k, p in events if k == "row"}
    assert rows["eager"]["status"] == "pass", rows["eager"]
    assert rows["compiled"]["status"] == "pass", rows["compiled"]


def test_compile_for_sweep_leaves_plain_calls_whole():
    import torch

    from harness.sweep.runner import compile_for_sweep

    def call(model, inputs):
        return model(**inputs)

    model = torch.nn.Linear(2, 2)
    assert compile_for_sweep(call, model, "tpu") is not call  # a plain model: the whole call is compiled


def test_the_baseline_is_ieee_float32_whatever_the_process_set(cpu_opts):
    """The CPU baseline and float64 reference run inside hf_tpu.precision.cpu_reference even when the
    process runs at "medium" (as a tpu sweep at TorchTPU's default leaves it; oneDNN would then make the
    baseline bfloat16 on an AMX host); the process's setting is back for the backend's runs and afterwards."""
    import dataclasses

    import torch

    (real,) = testzoo.parse_spec("test:pass")
    seen = []

    class Spy:  # the entry, with every call's precision state recorded
        def __getattr__(self, name):
            return getattr(real, name)

        def build(self, seed=0):
            b = real.build(seed=seed)
            call = b.call

            def spy(model, inputs):
                seen.append((torch.get_float32_matmul_precision(), torch.backends.mkldnn.matmul.fp32_precision,
                             torch.backends.mkldnn.enabled))
                return call(model, inputs)

            return dataclasses.replace(b, call=spy)

    entry = Spy()
    before = torch.get_float32_matmul_precision()
    torch._C._set_float32_matmul_precision("medium")
    try:
        events = []
        run_entry(entry, ("eager",), cpu_opts, get_device("cpu"), lambda k, p: events.append((k, p)))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch._C._set_float32_matmul_precision(before)
    assert [p["status"] for k, p in events if k == "row"] == ["pass"]
    baseline, reference, backend = seen[0], seen[1], seen[-1]
    assert baseline == ("highest", "ieee", False) and reference == ("highest", "ieee", False)
    assert backend[0] == "medium"  # the backend's run is the process's business



def test_an_inference_reference_refused_for_the_baselines_rounding_runs_its_rows(cpu_opts, monkeypatch):
    """The inference phase judges such a row by numerics.rounding_dominated; the train phase's nudged run is
    not its business (a copy of it there named the train phase's null parameters: NameError, no rows)."""
    from harness.sweep import numerics

    monkeypatch.setattr(numerics, "reference_valid", lambda *a: (False, "logits: rmse(fp64, cpu) = 0.2 x scale > 0.01"))
    phases, rows = _run("pass", cpu_opts, modes=("eager",))
    assert rows["eager"]["status"] == "pass" and rows["eager"]["reference"].startswith("invalid"), rows
    assert "train-spread" not in phases


def test_a_float64_run_that_raises_says_why_in_the_reference_column(cpu_opts, monkeypatch):
    """Rows without a float64 reference are judged by allclose alone; the column said only "none", so which
    entries lacked one for a fixable reason (FastSpeech2Conformer: a float32 buffer in the float64 run) took a
    rerun to find. coverage.md still counts them as rows without a reference."""
    import contextlib

    import pandas as pd

    from harness.ci import verdicts
    from harness.sweep import float64_ops

    @contextlib.contextmanager
    def raising():
        raise RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Double")
        yield
    monkeypatch.setattr(float64_ops, "kernels", raising)
    _, rows = _run("pass", cpu_opts, modes=("eager",))
    row = rows["eager"]
    assert row["status"] == "pass", row
    assert row["reference"] == ("none: the float64 run raised: RuntimeError: mat1 and mat2 must have the same "
                                "dtype, but got Float and Double"), row
    assert "no float64 reference at all (it raised): 1 rows" in verdicts.verdicts_markdown(pd.DataFrame([row]))


def test_workers_openmp_threads_sleep_when_idle_unless_the_user_set_a_policy(monkeypatch):
    # spinning OpenMP threads took the core from the worker's own work on a loaded machine (worker.py)
    from harness.sweep.options import SweepOptions
    from harness.sweep.worker import worker_environment

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = worker_environment(SweepOptions(jobs=1), threads=2)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["HF_TPU_SWEEP_THREADS"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1"  # the sweep's own variables still there
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_environment(SweepOptions(jobs=1))["OMP_WAIT_POLICY"] == "ACTIVE"
