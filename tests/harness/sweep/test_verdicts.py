"""Numerics verdicts that can be trusted (issue 14): the scale-aware rule, valid references, informative
outputs, data-dependent outputs, nondeterminism and the canary."""

import pytest
import torch

from harness.sweep import canary, informative, numerics
from harness.sweep.numerics import compare_outputs, compare_tensor, tolerance_for

HIGHEST = tolerance_for("x", "highest", "float32")


def _noisy(fp64, rel, seed):
    g = torch.Generator().manual_seed(seed)
    return fp64 + rel * fp64.abs().mean() * torch.randn(fp64.shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("magnitude", [1e-7, 1e-3, 1.0, 1e4])
def test_one_percent_error_fails_at_any_magnitude(magnitude):
    """DPT's and Segformer's ~1e-7 outputs passed same()'s absolute tolerance with rmse_ratio ~1e4."""
    fp64 = torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * magnitude
    ref = fp64.float()  # float32 rounding: the baseline's own error
    bad = (fp64 * 1.01).float()
    assert not compare_tensor("t", ref, bad, fp64, HIGHEST)[0]
    assert not compare_tensor("t", ref, bad, None, HIGHEST)[0]  # the scale-aware allclose too
    assert compare_tensor("t", ref, _noisy(fp64, 1e-7, 1).float(), fp64, HIGHEST)[0]
    assert compare_tensor("t", ref, _noisy(fp64, 1e-7, 1).float(), None, HIGHEST)[0]


def test_passing_allclose_does_not_hide_a_huge_rmse_ratio():
    fp64 = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = fp64.float()
    res = (fp64 * (1 + 5e-5)).float()  # within allclose(1e-4, 1e-4), 100x float32 noise
    assert torch.allclose(ref, res, atol=1e-4, rtol=1e-4)
    ok, m, reason = compare_tensor("t", ref, res, fp64, HIGHEST)
    assert not ok and m["rmse_ratio"] > 100 and "rmse(fp64,tpu)" in reason


def test_elements_near_zero_get_an_absolute_floor_relative_to_the_tensor():
    fp64 = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1e-6
    fp64[:10] = 0.0
    ref = fp64.float()
    res = ref.clone()
    res[:10] = 1e-13  # ~1e-7 of the tensor's scale: float32 noise around a zero
    assert compare_tensor("t", ref, res, None, HIGHEST)[0]
    res[:10] = 1e-8  # 1% of the scale: wrong
    assert not compare_tensor("t", ref, res, None, HIGHEST)[0]


def test_reference_validity():
    fp64 = torch.randn(100, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert numerics.reference_valid({"a": fp64.float()}, {"a": fp64}, HIGHEST) == (True, "")
    other = torch.randn(100, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ok, why = numerics.reference_valid({"a": fp64.float()}, {"a": other}, HIGHEST)
    assert not ok and "a: rmse(fp64, cpu)" in why


def test_tolerances_come_from_the_yaml():
    import yaml

    data = yaml.safe_load(numerics.DEFAULT_TOLERANCES_FILE.read_text())
    for key, values in data["defaults"].items():
        p, d = key.split("/")
        t = tolerance_for("x", p, d)
        assert (t.tol, t.floor_value, t.reference) == (values["tol"], values["floor"], values["reference"])


# ------------------------------------------------------------------------------------- informative outputs
def test_uninformative_outputs_are_flagged():
    x = torch.randn(4, 4)
    assert informative.uninformative({"a": torch.zeros(3, 3)}) == "all zeros: a"
    assert informative.uninformative({"a": torch.full((3,), 2.0)}) == "constant: a"
    assert informative.uninformative({"a": torch.tensor([1.0, float("nan")])}) == "not finite: a"
    assert "unchanged when the input changes" in informative.uninformative({"a": x}, {"a": x.clone()})
    assert informative.uninformative({"a": torch.zeros(3), "b": x}, {"a": torch.zeros(3), "b": x + 1}) == ""


def test_uninformative_row_in_the_runner_and_out_of_numerics_match(cpu_opts):
    """A model whose output ignores its input (a zero-weight layer the zoo rule does not see: a buffer)."""
    import pandas as pd

    from harness.ci import coverage
    from harness.sweep.device import get_device
    from harness.sweep.runner import run_entry

    class Const(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.zeros(16, 4))

        def forward(self, x):
            return {"logits": x @ self.w}

    class Entry:
        id, library, model_type, model_class, task = "test/const", "test", "t", "Const", "t"

        def build(self, seed=0):
            from harness.zoo.entry import BuiltEntry

            return BuiltEntry(model=Const().eval(), inputs={"x": torch.randn(4, 16)})

    events = []
    run_entry(Entry(), ("eager",), cpu_opts, get_device("cpu"), lambda k, p: events.append((k, p)))
    (row,) = [p for k, p in events if k == "row"]
    assert row["status"] == "pass" and row["uninformative"] == "all zeros: logits"
    df = pd.DataFrame([row, {**row, "entry_id": "test/ok", "uninformative": ""}])
    assert coverage.headline(df).numerics_match.den == 1
    assert "test/const" in coverage.coverage_markdown(df)


def test_zoo_reinitialises_zero_weights_so_controlnet_outputs_are_not_zero():
    from harness.zoo import output_tensors
    from harness.zoo.diffusers_zoo import SPECS_BY_NAME
    from harness.zoo.entry import ZooEntry

    spec = SPECS_BY_NAME["ControlNetModel"]  # the smoke zoo's entry, without listing the whole zoo
    entry = ZooEntry(id="diffusers/ControlNetModel", library="diffusers", model_type=spec.name,
                     model_class=spec.cls, task=spec.task)
    built = entry.build(0)
    assert "controlnet_mid_block.weight" in built.notes["reinitialised"]
    with torch.no_grad():
        out = output_tensors(built.call(built.model, built.inputs))
    assert out and all(bool(t.abs().max() > 0) for t in out.values())
    assert informative.uninformative(out) == ""



def test_zero_init_rule_is_deterministic_and_leaves_biases():
    from harness.zoo.zero_init import reinit_zero_weights

    def make():
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        torch.nn.init.zeros_(m[1].weight)
        torch.nn.init.zeros_(m[1].bias)
        return m

    a, b = make(), make()
    assert reinit_zero_weights(a, 0) == ["1.weight"] == reinit_zero_weights(b, 0)
    assert torch.equal(a[1].weight, b[1].weight) and bool(a[1].weight.any()) and not bool(a[1].bias.any())


# ---------------------------------------------------------------------------------- data-dependent outputs
def _detections(points, scores):
    return {"keypoints": torch.tensor([points], dtype=torch.float32),
            "scores": torch.tensor([scores], dtype=torch.float32),
            "hidden": torch.linspace(-1, 1, 50).reshape(5, 10)}


def test_threshold_flip_is_not_a_failure_but_wrong_scores_are():
    tol = numerics.replace(HIGHEST, data_dependent=("keypoints", "scores"), max_unmatched=0.25)
    pts = [[0.1 * i, 0.2] for i in range(8)]
    scores = [0.5 + 0.01 * i for i in range(8)]
    ref = _detections(pts, scores)
    flipped = _detections(pts[:7], scores[:7])  # one score fell under the threshold on the other device
    c = compare_outputs(ref, flipped, None, tol)
    assert c.match and "1 of 8 detections unmatched" in c.notes
    assert not compare_outputs(ref, flipped, None, HIGHEST).match  # without the rule: a shape mismatch
    wrong = _detections(pts[:7], [s * 1.01 for s in scores[:7]])
    assert not compare_outputs(ref, wrong, None, tol).match
    few = _detections(pts[:4], scores[:4])
    assert not compare_outputs(ref, few, None, tol).match  # half the detections gone is not noise
    dense_wrong = {**flipped, "hidden": flipped["hidden"] * 1.01}
    assert not compare_outputs(ref, dense_wrong, None, tol).match


def test_keypoint_detectors_get_the_data_dependent_rule():
    t = tolerance_for("transformers/superpoint/SuperPointForKeypointDetection", "highest", "float32",
                      numerics.load_overrides(None))
    assert t.data_dependent[0] == "keypoints"


# ---------------------------------------------------------------------------------------- nondeterminism
def test_nondeterminism_is_detected(cpu_opts):
    from harness.sweep.device import get_device
    from harness.sweep.runner import run_entry

    class Drift(torch.nn.Module):
        calls = 0

        def forward(self, x):
            Drift.calls += 1
            return {"logits": x * (1 + 1e-6 * Drift.calls)}

    class Entry:
        id, library, model_type, model_class, task = "test/drift", "test", "t", "Drift", "t"

        def build(self, seed=0):
            from harness.zoo.entry import BuiltEntry

            return BuiltEntry(model=Drift(), inputs={"x": torch.randn(4, 16)})

    events = []
    run_entry(Entry(), ("eager",), cpu_opts, get_device("cpu"), lambda k, p: events.append((k, p)))
    (row,) = [p for k, p in events if k == "row"]
    assert row["nondeterministic"].startswith("logits: max |run1 - run2|")
    assert informative.first_difference({"a": torch.ones(2)}, {"a": torch.ones(2)}) == ""


# ------------------------------------------------------------------------------------------------ canary
def test_parse_fault():
    assert canary.parse_fault(None) == canary.Fault("matmul", 1.01)
    assert canary.parse_fault("conv:0.9") == canary.Fault("conv", 0.9)
    for bad in ("gemm", "matmul:x", "matmul:1"):
        with pytest.raises(ValueError, match="bad canary fault"):
            canary.parse_fault(bad)


def test_canary_flags_a_perturbed_lowering_eager_and_compiled():
    import hf_tpu  # noqa: F401

    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = {"y": model(x)}
        fp64 = {"y": model.double()(x.double())}
        model.float()
        m = model.to("tpu")
        clean = {"y": m(x.to("tpu")).cpu()}
        assert compare_outputs(ref, clean, fp64, HIGHEST).match
        with canary.inject("matmul:1.01"):
            eager = {"y": m(x.to("tpu")).cpu()}
            torch._dynamo.reset()
            compiled = {"y": torch.compile(m, backend="tpu")(x.to("tpu")).cpu()}
        torch._dynamo.reset()
        after = {"y": m(x.to("tpu")).cpu()}
    for faulty in (eager, compiled):
        c = compare_outputs(ref, faulty, fp64, HIGHEST)
        assert not c.match and canary.outcome(c.match, faulty, clean) == "caught"
    assert torch.equal(after["y"], clean["y"])  # the fault is gone with the block (no stale program)
    with canary.inject("conv"):  # no convolution here: untouched
        with torch.no_grad():
            same = {"y": m(x.to("tpu")).cpu()}
    assert canary.outcome(True, same, clean) == "untouched"
    assert canary.outcome(True, eager, clean) == "missed"


def test_runner_records_the_canary(tmp_path):
    from harness.sweep import testzoo
    from harness.sweep.device import get_device
    from harness.sweep.options import SweepOptions
    from harness.sweep.runner import run_entry

    opts = SweepOptions(zoo="test", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=60,
                        progress="none", repeats=1, canary="matmul:1.01")
    (entry,) = testzoo.parse_spec("test:pass")
    events = []
    run_entry(entry, ("eager",), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    (row,) = [p for k, p in events if k == "row"]
    assert row["status"] == "pass" and row["canary"].startswith("caught (matmul:1.01")
    assert row["reference"] == "valid" and row["uninformative"] == "" and not row.get("nondeterministic")


# -------------------------------------------------------------------------------------------- pipelines
@pytest.mark.slow
def test_pipeline_float64_reference_is_valid_and_sees_a_fault():
    """DDPM draws its initial noise and per-step noise in the run's dtype: without float32 draws the float64
    reference got other noise, and its rmse ratio was ~1 even under a 1% matmul fault."""
    import hf_tpu  # noqa: F401
    from harness.sweep.runner import prepare_inputs, prepare_model, to_cpu
    from harness.zoo import load_zoo, output_tensors

    (entry,) = [e for e in load_zoo("smoke") if e.id == "diffusers/pipeline/DDPMPipeline"]
    b = entry.build(0)
    torch.set_float32_matmul_precision("highest")
    with torch.no_grad():
        ref = to_cpu(output_tensors(b.call(b.model, prepare_inputs(b.inputs))))
        fp64 = to_cpu(output_tensors(b.call(prepare_model(b.model, None, torch.float64),
                                            prepare_inputs(b.inputs, None, torch.float64))))
        assert numerics.reference_valid(ref, fp64, HIGHEST)[0]
        clean = to_cpu(output_tensors(b.call(prepare_model(b.model, "tpu"), prepare_inputs(b.inputs, "tpu"))))
        with canary.inject("matmul:1.01"):
            faulty = to_cpu(output_tensors(b.call(prepare_model(b.model, "tpu"), prepare_inputs(b.inputs, "tpu"))))
    c = compare_outputs(ref, clean, fp64, HIGHEST)
    assert c.match and 0.5 < c.rmse_ratio < 2.0
    c = compare_outputs(ref, faulty, fp64, HIGHEST)
    assert not c.match and c.rmse_ratio > 100


def test_coverage_states_the_canary_sensitivity_and_lists_misses():
    import pandas as pd

    from harness.ci import verdicts
    from harness.ci.coverage import coverage_markdown

    base = {"mode": "eager", "status": "pass", "uninformative": "", "reference": "valid", "nondeterministic": "",
            "library": "t", "task": "t", "error_message": "", "error_type": "", "failing_op": "", "dtype": "float32",
            "precision": "highest", "max_abs_err": 0.0, "max_rel_err": 0.0, "cosine": 1.0, "rmse_ratio": 1.0}
    rows = [{**base, "entry_id": f"e{i}", "canary": "caught (matmul:1.01, rel rmse 0.01, rmse ratio 1e4)"}
            for i in range(3)]
    rows.append({**base, "entry_id": "miss", "canary": "missed (matmul:1.01, rel rmse 1e-6, rmse ratio 1.5)"})
    rows.append({**base, "entry_id": "conv", "canary": "untouched (matmul:1.01, ...); all:1.01: caught"})
    df = pd.DataFrame(rows)
    assert verdicts.sensitivity(df).num == 3 and verdicts.sensitivity(df).den == 4
    md = coverage_markdown(df)
    assert "a matmul:1.01 fault is caught in 75.0% (3/4)" in md
    assert "`miss`" in md.split("### Canary missed")[1].split("###")[0]
    assert "`conv`" in md.split("### Canary untouched")[1]


def test_bad_canary_fault_is_refused_by_the_cli(tmp_path, capsys):
    from harness.cli import main

    assert main(["sweep", "--zoo", "test:pass", "--canary", "gemm:2", "--out", str(tmp_path / "o")]) == 2
    assert "bad canary fault" in capsys.readouterr().err


@pytest.mark.slow
def test_float32_noise_passes_one_entry_of_every_task_family(tmp_path):
    """Zero false failures at "highest": one smoke entry per task family, eager, by the sweep's own runner."""
    from harness.sweep.device import get_device
    from harness.sweep.options import SweepOptions
    from harness.sweep.runner import run_entry
    from harness.zoo import load_zoo

    first = {}
    for e in load_zoo("smoke"):
        first.setdefault(e.task, e)
    opts = SweepOptions(zoo="smoke", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        progress="none", repeats=1, precision="highest")
    overrides = numerics.load_overrides(None)
    bad = []
    for task, entry in sorted(first.items()):
        events = []
        run_entry(entry, ("eager",), opts, get_device("tpu"), lambda k, p, ev=events: ev.append((k, p)),
                  overrides=overrides)
        (row,) = [p for k, p in events if k == "row"]
        if row["status"] != "pass" or row.get("nondeterministic"):
            bad.append((task, entry.id, row["status"], row.get("error_message"), row.get("nondeterministic")))
    assert len(first) >= 20 and not bad, bad


def test_medium_baseline_is_rounded_like_the_tpu_and_still_sees_a_fault():
    """At "medium" the CPU baseline rounds matmul operands to bfloat16 as the tpu does (harness.sweep.emulate):
    clean tpu results then agree with it to float32 noise, and a 1% matmul error is not lost in bf16 noise."""
    import hf_tpu  # noqa: F401
    from harness.sweep import emulate

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).eval()
    x = torch.randn(8, 64)
    medium = tolerance_for("x", "medium", "float32")
    with torch.no_grad():
        plain = model(x)
        with emulate.matmul_precision("medium"):
            ref = {"y": model(x)}
            attn = torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None])
        fp64 = {"y": model.double()(x.double())}
        model.float()
        torch.set_float32_matmul_precision("medium")
        try:
            m = model.to("tpu")
            tpu = {"y": m(x.to("tpu")).cpu()}
            tattn = torch.nn.functional.scaled_dot_product_attention(*[x[None].to("tpu")] * 3).cpu()
            with canary.inject("matmul:1.01"):
                faulty = {"y": m(x.to("tpu")).cpu()}
        finally:
            torch.set_float32_matmul_precision("highest")
    scale = float(ref["y"].pow(2).mean().sqrt())
    assert float((plain - ref["y"]).abs().max()) > 1e-4 * scale  # the rounding is real
    assert float((tpu["y"] - ref["y"]).abs().max()) < 1e-5 * scale  # and the same as the tpu's
    assert float((tattn - attn).abs().max()) < 1e-5 * float(attn.abs().max())  # SDPA too
    assert compare_outputs(ref, tpu, fp64, medium).match
    assert not compare_outputs(ref, faulty, fp64, medium).match
