"""The train phase's transition check (harness/sweep/train_carry.py): a row the rule fails free-running is
judged step by step from tpu's own state; a conv net whose divergence is only carried passes, and a wrong
step, wherever it is, still fails and is named."""

import pytest

from harness.sweep import testzoo, train, train_carry
from harness.sweep.device import get_device
from harness.sweep.options import SweepOptions
from harness.sweep.runner import run_entry


def _rows(opts, entry, modes=("eager",)) -> dict:
    events = []
    run_entry(entry, modes, opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    return {p["mode"]: p for k, p in events if k == "row"}


def _test_rows(kind, tmp_path, modes=("eager",)) -> dict:
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    opts = SweepOptions(zoo=f"test:{kind}", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",))
    return _rows(opts, entry, modes)


def _checks(monkeypatch) -> list:
    """Spy on the transition checks the rows make (their outcomes)."""
    made = []
    real = train_carry.check_row

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(train_carry, "check_row", spy)
    return made


def test_pplcnet_carried_divergence_passes_judged_step_by_step(tmp_path, monkeypatch):
    """PPLCNetBackbone (the full zoo's tiny config): free-running, tpu's loss.step3 is 24x CPU's distance from
    float64 (Adam turns rounding-size differences of near-zero gradients into lr-size steps, and the later
    steps follow them); each step from tpu's own state agrees with CPU's. Without the check it fails."""
    from harness.sweep.entries import load_entries

    opts = SweepOptions(zoo="full", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=600,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",),
                        match="^transformers/pp_lcnet/PPLCNetBackbone$")
    (entry,) = load_entries(opts)
    made = _checks(monkeypatch)
    row = _rows(opts, entry)["eager"]
    assert row["status"] == "pass" and not row.get("uninformative"), row
    assert row["error_message"].startswith("carried: steps 2..3 each agree from tpu's own state"), row
    assert len(made) == 1 and made[0].ok
    monkeypatch.setattr(train_carry, "check_row", lambda *a, **k: train_carry.Carried(False, "off"))
    row = _rows(opts, entry)["eager"]
    assert row["status"] == "fail_accuracy" and "loss.step3" in row["error_message"], row  # the false alarm


def _mm_wrong(factor):
    """hooks.override_lowerings: mm (the Linear layers' backward only) scaled by `factor`."""
    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * factor) if op.__name__.split(".")[0] == "mm" else None
    return replace


def test_a_wrong_backward_fails_at_step_1_with_or_without_the_check(tmp_path, monkeypatch):
    """mm 1% wrong: step 1's gradients fail against the valid reference, so the row fails without the check's
    runs; made to run anyway, the check fails at step 1 on a gradient."""
    from hf_tpu import hooks

    made = _checks(monkeypatch)
    with hooks.override_lowerings(_mm_wrong(1.01)):
        row = _test_rows("carried", tmp_path / "a")["eager"]
    assert row["status"] == "fail_accuracy" and not made, row
    monkeypatch.setattr(train_carry, "step1_fails", lambda *a: False)
    with hooks.override_lowerings(_mm_wrong(1.01)):
        row = _test_rows("carried", tmp_path / "b")["eager"]
    assert row["status"] == "fail_accuracy", row
    assert len(made) == 1 and (made[0].step, made[0].tensor[:5]) == (1, "grad."), made
    assert row["error_message"].startswith("transition check: step 1 from the initial weights fails (forward and "
                                           "backward) on grad."), row


def test_an_optimizer_that_drops_exp_avg_from_step_2_fails_at_step_2(tmp_path, monkeypatch):
    """tpu's AdamW computes each update right but does not write exp_avg back from step 2 on (state carried
    across steps): from tpu's state after step 1, CPU's step 2 writes exp_avg and tpu's does not."""
    import torch

    make = train.make_optimizer

    def dropping(params, device):
        opt, label = make(params, device)
        if device in (None, "cpu"):
            return opt, label
        step = opt.step

        def stepped(*a, **k):
            kept = {p: st["exp_avg"].clone() for p, st in opt.state.items() if "exp_avg" in st}
            out = step(*a, **k)
            with torch.no_grad():
                for p, m in kept.items():
                    opt.state[p]["exp_avg"].copy_(m)
            return out
        opt.step = stepped
        return opt, label

    made = _checks(monkeypatch)
    monkeypatch.setattr(train, "make_optimizer", dropping)
    row = _test_rows("carried", tmp_path)["eager"]
    assert row["status"] == "fail_accuracy", row
    assert len(made) == 1 and made[0].step == 2 and made[0].tensor.startswith("exp_avg."), made
    assert ("transition check: step 2 from tpu's own state after step 1 fails (optimizer step on tpu's gradients) "
            "on exp_avg.") in row["error_message"], row


def _running_mean_wrong_once_set(factor):
    """hooks.override_lowerings: batch norm's new running mean scaled by `factor` when the old one is not zero
    (a fresh buffer's is): right at step 1, wrong from step 2 on."""
    import jax.numpy as jnp

    def replace(op, fn):
        if op.__name__.split(".")[0] != "_native_batch_norm_legit_functional":
            return None

        def wrong(x, w, b, running_mean, running_var, training, momentum, eps):
            out, mean, invstd, new_mean, new_var = fn(x, w, b, running_mean, running_var, training, momentum, eps)
            set_before = jnp.any(running_mean != 0)
            return out, mean, invstd, jnp.where(set_before, new_mean * factor, new_mean), new_var
        return wrong
    return replace


def test_a_running_statistics_update_wrong_from_step_2_fails_at_step_2(tmp_path, monkeypatch):
    """test:carried's forward updates its running statistics and normalises with them: a running-mean update
    1% off from step 2 on is found at step 2 (the buffer, and the loss that reads it)."""
    from hf_tpu import hooks

    made = _checks(monkeypatch)
    with hooks.override_lowerings(_running_mean_wrong_once_set(1.01)):
        row = _test_rows("carried", tmp_path)["eager"]
    assert row["status"] == "fail_accuracy", row
    assert len(made) == 1 and made[0].step == 2, made
    assert made[0].tensor in ("loss.step2", "buffer.stat_mean") or made[0].tensor.startswith("grad."), made


def test_the_carried_model_passes_free_running_and_pays_nothing(tmp_path, monkeypatch):
    """Only a row the rule fails pays for the check."""
    made = _checks(monkeypatch)
    row = _test_rows("carried", tmp_path)["eager"]
    assert row["status"] == "pass" and not made, row


def test_a_step_count_not_incremented_fails_though_every_value_agrees():
    """Counters are compared exactly: a step count tpu did not write back leaves every later step agreeing from
    tpu's own state (the same bias correction on both sides) except the count itself."""
    import torch

    from harness.sweep import numerics

    tol = numerics.tolerance_for("test:x", "highest", "float32")
    state = {"loss": torch.tensor(1.0, dtype=torch.float64), "grad": {"w": torch.ones(3)},
             "weight": {"w": torch.ones(3)}, "optim": {"w": {"step": torch.tensor(2.0), "exp_avg": torch.ones(3)}},
             "buffer": {}}
    stuck = {**state, "optim": {"w": {"step": torch.tensor(1.0), "exp_avg": torch.ones(3)}}}
    v = train_carry.judge_tensors(train_carry.step_tensors(state, 2), train_carry.step_tensors(stuck, 2), None,
                                  tol, train.REFERENCE_FACTOR)
    assert not v.ok and v.tensor == "step.w", v
    assert train_carry.judge_tensors(train_carry.step_tensors(state, 2), train_carry.step_tensors(state, 2), None,
                                     tol, train.REFERENCE_FACTOR).ok


@pytest.mark.parametrize("wide", [False, True])
def test_a_step_from_a_recorded_state_continues_the_run_exactly(wide):
    """CPU's run of step 3 alone from its own recorded state after step 2 (weights, AdamW's state, buffers) is
    its full run's step 3, bit for bit: the check's CPU step starts where it is told, nothing is reset."""
    import torch

    (entry,) = testzoo.parse_spec("test:carried")
    built = entry.build(0)
    dtype = torch.float64 if wide else None
    full = train.run_steps(built, entry, None, 3, dtype, trace=True, states=True)
    one = train.run_steps(built, entry, None, 1, dtype, trace=True, states=True, start=full["trace"][2])
    a, b = train_carry.step_tensors(full["trace"][3], 3), train_carry.step_tensors(one["trace"][1], 3)
    assert set(a) == set(b) and any(n.startswith("exp_avg_sq.") for n in a) and "buffer.stat_mean" in a
    assert all(torch.equal(a[n], b[n]) for n in a), [n for n in a if not torch.equal(a[n], b[n])]
