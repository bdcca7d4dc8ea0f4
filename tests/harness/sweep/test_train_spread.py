"""float32's spread for a failing train row (harness/sweep/train_spread.py): more nudged runs only near the
bound, and a real error (a backward lowering 1% or 5% wrong) still fails however many are taken."""

import pytest
import torch

from harness.sweep import numerics, testzoo, train, train_spread
from harness.sweep.device import get_device
from harness.sweep.options import SweepOptions
from harness.sweep.runner import run_entry


def _noise(ref, rms, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(ref.shape, generator=g, dtype=torch.float64) * rms


def _case():
    """A gradient float32 does not determine beyond ~1e-5 of its scale (the floor): CPU 1e-5 from float64, a
    first nudged run that lands next to CPU (1e-6 from it), a second one 2e-5 from float64, tpu 4e-5."""
    f = _noise(torch.zeros(4096), 1.0, 0)
    cpu = f + _noise(f, 1e-5, 1)
    first = cpu + _noise(f, 1e-6, 2)
    second = f + _noise(f, 2e-5, 3)
    return {"grad.x": f}, {"grad.x": cpu.float()}, [{"grad.x": first.float()}, {"grad.x": second.float()}]


def test_a_second_sample_widens_the_spread_only_where_the_first_understates_it():
    fp64, cpu, (first, second) = _case()
    tol = numerics.tolerance_for("test:x", "highest", "float32")
    tpu = {"grad.x": (fp64["grad.x"] + _noise(fp64["grad.x"], 4e-5, 4)).float()}
    assert not numerics.compare_tensor("grad.x", cpu["grad.x"], tpu["grad.x"], fp64["grad.x"], tol)[0]
    # one sample that landed where CPU did: not excused, but near the bound, so another run is worth making
    assert train_spread.within_spread(cpu, tpu, fp64, tol, {}, first) == ""
    assert train_spread.near_bound(cpu, tpu, fp64, tol, {}, [first])
    why = train_spread.within_spread(cpu, tpu, fp64, tol, {}, [first, second])
    assert why.startswith("float32-spread: rmse from float64 grad.x") and "2 runs nudged one ulp" in why, why
    # a gradient 1% or 5% wrong is far beyond the spread: not near the bound, and not excused by both samples
    for factor in (1.01, 1.05):
        wrong = {"grad.x": (fp64["grad.x"] * factor + _noise(fp64["grad.x"], 1e-5, 5)).float()}
        assert not train_spread.near_bound(cpu, wrong, fp64, tol, {}, [first])
        assert train_spread.within_spread(cpu, wrong, fp64, tol, {}, [first, second]) == ""


def test_judge_asks_for_another_sample_only_near_the_bound():
    fp64, cpu, samples = _case()
    tol = numerics.tolerance_for("test:x", "highest", "float32")
    asked = []

    def spread(i):
        asked.append(i)
        return samples[i] if i < len(samples) else None

    tpu = {"grad.x": (fp64["grad.x"] + _noise(fp64["grad.x"], 4e-5, 4)).float()}
    cmp, why = train.judge(cpu, tpu, fp64, tol, {}, spread=spread)
    assert not cmp.match and why and asked == [0, 1], (why, asked)
    asked.clear()
    wrong = {"grad.x": (fp64["grad.x"] * 1.01).float()}
    cmp, why = train.judge(cpu, wrong, fp64, tol, {}, spread=spread)
    assert not cmp.match and not why and asked == [0]  # far beyond the bound: one sample, as before


def _mm_wrong(factor):
    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * factor) if op.__name__.split(".")[0] == "mm" else None

    return replace


def _rows(kind, tmp_path, monkeypatch):
    """The eager train row of test:`kind` and the nudged runs made (train.nudged)."""
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    opts = SweepOptions(zoo=f"test:{kind}", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",))
    made, real = [], train.nudged
    monkeypatch.setattr(train, "nudged", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    events = []
    run_entry(entry, ("eager",), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    return [p for k, p in events if k == "row"][0], made


@pytest.mark.parametrize("kind", ["pass", "residue"])
@pytest.mark.parametrize("factor", [1.01, 1.05])
def test_a_wrong_backward_still_fails_with_every_nudged_run_taken(kind, factor, tmp_path, monkeypatch):
    """mm (the Linear layers' backward) lowered 1% or 5% wrong, on a plain MLP and on test:residue (a
    float32-spread row: its query/key gradients are cancellation residues whose rounding CPU and tpu do not
    share): with every row taken as near its bound, all three nudged runs are made and the row still fails."""
    from hf_tpu import hooks

    monkeypatch.setattr(train_spread, "NEAR_BOUND", float("inf"))
    with hooks.override_lowerings(_mm_wrong(factor)):
        row, made = _rows(kind, tmp_path, monkeypatch)
    assert row["status"] == "fail_accuracy" and not row.get("uninformative"), row
    assert len(made) == len(train_spread.NUDGE_SEEDS) and all(m is not None for m in made)
    # three different samples of float32's rounding, not one run three times
    w = [n for n in made[0] if n.startswith("weight.")][0]
    assert not torch.equal(made[0][w], made[1][w]) and not torch.equal(made[1][w], made[2][w])


def test_the_float32_spread_row_passes_on_its_first_sample(tmp_path, monkeypatch):
    row, made = _rows("residue", tmp_path, monkeypatch)
    assert row["status"] == "pass" and row["uninformative"].startswith("float32-spread"), row
    assert len(made) == 1  # excused by the first sample: no more runs
