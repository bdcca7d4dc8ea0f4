"""hf-tpu diagnose on a train row: a backward lowering off by 1% is named (parameter, ATen op, stage) in eager and
compiled mode; a correct model passes; a backward op that raises is named with its stage."""

from __future__ import annotations

import pytest

from harness.diagnose.train import diagnose_train_built
from harness.sweep import testzoo

MM = "mm"  # the Linear layers' forward is addmm, their backward mm: scaling mm breaks the backward only


def _entry():
    (entry,) = testzoo.parse_spec("test:pass")
    return entry, entry.build(seed=0)


def _base(op) -> str:
    return op._schema.name.split("::")[-1]


def _scaled_mm(factor: float):
    from hf_tpu import hooks

    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * factor) if _base(op) == MM else None

    return hooks.override_lowerings(replace)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_wrong_backward_lowering_is_named_with_its_parameter(mode, tmp_path):
    entry, built = _entry()
    with _scaled_mm(1.01):  # 1%: the size of fault the sweep's canary must catch
        d = diagnose_train_built(built, entry, mode, out_dir=tmp_path)
    assert d.status == "fail_accuracy", d.summary
    assert d.phase == "train"
    # fc2 is nearest the loss: its weight's gradient is the first the backward pass gets wrong
    assert d.located_parameter == "fc2.weight", d.summary
    assert d.located_module == "fc2" and d.module_class == "Linear"
    assert d.located_op == "aten::mm.default", d.summary
    assert "stage: backward" in d.notes, d.notes
    assert d.row_fields()["located_module"] == "fc2.weight"
    assert (tmp_path / "diagnosis.md").read_text().count("fc2.weight") >= 1
    assert d.repro_path and (tmp_path / "repro.py").exists()


def test_a_correct_model_passes(tmp_path):
    entry, built = _entry()
    d = diagnose_train_built(built, entry, "eager", out_dir=tmp_path)
    assert d.status == "pass", d.summary
    assert not d.located_op and not d.located_parameter


def test_a_backward_op_that_raises_is_named_with_its_stage(tmp_path):
    from hf_tpu import hooks

    def replace(op, fn):
        if _base(op) != MM:
            return None

        def broken(*a, **k):
            raise NotImplementedError("deliberately broken: mm")

        return broken

    entry, built = _entry()
    with hooks.override_lowerings(replace):
        d = diagnose_train_built(built, entry, "eager", out_dir=tmp_path)
    assert d.status == "fail_to_run", d.summary
    assert d.located_op == "aten::mm.default", d.summary
    assert "failed at step 1 backward" in d.notes
    assert "float32[" in d.summary


def test_the_float64_reference_is_kept_when_a_gradient_is_null():
    # a gradient zero in exact arithmetic (float32 noise; float64's 1e-10 of it) is left out of both sides:
    # the reference stays valid for the others (it was refused: "no float64 counterpart of the same shape")
    import torch

    from harness.diagnose.diagnosis import Diagnosis
    from harness.diagnose.train import _Step, _valid_reference
    from harness.sweep.numerics import Tolerance

    ref, f64 = _Step(), _Step()
    ref.loss, f64.loss = torch.tensor(1.5), torch.tensor(1.5, dtype=torch.float64)
    ref.grads = {"w": torch.tensor([0.25, -0.5]), "key_bias": torch.tensor([3e-8, -2e-8])}
    f64.grads = {"w": torch.tensor([0.25, -0.5], dtype=torch.float64),
                 "key_bias": torch.tensor([3e-18, -2e-18], dtype=torch.float64)}
    d = Diagnosis(entry_id="x", mode="eager", status="")
    assert _valid_reference(ref, f64, Tolerance(1e-4), d) is f64, d.notes
    assert not d.notes
    f64.grads["w"] = torch.tensor([0.5, -0.5], dtype=torch.float64)  # a reference that took another path
    assert _valid_reference(ref, f64, Tolerance(1e-4), d) is None and "invalid" in d.notes[0]
