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


def _from_tpu_call(built, n: int, replace):
    """`built` whose call enters hooks.override_lowerings(replace) at its n-th call on tpu and stays in it:
    a lowering that goes wrong from step n of the tpu run on (the override takes effect on entry)."""
    import contextlib
    from dataclasses import replace as with_field

    from hf_tpu import hooks

    stack, calls, real = contextlib.ExitStack(), [], built.call

    def call(model, inputs):
        if any(getattr(v, "device", None) is not None and v.device.type == "tpu" for v in inputs.values()):
            calls.append(1)
            if len(calls) == n:
                stack.enter_context(hooks.override_lowerings(replace))
        return real(model, inputs)

    return with_field(built, call=call), stack


def _mm_replace(factor: float):
    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * factor) if _base(op) == MM else None

    return replace


def test_a_backward_wrong_from_step_2_on_is_named_with_its_step(tmp_path):
    """mm (the Linear layers' backward) 1% off from step 2's tpu call on: step 1 agrees, and Adam's
    normalisation hides a gradient's scale from the row's own tensors (losses, final weights), so judged on
    step 1 alone the row diagnosed as a pass. Every step replayed, step 2's gradient nearest the loss is named,
    with the op."""
    entry, built = _entry()
    faulty, stack = _from_tpu_call(built, 2, _mm_replace(1.01))
    with stack:
        d = diagnose_train_built(faulty, entry, "eager", out_dir=tmp_path)
    assert d.status == "fail_accuracy", d.summary
    assert (d.located_step, d.located_tensor) == (2, "grad.fc2.weight"), d.summary
    assert d.located_parameter == "fc2.weight" and "stage: backward" in d.notes, d.notes  # the op's stage
    assert "first diverging stage: step 2 backward" in d.notes, d.notes
    assert d.located_op == "aten::mm.default", d.summary
    assert d.summary.startswith("step 2 backward: grad.fc2.weight diverges first"), d.summary
    assert "step 2: grad.fc2.weight" in (tmp_path / "diagnosis.md").read_text()


class _LrOnce:
    """make_optimizer for train.py: on tpu, AdamW whose `n`-th step uses lr x `factor` (one wrong update)."""

    def __init__(self, n: int, factor: float):
        from harness.sweep import train

        self.n, self.factor, self.real = n, factor, train.make_optimizer

    def __call__(self, params, device):
        import torch

        from harness.sweep import train

        if device != "tpu":
            return self.real(params, device)
        n, factor = self.n, self.factor

        class Wrong(torch.optim.AdamW):
            steps = 0

            def step(self, closure=None):
                self.steps += 1
                lr = self.param_groups[0]["lr"]
                self.param_groups[0]["lr"] = lr * (factor if self.steps == n else 1.0)
                try:
                    return super().step(closure)
                finally:
                    self.param_groups[0]["lr"] = lr

        return Wrong(params, lr=train.LR, foreach=True), f"AdamW foreach, step {n} wrong"


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_wrong_optimizer_update_at_step_2_is_named_as_the_optimizers(mode, tmp_path, monkeypatch):
    """Step 2's update with a 5% larger lr on tpu: losses and gradients of steps 1-2 agree, the weights after
    step 2 do not; the optimizer replayed alone on CPU's gradients and weights confirms it is the update."""
    from harness.sweep import train

    entry, built = _entry()
    monkeypatch.setattr(train, "make_optimizer", _LrOnce(2, 1.05))
    d = diagnose_train_built(built, entry, mode, out_dir=tmp_path)
    assert d.status == "fail_accuracy", d.summary
    assert d.located_step == 2 and d.located_tensor.startswith("weight."), d.summary
    assert "first diverging stage: step 2 optimizer" in d.notes, d.notes
    assert d.summary.startswith(f"step 2 optimizer: {d.located_tensor} diverges first"), d.summary
    assert "tpu's optimizer update is wrong" in d.summary, d.summary
    assert not d.located_op  # an optimizer, not an op of the model's graph


@pytest.mark.parametrize("kind,mode", [("pass", "compiled"), ("zerobias", "eager"), ("nullmove", "eager")])
def test_clean_rows_with_every_step_replayed_pass(kind, mode, tmp_path):
    """Every step's gradients and weights judged too: noise Adam amplifies (a zero-initialised bias), a frozen
    null parameter and a compiled row still pass."""
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    d = diagnose_train_built(entry.build(seed=0), entry, mode, out_dir=tmp_path)
    assert d.status == "pass", (d.summary, d.notes)
    assert not d.located_tensor and not d.located_op


def test_the_compiled_walk_does_not_name_an_uninitialised_output(tmp_path):
    """An `empty_like` the forward then fills (a buffer written by copy_) differs between CPU and tpu by its
    garbage: the graph walk named it, not the wrong op (Aimv2Model compiled: aten::empty_like in its backward
    graph). Its values are not compared; the 1% wrong mm of the backward is named."""
    import types

    import torch
    from torch import nn

    from harness.diagnose.ops import _UNINITIALISED
    from hf_tpu import hooks

    class Filled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            h = torch.empty_like(self.fc1(x)).copy_(self.fc1(x))
            return {"logits": self.fc2(torch.nn.functional.gelu(h))}

    def replace(op, fn):
        if _base(op) in _UNINITIALISED:  # tpu's garbage: never CPU's
            return lambda *a, **k: fn(*a, **k) * 0 + 12345.0
        return (lambda *a, **k: fn(*a, **k) * 1.01) if _base(op) == MM else None

    torch.manual_seed(0)
    built = types.SimpleNamespace(model=Filled().eval(), inputs={"x": torch.randn(4, 16)}, call=lambda m, i: m(**i))
    entry, _ = _entry()
    with hooks.override_lowerings(replace):
        d = diagnose_train_built(built, entry, "compiled", out_dir=tmp_path)
    assert d.status == "fail_accuracy", d.summary
    assert d.located_op == "aten::mm.default", d.summary
