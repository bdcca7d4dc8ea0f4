"""The sweep's train phase (harness/sweep/train.py) on the tiny test zoo, in this process, on tpu."""

import pytest

from harness.sweep import numerics, perf, testzoo, train
from harness.sweep.device import get_device
from harness.sweep.options import SweepOptions
from harness.sweep.runner import run_entry


def _train_rows(kind, tmp_path, modes=("eager",), diagnose=False):
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    opts = SweepOptions(zoo=f"test:{kind}", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",),
                        diagnose=diagnose)
    events = []
    run_entry(entry, modes, opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    assert all(p["phase"] == "train" for k, p in events if k == "row")  # no inference rows asked for
    # nor the inference baseline and reference: the train phase runs its own
    assert not {"baseline", "reference"} & {p for k, p in events if k == "phase"}, events
    return {p["mode"]: p for k, p in events if k == "row"}


def test_train_row_passes_with_performance_columns(tmp_path):
    rows = _train_rows("pass", tmp_path, modes=("eager", "fused"))
    assert rows["fused"]["status"] == "pass", rows["fused"]  # deferred-and-fused eager trains as Strict does
    row = rows["eager"]
    assert row["status"] == "pass", row
    assert row["optimizer"].startswith("AdamW")
    assert row["first_run_s"] > 0 and row["peak_rss_mb"] > 0 and row["warmup_steps"] is not None
    # TorchTPU's per-model timings: warmup overhead, post-warmup step time, the row end to end
    assert row["warmup_s"] >= 0 and 0 < row["run_s"] and row["wall_s"] >= row["first_run_s"] + row["run_s"]


def test_a_gradient_zero_in_exact_arithmetic_is_not_compared_and_the_row_says_so(tmp_path, monkeypatch):
    """The key bias under softmax: float32 gradients of ~1e-9 of the others, rounding noise that differs
    between CPU and tpu. The row passes, names the parameter, and every other tensor is still compared."""
    row = _train_rows("nullgrad", tmp_path)["eager"]
    assert row["status"] == "pass", row
    assert "zero gradient in exact arithmetic or below float32's normal range (key.bias)" in row["error_message"]
    assert row["reference"] == "valid"  # the noise no longer invalidates the float64 reference
    # judged as any other gradient, the noise invalidates the reference: tpu is as near float64 as CPU, so
    # the row is a rounding-dominated (uninformative) pass, not a judged one
    monkeypatch.setattr(train, "null_gradients", lambda ref, fp64: [])
    row = _train_rows("nullgrad", tmp_path)["eager"]
    assert row["reference"].startswith("invalid") and "grad.key.bias" in row["uninformative"], row
    # and by the rule alone, the noise fails it (the transition check's own step-1 reference is refused alike)
    monkeypatch.setattr(train, "rounding_dominated", lambda *a: "")
    monkeypatch.setattr(train.train_carry, "check_row", lambda *a: train.train_carry.Carried(False, "off"))
    row = _train_rows("nullgrad", tmp_path / "rule")["eager"]
    assert row["status"] == "fail_accuracy" and "key.bias" in row["error_message"], row


def test_a_null_parameter_is_frozen_so_its_noise_moves_do_not_reach_the_later_losses(tmp_path):
    """BLIP-2's query tokens: a zero gradient at the initial weights, a loss that follows the parameter's value.
    AdamW would move it by +-lr of float32 noise in the CPU and tpu runs (not in float64), and loss.step2 would
    carry that (0.245 x scale here: the baseline's own distance from float64 refused the reference). Frozen in
    every run, the row is judged against a valid reference and passes."""
    row = _train_rows("nullmove", tmp_path)["eager"]
    assert row["status"] == "pass" and row["reference"] == "valid" and not row.get("uninformative"), row
    assert "zero gradient in exact arithmetic or below float32's normal range (key.bias)" in row["error_message"]


def test_a_float64_train_run_that_raises_says_where_in_the_reference_column(tmp_path, monkeypatch):
    """FastSpeech2Conformer's train rows had reference "none", so no gradient was known null and its key
    bias's float32 noise failed allclose; the column now says what the float64 run raised, and at which step."""
    import torch

    steps = train.run_steps

    def run_steps(built, entry, device, n, dtype=None, *a, **k):
        if dtype is torch.float64:
            raise train.StepError("step 1 forward", RuntimeError("mat1 and mat2 must have the same dtype"))
        return steps(built, entry, device, n, dtype, *a, **k)
    monkeypatch.setattr(train, "run_steps", run_steps)
    row = _train_rows("pass", tmp_path)["eager"]
    assert row["reference"] == ("none: the float64 run raised at step 1 forward: RuntimeError: mat1 and mat2 "
                                "must have the same dtype"), row


def test_run_steps_freezes_what_it_is_told_and_records_its_gradient():
    import torch

    built, entry = _two_layer_built()
    got = train.run_steps(built, entry, None, 2, freeze=["used.bias"])
    assert torch.equal(got["tensors"]["weight.used.bias"], built.model.used.bias.detach())  # not stepped
    assert not torch.equal(got["tensors"]["weight.used.weight"], built.model.used.weight.detach())
    assert got["tensors"]["grad.used.bias"].abs().sum() > 0 and got["frozen"] == ["used.bias"]
    # a function of step 1's tensors, called once, after step 1's backward and outside the run's context
    calls, inside = [], []

    class Ctx:
        def __enter__(self):
            inside.append(True)

        def __exit__(self, *exc):
            inside.pop()

    def freeze(step1):
        calls.append((sorted(step1), bool(inside)))
        return ["used.weight"]

    got = train.run_steps(built, entry, None, 3, context=Ctx, freeze=freeze)
    assert calls == [(sorted(["loss.step1", "grad_norm.step1", *(f"grad.{n}" for n, _ in
                                                                  built.model.named_parameters())]), False)]
    assert torch.equal(got["tensors"]["weight.used.weight"], built.model.used.weight.detach())
    assert not torch.equal(got["tensors"]["weight.used.bias"], built.model.used.bias.detach())
    assert len(got["times"]) == 3 and not inside


def test_a_pipeline_is_not_trainable_and_its_train_rows_are_skipped(tmp_path):
    rows = _train_rows("pipeline", tmp_path, modes=("eager", "compiled"))
    assert {m: r["status"] for m, r in rows.items()} == {"eager": "skipped", "compiled": "skipped"}
    assert rows["eager"]["error_message"].startswith("not trainable: _Pipeline is not a torch.nn.Module")


def test_wrong_backward_lowering_is_fail_accuracy_naming_the_parameter(tmp_path):
    """mm's lowering scaled by 1.05: the Linear layers' forward is addmm, their backward mm, so only the backward
    is wrong (the canary's mechanism, harness/sweep/canary.py, on one backward op)."""
    from hf_tpu import hooks

    with hooks.override_lowerings(_mm_wrong(1.05)):
        row = _train_rows("pass", tmp_path)["eager"]
    assert row["status"] == "fail_accuracy", {k: v for k, v in row.items() if v not in (None, "")}
    assert row["located_module"] == "fc1.weight"  # the first parameter (model order) whose gradient is wrong
    assert "first diverging gradient: fc1.weight" in row["error_message"]
    assert "loss.step1" not in row["error_message"]  # the forward was right
    assert not row.get("located_op")  # without --diagnose the row names no op
    # --diagnose: the backward op, and the parameter nearest the loss (backward order), with a repro
    with hooks.override_lowerings(_mm_wrong(1.05)):
        row = _train_rows("pass", tmp_path / "d", diagnose=True)["eager"]
    assert (row["located_module"], row["located_op"]) == ("fc2.weight", "aten::mm.default"), row
    assert row["repro_path"].endswith("repro.py")


def test_optimizer_step_that_raises_is_attributed_to_the_optimizer(tmp_path, monkeypatch):
    import torch

    class Broken(torch.optim.AdamW):
        def step(self, closure=None):
            exc = NotImplementedError("no lowering for aten::_fused_adamw_.default on tpu")
            exc.op = "aten::_fused_adamw_.default"
            raise exc

    real = train.make_optimizer
    monkeypatch.setattr(train, "make_optimizer",
                        lambda params, device: (Broken(params), "broken") if device == "tpu" else real(params, device))
    row = _train_rows("pass", tmp_path)["eager"]
    assert row["status"] == "fail_to_run" and row["failed_at"] == "step 1 optimizer", row
    assert row["failing_op"] == "aten::_fused_adamw_.default"
    assert row["error_message"].startswith("step 1 optimizer:")


def test_steady_state_recompiles_are_flagged(tmp_path):
    row = _train_rows("recompile", tmp_path, modes=("compiled",))["compiled"]
    assert row["status"] == "pass", row
    assert row["recompiles"].startswith("recompiles"), row


@pytest.mark.parametrize("counts,warmup,steady,flag", [
    ([3, 3, 3, 3], 1, 0, ""),          # stable after the first call
    ([3, 5, 5, 5], 2, 0, ""),          # one more warmup call
    ([3, 3, 3, 4], 1, 1, "recompiles"),  # a compile after warmup
])
def test_perf_fields(counts, warmup, steady, flag):
    f = perf.perf_fields(counts, perf.warmup_steps(counts))
    assert (f["warmup_steps"], f["steady_compilations"], f["recompiles"]) == (warmup, steady, flag)


def test_time_fields_split_warmup_from_steady_steps():
    # two warmup steps (compiling), then steady steps of ~1 s: the overhead is what the warmup cost beyond them
    f = perf.time_fields([9.0, 3.0, 1.0, 1.2, 0.8], 2)
    assert f == {"first_run_s": 9.0, "run_s": 1.0, "warmup_s": 10.0}
    assert "warmup_s" not in perf.time_fields([9.0, 3.0, 1.0], None)  # never stable: no overhead to state
    assert perf.time_fields([9.0, 3.0, 1.0], None)["run_s"] == 2.0  # every call after the first
    assert perf.time_fields([], 1) == {}


def _two_layer_built():
    import types

    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(8, 4)
            self.unused = nn.Linear(8, 4)  # its output is computed and dropped: no gradient reaches it

        def forward(self, x):
            self.unused(x)
            return {"logits": self.used(x)}

    torch.manual_seed(0)
    built = types.SimpleNamespace(model=Net(), inputs={"x": torch.randn(2, 8)}, call=lambda m, i: m(**i))
    return built, types.SimpleNamespace(id="x/net", task="feature-extraction")


def test_a_parameter_without_a_gradient_has_a_zero_one_in_both_modes():
    """Eager autograd leaves .grad None where AOTAutograd may materialise zeros (DPT compiled had gradients
    CPU lacked): both are recorded as zeros, so the two modes compare the same tensors."""
    import torch

    built, entry = _two_layer_built()
    eager = train.run_steps(built, entry, None, 1)["tensors"]
    compiled = train.run_steps(built, entry, None, 1, compile_backend="aot_eager")["tensors"]
    assert set(eager) == set(compiled)
    assert torch.equal(eager["grad.unused.weight"], torch.zeros(4, 8))
    assert eager["grad.used.weight"].abs().sum() > 0


def test_data_dependent_outputs_are_left_out_of_the_fixed_loss():
    import pytest
    import torch

    w = torch.tensor([1.0, 2.0], requires_grad=True)
    out = {"scores": w * 3, "hidden_states": (w * 2,)}
    assert torch.allclose(train.scalar_loss(out, ("scores",)), (w * 2).pow(2).mean())
    assert torch.allclose(train.scalar_loss(out), (w * 3).pow(2).mean() + (w * 2).pow(2).mean())
    with pytest.raises(ValueError, match=r"apart from the data-dependent ones \(scores, hidden_states\)"):
        train.scalar_loss(out, ("scores", "hidden_states"))


def test_zero_initialised_bias_moved_by_noise_passes_and_a_wrong_optimizer_still_fails(tmp_path, monkeypatch):
    """A zero-initialised bias half of whose gradient is rounding noise: AdamW moves those elements by +-lr per
    step in directions CPU and tpu do not share, and the final weight is nothing but those moves. Judged
    beyond AdamW's amplification of the gradients' permitted rounding (train_weights.py) the row passes with
    its float64 reference; an optimizer with a 5% larger lr on tpu still fails, on the weights only."""
    import torch

    from harness.sweep import train_weights

    row = _train_rows("zerobias", tmp_path)["eager"]
    assert row["status"] == "pass" and row["reference"] == "valid", row
    # judged as before (no allowance): the noise alone invalidates the reference and fails the row, unless
    # tpu is found as near float64 as CPU (an uninformative pass, not a judged one)
    monkeypatch.setattr(train_weights, "allowances", lambda *a, **k: {})
    monkeypatch.setattr(train, "rounding_dominated", lambda *a: "")
    monkeypatch.setattr(train.train_carry, "check_row", lambda *a: train.train_carry.Carried(False, "off"))
    row = _train_rows("zerobias", tmp_path / "raw")["eager"]
    assert row["status"] == "fail_accuracy" and "weight.mix.bias" in row["error_message"], row
    monkeypatch.undo()

    real = train.make_optimizer
    monkeypatch.setattr(train, "make_optimizer", lambda params, device: (
        (torch.optim.AdamW(params, lr=train.LR * 1.05, foreach=True), "AdamW lr x1.05") if device == "tpu"
        else real(params, device)))
    row = _train_rows("zerobias", tmp_path / "lr")["eager"]
    assert row["status"] == "fail_accuracy", row
    assert "first diverging gradient" not in row["error_message"] and "loss.step1" not in row["error_message"], row
    # the final weights alone fail too, the zero-initialised bias among them
    (entry,) = testzoo.parse_spec("test:zerobias")
    built = entry.build()
    ref, fp64, tpu = (train.run_steps(built, entry, dev, 3, dtype)["tensors"]
                      for dev, dtype in ((None, None), (None, torch.float64), ("tpu", None)))
    tol = numerics.tolerance_for(entry.id, "highest", "float32")
    allow = train_weights.allowances(ref, fp64, tol, 3, train.LR)
    weights = [n for n in ref if n.startswith("weight.")]
    base, judged = train_weights.shrink(ref, fp64, allow), train_weights.shrink(tpu, fp64, allow)
    failing = [n for n in weights if not numerics.compare_tensor(n, base[n], judged[n], fp64[n], tol)[0]]
    assert "weight.mix.bias" in failing and len(failing) == len(weights), failing


def test_rounding_dominated_train_row_needs_tpu_as_near_float64_as_cpu():
    """A float64 run refused for the baseline's own distance from it (a gradient with heavy cancellation,
    0.2 x its scale on CPU) still judges tpu: as near float64 as CPU (3x) makes the row an uninformative
    pass; a well-determined gradient 5% off, or the noisy one 10x noisier, does not."""
    import torch

    tol = numerics.tolerance_for("test:x", "highest", "float32")
    g = torch.Generator().manual_seed(0)
    truth = {"grad.a": torch.randn(64, generator=g, dtype=torch.float64) * 1e-8,  # cancelled: CPU is noise
             "grad.b": torch.randn(64, generator=g, dtype=torch.float64),  # well determined
             "weight.b": torch.randn(64, generator=g, dtype=torch.float64)}

    def noisy(size_a: float, lr_b: float = 1.0) -> dict:
        return {"grad.a": (truth["grad.a"] + size_a * 1e-8 * torch.randn(64, generator=g, dtype=torch.float64)).float(),
                "grad.b": (truth["grad.b"] * lr_b).float(), "weight.b": truth["weight.b"].float()}

    cpu = noisy(0.2)
    assert not numerics.reference_valid(cpu, truth, tol)[0]  # the sweep refuses it: rmse(fp64, cpu)
    assert "rounding-dominated" in train.rounding_dominated(cpu, noisy(0.2), truth, tol, 3)
    assert train.rounding_dominated(cpu, noisy(0.2, lr_b=1.05), truth, tol, 3) == ""
    assert train.rounding_dominated(cpu, noisy(2.0), truth, tol, 3) == ""
    assert train.rounding_dominated(cpu, noisy(0.2), None, tol, 3) == ""  # no float64 run: nothing said


def test_rounding_dominated_judges_against_float32s_spread_over_two_runs():
    """One float32 run is one sample: on a tensor float32 does not determine, CPU may land near float64 by chance
    (BLIP-2's layer-0 qkv weight: 2.9e-4 x scale, a run nudged by one ulp 0.25, tpu 1.5e-3). With the nudged
    run, tpu is judged against the spread of both; a well-determined gradient 5% off still fails."""
    import torch

    tol = numerics.tolerance_for("test:x", "highest", "float32")
    g = torch.Generator().manual_seed(0)
    truth = {"grad.a": torch.randn(64, generator=g, dtype=torch.float64) * 1e-8,  # cancelled: float32 is noise
             "weight.c": torch.randn(64, generator=g, dtype=torch.float64),  # undetermined: CPU lucky here
             "grad.b": torch.randn(64, generator=g, dtype=torch.float64)}  # well determined

    def run(size_a: float, size_c: float, lr_b: float = 1.0) -> dict:
        return {"grad.a": (truth["grad.a"] + size_a * 1e-8 * torch.randn(64, generator=g, dtype=torch.float64)).float(),
                "weight.c": (truth["weight.c"] * (1 + size_c * torch.randn(64, generator=g, dtype=torch.float64))).float(),
                "grad.b": (truth["grad.b"] * lr_b).float()}

    cpu, nudged = run(0.2, 3e-4), run(0.2, 0.25)
    tpu = run(0.2, 1.5e-3)
    assert not numerics.reference_valid(cpu, truth, tol)[0]
    assert train.rounding_dominated(cpu, tpu, truth, tol, 3) == ""  # 5x the lucky run's distance on weight.c
    assert "float32's spread" in train.rounding_dominated(cpu, tpu, truth, tol, 3, nudged)
    assert train.rounding_dominated(cpu, run(0.2, 1.5e-3, lr_b=1.05), truth, tol, 3, nudged) == ""
    assert train.rounding_dominated(cpu, run(0.2, 2.0), truth, tol, 3, nudged) == ""  # beyond 3x the spread


def test_nudge_moves_every_element_one_ulp_by_a_seeded_coin():
    import torch

    p = torch.randn(1000)
    a, b = p.clone(), p.clone()
    train._nudge([a], 24)
    train._nudge([b], 24)
    assert torch.equal(a, b)  # the same coin for the same seed
    up, down = torch.nextafter(p, torch.tensor(float("inf"))), torch.nextafter(p, torch.tensor(float("-inf")))
    assert bool(((a == up) | (a == down)).all())
    assert 400 < int((a == up).sum()) < 600


def _mm_wrong(factor):
    """A replacement for hooks.override_lowerings: mm (the Linear layers' backward only) scaled by `factor`."""
    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * factor) if op.__name__.split(".")[0] == "mm" else None

    return replace


def _spread_runs(kind, tmp_path, monkeypatch, modes=("eager", "fused")):
    """The train rows of test:`kind`, the phase events and the nudged runs made (train.nudged)."""
    (entry,) = testzoo.parse_spec(f"test:{kind}")
    opts = SweepOptions(zoo=f"test:{kind}", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",))
    made = []
    real_nudged = train.nudged

    def spy_nudged(*a, **k):
        made.append(real_nudged(*a, **k))
        return made[-1]

    monkeypatch.setattr(train, "nudged", spy_nudged)
    events = []
    run_entry(entry, modes, opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    phases = [p for k, p in events if k == "phase"]
    return {p["mode"]: p for k, p in events if k == "row"}, phases, made


def test_only_a_failing_train_row_pays_for_the_nudged_baseline(tmp_path, monkeypatch):
    """The spread run (its own phase and --timeout budget) happens once per entry, for the first row the rule
    fails, whether the float64 reference was refused for the baseline's rounding or is valid; a passing row
    costs no second CPU run."""
    rows, phases, made = _spread_runs("pass", tmp_path / "pass", monkeypatch)
    assert {r["status"] for r in rows.values()} == {"pass"} and not made and "train-spread" not in phases
    rows, phases, made = _spread_runs("perturb", tmp_path / "valid", monkeypatch)
    assert {r["status"] for r in rows.values()} == {"fail_accuracy"}, rows
    assert rows["eager"]["reference"] == "valid" and len(made) == 1 and phases.count("train-spread") == 1
    # the row's own phase again after the spread run: a worker dying later is attributed to the row
    assert phases[phases.index("train-spread") + 1] == "train-eager"
    assert made[0] is not None and any(n.startswith("weight.") for n in made[0])
    monkeypatch.setattr(numerics, "reference_valid", lambda *a: (False, "grad.x: rmse(fp64, cpu) = 0.2 x scale > 0.01"))
    rows, phases, made = _spread_runs("perturb", tmp_path / "refused", monkeypatch)
    assert {r["status"] for r in rows.values()} == {"fail_accuracy"} and len(made) == 1, rows


def test_a_cancellation_residue_gradient_is_not_a_false_alarm(tmp_path, monkeypatch):
    """test:residue, attention over nearly equal keys: the query's and key's weight gradients are residues of
    cancellation (softmax's gradients sum to zero over the keys), whose float32 rounding tpu does not share
    with CPU. Against a valid float64 reference tpu is beyond 3x CPU's distance on them, as a CPU run from
    weights nudged one ulp is too (BioGPT's q_proj.bias): within float32's spread, an uninformative pass.
    With mm (the backward) 1% wrong the row still fails."""
    from hf_tpu import hooks

    rows, phases, made = _spread_runs("residue", tmp_path / "ok", monkeypatch, modes=("eager",))
    row = rows["eager"]
    assert row["status"] == "pass" and row["reference"] == "valid", row
    assert row["uninformative"].startswith("float32-spread: rmse from float64 grad."), row
    assert len(made) == 1
    # the false alarm it was: 3x CPU's distance alone fails the row (if tpu's rounding ever matches CPU's
    # here, this model no longer shows the case and needs other nearly equal keys)
    monkeypatch.setattr(train, "within_spread", lambda *a: "")
    row = _spread_runs("residue", tmp_path / "rule", monkeypatch, modes=("eager",))[0]["eager"]
    assert row["status"] == "fail_accuracy" and "grad.query.weight" in row["error_message"], row
    monkeypatch.undo()

    with hooks.override_lowerings(_mm_wrong(1.01)):
        row = _spread_runs("residue", tmp_path / "wrong", monkeypatch, modes=("eager",))[0]["eager"]
    assert row["status"] == "fail_accuracy" and not row.get("uninformative"), row


def test_a_backward_lowering_1pct_wrong_still_fails_against_float32s_spread(tmp_path, monkeypatch):
    """mm (the Linear layers' backward only) lowered 1% wrong: the rule fails the row, the nudged run is made
    and tpu is judged against float32's spread too (train.within_spread), and the row still fails, naming
    the first wrong gradient."""
    from hf_tpu import hooks

    judged = []
    real = train.within_spread

    def spy(*a, **k):
        judged.append(real(*a, **k))
        return judged[-1]

    monkeypatch.setattr(train, "within_spread", spy)
    with hooks.override_lowerings(_mm_wrong(1.01)):
        rows, phases, made = _spread_runs("pass", tmp_path, monkeypatch, modes=("eager",))
    row = rows["eager"]
    assert row["status"] == "fail_accuracy" and not row.get("uninformative"), row
    assert "first diverging gradient: fc1.weight" in row["error_message"]
    assert len(made) == 1 and made[0] is not None and judged == [""]


def test_within_spread_excuses_a_lucky_baseline_not_a_wrong_gradient():
    """BioGPT's layer-1 q_proj.bias after 3 AdamW steps (a valid reference): Adam's later steps amplify rounding
    on one element, where CPU landed 2.2e-7 from float64, within the element's allowance (8.1e-12 x left after
    train_weights.shrink), tpu 3.8e-7 and five nudged CPU runs 2.5e-8..3.1e-7. tpu is within float32's spread:
    an uninformative pass. A step-1 gradient 1% off, which float32 determines, still fails; no spread run, or
    a tensor beyond 3x the spread, fails as before."""
    import torch

    from harness.sweep import train_weights

    tol = numerics.tolerance_for("test:x", "highest", "float32")
    g = torch.Generator().manual_seed(0)
    n = 64
    grad = torch.randn(n, generator=g, dtype=torch.float64) * 2e-5
    grad[48] = 1.24e-6  # the element Adam's later steps amplify (BioGPT's q_proj.bias[48])
    weight = -3e-4 * grad.sign()
    weight[48] = -1.226e-4
    fp64 = {"grad.q.bias": grad, "weight.q.bias": weight}

    def run(d48: float, wrong: float = 1.0) -> dict:
        noise = 1e-7 * torch.randn(n, generator=g, dtype=torch.float64)
        w = weight * (1 + 1e-6 * torch.randn(n, generator=g, dtype=torch.float64))
        w[48] = weight[48] + d48
        return {"grad.q.bias": (grad * (1 + noise) * wrong).float(), "weight.q.bias": w.float()}

    cpu, nudged, tpu = run(2.15e-7), run(3.06e-7), run(3.82e-7)
    allow = train_weights.allowances(cpu, fp64, tol, 3, train.LR)
    assert numerics.reference_valid(train_weights.shrink(cpu, fp64, allow), fp64, tol)[0]
    base, judged = train_weights.shrink(cpu, fp64, allow), train_weights.shrink(tpu, fp64, allow)
    assert not numerics.compare_outputs(base, judged, fp64, tol).match  # the false alarm: 3x the lucky baseline
    why = train.within_spread(cpu, tpu, fp64, tol, allow, nudged)
    assert why.startswith("float32-spread: rmse from float64 weight.q.bias"), why
    assert train.within_spread(cpu, tpu, fp64, tol, allow, None) == ""  # no second sample: nothing excused
    assert train.within_spread(cpu, run(3.82e-7, wrong=1.01), fp64, tol, allow, nudged) == ""  # 1% wrong backward
    assert train.within_spread(cpu, run(3e-6), fp64, tol, allow, nudged) == ""  # beyond 3x the spread




def test_a_gradient_below_float32s_normal_range_is_null_not_a_false_alarm(tmp_path, monkeypatch):
    """DeepSeek-OCR2's SAM encoder: a weight gradient of float64 size ~1e-38 summed from float32 subnormal
    products. tpu flushes the products (as a TPU does) and gives zeros; CPU sums them into normal numbers a few
    times float32's smallest normal, beyond the elementwise flush allowance. Null, the row passes and says so;
    judged as any other gradient, it fails."""
    row = _train_rows("subnormal", tmp_path)["eager"]
    assert row["status"] == "pass", row
    assert "below float32's normal range (tiny.weight)" in row["error_message"], row
    from harness.sweep import train_null

    monkeypatch.setattr(train_null, "SUBNORMAL", 0.0)  # null_gradients' module
    row = _train_rows("subnormal", tmp_path / "judged")["eager"]  # judged: CPU with flush-to-zero explains it
    assert row["status"] == "pass" and "flushed to zero" in row["uninformative"], row
    from harness.sweep import train_spread

    monkeypatch.setattr(train_spread, "FLUSH_REACH", 0.0)
    row = _train_rows("subnormal", tmp_path / "unexplained")["eager"]
    assert row["status"] == "fail_accuracy" and "tiny.weight" in row["error_message"], row


def test_the_subnormal_bound_is_float32s_smallest_normal():
    # train.py keeps it a literal (torch is imported lazily there); it must stay torch's own figure
    import torch

    assert train.SUBNORMAL == torch.finfo(torch.float32).tiny


def test_a_gradient_summed_from_flushed_products_is_judged_against_cpu_with_flush_to_zero(tmp_path, monkeypatch):
    """GotOcr2's SAM relative-position table: a weight gradient of float64 size ~1e-36, a contraction of many
    products below float32's smallest normal. tpu flushes each product, as a TPU does, and gives ~zero; CPU keeps
    them and is exact. Beyond the elementwise flush allowance, so the rule fails it; CPU with flush-to-zero (the
    float32 a TPU computes) lands as far from float64 as tpu, so the row is an uninformative pass saying so.
    Without the flush sample (as before train_spread.FLUSH) the row fails."""
    from harness.sweep import train_spread

    row = _train_rows("flushsum", tmp_path)["eager"]
    assert row["status"] == "pass", row
    assert "tiny.weight" in row["uninformative"] and "flushed to zero" in row["uninformative"], row
    monkeypatch.setattr(train_spread, "FLUSH_REACH", 0.0)  # no tensor is small enough: no flush sample
    row = _train_rows("flushsum", tmp_path / "judged")["eager"]
    assert row["status"] == "fail_accuracy" and "tiny.weight" in row["error_message"], row


def test_the_flush_sample_flushes_subnormal_products_on_cpu():
    """train_spread.flush_to_zero: a CPU matmul of operands whose products are subnormal gives zeros inside it
    and CPU's exact sums outside it (the flag restored, and the thread count)."""
    import torch

    from harness.sweep import train_spread

    a, b = torch.full((4, 64), 1e-19), torch.full((64, 4), 1e-19)  # products 1e-38 < tiny, sums 6.4e-37
    threads = torch.get_num_threads()
    with train_spread.flush_to_zero():
        inside = a @ b
    assert torch.count_nonzero(inside) == 0 and torch.get_num_threads() == threads
    assert torch.allclose(a @ b, torch.full((4, 4), 6.4e-37), rtol=1e-5, atol=0)


def test_levit_trains_without_its_eval_mode_cache(tmp_path):
    """LeViT caches its attention biases in eval mode: the build's calibration forwards left a no-grad copy in
    the built model, so the CPU baseline's attention biases got no gradient, while tpu built its own cache at
    step 1 and its step-2 backward met step 1's freed graph ("backward through the graph a second time",
    fail_to_run on tpu, eager and compiled, in the full-zoo sweep). Each step now starts with train() then
    eval(), which clears it (Transformers' own way), so every step builds its biases afresh."""
    from harness.sweep.entries import load_entries

    opts = SweepOptions(zoo="full", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", phases=("train",),
                        match="^transformers/levit/LevitModel$")
    (entry,) = load_entries(opts)
    events = []
    run_entry(entry, ("eager",), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    (row,) = [p for k, p in events if k == "row"]
    assert row["status"] == "pass", row
