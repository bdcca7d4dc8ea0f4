import math

import pytest
import torch

from harness.sweep import numerics
from harness.sweep.numerics import Tolerance, compare_outputs, compare_tensor, load_overrides, tolerance_for


def test_every_precision_and_dtype_has_a_tolerance():
    for p in ("highest", "high", "medium"):
        for d in ("float32", "bfloat16"):
            assert tolerance_for("x", p, d).tol > 0
    assert tolerance_for("x", "highest", "float32").tol == 1e-4  # same()'s default


def test_identical_outputs_match():
    t = torch.randn(64, 64)
    c = compare_outputs({"a": t}, {"a": t.clone()}, {"a": t.double()}, Tolerance(1e-4))
    assert c.match and c.max_abs_err == 0 and c.cosine == 1.0


def test_fp64_rule_passes_within_multiplier_and_fails_beyond():
    torch.manual_seed(0)
    fp64 = torch.randn(100, 100, dtype=torch.float64)
    noise = torch.randn(100, 100, dtype=torch.float64)
    ref = (fp64 + 1e-3 * noise).float()  # the CPU baseline's own error
    ok = (fp64 + 1.5e-3 * torch.randn(100, 100, dtype=torch.float64)).float()
    bad = (fp64 + 5e-3 * torch.randn(100, 100, dtype=torch.float64)).float()
    tol = Tolerance(1e-4)
    match, m, _ = compare_tensor("t", ref, ok, fp64, tol)
    assert match and 1.0 < m["rmse_ratio"] < 2.0
    match, m, reason = compare_tensor("t", ref, bad, fp64, tol)
    assert not match and m["rmse_ratio"] > 2.0 and "rmse(fp64,tpu)" in reason


def test_multiplier_follows_same():
    big, small = torch.zeros(2000, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)
    t = Tolerance(1e-4)
    assert numerics.multiplier(t, torch.zeros(2000), big) == 2.0
    assert numerics.multiplier(t, torch.zeros(2000, dtype=torch.bfloat16), big) == 3.0
    assert numerics.multiplier(t, torch.zeros(10), small) == 3.0  # small tensors: noise dominates
    assert numerics.multiplier(Tolerance(1e-4, multiplier=7.0), torch.zeros(10), small) == 7.0


def test_shape_and_name_mismatch_fail():
    a = torch.zeros(2, 3)
    assert not compare_outputs({"a": a}, {"a": torch.zeros(3, 2)}, None, Tolerance(1e-4)).match
    c = compare_outputs({"a": a}, {"b": a}, None, Tolerance(1e-4))
    assert not c.match and "output names differ" in c.reason


def test_no_reference_falls_back_to_allclose():
    a = torch.ones(10)
    assert not compare_outputs({"a": a}, {"a": a + 1}, None, Tolerance(1e-4)).match
    assert compare_outputs({"a": a}, {"a": a + 1e-6}, None, Tolerance(1e-4)).match


def test_nan_in_both_matches_and_metrics_are_nan_safe():
    a = torch.tensor([1.0, math.nan])
    c = compare_outputs({"a": a}, {"a": a.clone()}, {"a": a.double()}, Tolerance(1e-4))
    assert c.match


def test_cosine_override():
    a = torch.randn(1000)
    res = a * 1.01
    assert not compare_outputs({"a": a}, {"a": res}, None, Tolerance(1e-4)).match
    assert compare_outputs({"a": a}, {"a": res}, None, Tolerance(1e-4, cosine=True)).match


def test_yaml_overrides(tmp_path):
    p = tmp_path / "tol.yaml"
    p.write_text('entries:\n  "transformers/foo/*":\n    tol: 0.5\n    cosine: true\n  "x/skip":\n    skip: flaky\n')
    ov = load_overrides(p)
    t = tolerance_for("transformers/foo/FooModel", "highest", "float32", ov)
    assert t.tol == 0.5 and t.cosine
    assert tolerance_for("x/skip", "highest", "float32", ov).skip == "flaky"
    assert tolerance_for("other", "medium", "float32", ov) == tolerance_for("other", "medium", "float32")


@pytest.mark.parametrize("text", ["entries: [1, 2]", "entries:\n  a:\n    tolerance: 1\n", "entries: {a: ["])
def test_malformed_overrides_name_the_problem(tmp_path, text):
    p = tmp_path / "tol.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match="tolerances file"):
        load_overrides(p)


def test_shipped_overrides_file_is_valid():
    load_overrides(None)


def test_agree_bound_catches_what_the_bfloat16_allowance_hides():
    """At "medium" the baseline computes the tpu's rounding: an error the fp64 rule's 3x bfloat16 allowance
    accepts is still caught by the agreement bound, and float32 noise between the two still passes."""
    torch.manual_seed(0)
    fp64 = torch.randn(100, 100, dtype=torch.float64)
    ref = (fp64 + 3e-3 * torch.randn(100, 100, dtype=torch.float64)).float()  # bfloat16-sized baseline error
    wrong = (ref.double() + 8e-3 * torch.randn(100, 100, dtype=torch.float64)).float()
    noisy = (ref.double() + 1e-7 * torch.randn(100, 100, dtype=torch.float64)).float()
    loose = Tolerance(2e-2, floor=1e-3)
    assert compare_tensor("t", ref, wrong, fp64, loose)[0]  # hidden under 3 * 3e-3 + 1e-3
    strict = Tolerance(2e-2, floor=1e-3, agree=0.5)  # at most half the baseline's own rounding error
    ok, m, reason = compare_tensor("t", ref, wrong, fp64, strict)
    assert not ok and "0.5*rmse(fp64,cpu)" in reason and 7e-3 < m["agree_rmse"] < 9e-3
    assert compare_tensor("t", ref, noisy, fp64, strict)[0]
    flips = ref.clone()
    flips.view(-1)[::50] *= 1 + 2**-8  # a bfloat16 ulp flipped in 2% of the elements: ~6e-4 of the scale
    assert compare_tensor("t", ref, flips, fp64, strict)[0]


def test_agree_comes_from_the_defaults_and_entries_override_it(tmp_path):
    assert tolerance_for("x", "highest", "float32").agree is None  # a float32 baseline: the fp64 rule alone
    assert tolerance_for("x", "medium", "float32").agree is not None
    f = tmp_path / "t.yaml"
    f.write_text("entries:\n  x: {agree: 0.5}\n")
    assert tolerance_for("x", "medium", "float32", load_overrides(f)).agree == 0.5
    assert tolerance_for("x", "highest", "float32", load_overrides(f)).agree is None  # no shared rounding there
    shipped = load_overrides(None)
    assert tolerance_for("diffusers/pipeline/DDPMPipeline", "medium", "float32", shipped).agree == 1.45


def test_rounding_dominated_outputs_at_medium_are_unjudged_not_failed():
    """At "medium" a deep, ill-conditioned model's own bfloat16 rounding can put the CPU baseline 0.1..1x of the
    output's scale from float64 (MobileNetV2 1.1x, Emu3 0.2x on the full zoo): such a row cannot be judged, and
    is an uninformative pass while tpu is no farther from float64 than 3x the baseline; farther still fails."""
    import torch

    from harness.sweep.numerics import rounding_dominated, tolerance_for

    g = torch.Generator().manual_seed(0)
    fp64 = {"y": torch.randn(1000, generator=g, dtype=torch.float64)}
    ref = {"y": (fp64["y"] + 0.5 * torch.randn(1000, generator=g, dtype=torch.float64)).float()}
    tpu = {"y": (fp64["y"] + 0.5 * torch.randn(1000, generator=g, dtype=torch.float64)).float()}
    medium = tolerance_for("x", "medium", "float32")
    assert "rounding-dominated" in rounding_dominated(ref, tpu, fp64, medium)
    wild = {"y": (fp64["y"] + 5.0 * torch.randn(1000, generator=g, dtype=torch.float64)).float()}
    assert rounding_dominated(ref, wild, fp64, medium) == ""  # a tpu 10x farther off is still a failure
    close = {"y": fp64["y"].float()}
    assert rounding_dominated(close, tpu, fp64, medium) == ""  # the baseline is not noisy: the usual rules judge
    # at highest the same holds for float32 rounding through a chaotic model (RT-DETR's query selection)
    assert "rounding-dominated" in rounding_dominated(ref, tpu, fp64, tolerance_for("x", "highest", "float32"))
    assert rounding_dominated(ref, tpu, None, medium) == ""


def test_the_failure_message_prints_the_bound_it_applied():
    """The reason read '1e-05*scale=7.62e-05' where 7.62e-05 was the scale itself (the floor was 7.62e-10):
    a user checking the figures saw an error below the bound it claimed to exceed."""
    fp64 = torch.full((4,), 7.62e-5, dtype=torch.float64)
    ref = fp64.float()
    res = ref * (1 + 1e-4)
    tol = Tolerance(tol=1e-4)
    ok, m, reason = compare_tensor("g", ref, res, fp64, tol)
    assert not ok
    floor = tol.floor_value * 7.62e-5
    assert f"{tol.floor_value:g}*scale={floor:.3g} (scale 7.62e-05" in reason, reason
    bound_terms = reason.split(" > ")[1]
    assert f"{floor:.3g}" in bound_terms


def test_rmse_and_allclose_skip_non_finite_elements_and_only_them():
    # _finite gathers the finite elements only when there are non-finite ones (the gather was the rule's
    # largest cost on the all-finite tensors it nearly always judges)
    from harness.sweep.numerics import _rms, _rmse, scaled_allclose

    a = torch.tensor([1.0, 2.0, math.inf, 4.0, math.nan])
    b = torch.tensor([1.5, 2.0, math.inf, 3.0, math.nan])
    assert _rmse(a, b) == pytest.approx(math.sqrt((0.25 + 1.0) / 3))  # inf - inf and nan: left out
    assert _rms(a) == pytest.approx(math.sqrt((1 + 4 + 16) / 3))
    assert _rmse(a[:2], b[:2]) == pytest.approx(math.sqrt(0.25 / 2)) and _rms(a[:2]) == pytest.approx(math.sqrt(2.5))
    assert _rmse(torch.tensor([math.nan]), torch.tensor([math.nan])) == 0.0
    assert scaled_allclose(a, a.clone(), 1e-6, 1.0)
    assert not scaled_allclose(a, b, 1e-6, 1.0)  # a finite element differs, beside the non-finite ones
    assert scaled_allclose(a[:2], a[:2] + 1e-8, 1e-6, 1.0) and not scaled_allclose(a[:2], b[:2], 1e-6, 1.0)


def test_a_difference_only_in_subnormals_is_flush_to_zero_not_error():
    # XLA:CPU flushes float32 subnormals to zero as a TPU does; CPU keeps them (docs/device.md). DeepSeek-OCR2's
    # SAM encoder has a qkv weight gradient of scale 4e-39: tpu's zeros failed allclose relative to that scale.
    torch.manual_seed(0)
    tiny = torch.finfo(torch.float32).tiny
    ref = torch.rand(256) * tiny  # every element subnormal
    res = torch.where(torch.rand(256) < 0.5, torch.zeros(256), ref)  # some flushed, some kept
    tol = Tolerance(1e-4)
    for fp64 in (None, ref.double() * (1 + 1e-9)):  # allclose, and the float64 rule
        match, m, reason = compare_tensor("grad", ref, res, fp64, tol)
        assert match, reason
    assert compare_outputs({"g": ref}, {"g": torch.zeros(256)}, None, tol).match  # all flushed


def test_a_real_error_at_normal_scale_still_fails_beside_the_flush_rule():
    torch.manual_seed(0)
    tol = Tolerance(1e-4)
    for scale in (1.0, 1e-30):  # 1e-30 is normal in float32: a 1% error there is 1e-32 per element, >> tiny
        ref = torch.randn(256) * scale
        bad = ref * 1.01
        for fp64 in (None, ref.double()):
            match, _, reason = compare_tensor("grad", ref, bad, fp64, tol)
            assert not match, (scale, fp64 is None)
    # a subnormal tensor against a result of normal size is an error too
    ref = torch.rand(256) * torch.finfo(torch.float32).tiny
    assert not compare_tensor("grad", ref, ref + 1e-37, None, tol)[0]


def test_float16_keeps_its_subnormals_so_the_flush_rule_does_not_excuse_its_errors():
    # tpu keeps float16 subnormals (float16 is computed in float32, where they are normal): float16's tiny
    # (6.1e-5) must not excuse a 4% error on a tensor of scale 1e-3.
    torch.manual_seed(0)
    ref = (torch.rand(256) * 1e-3 + 1e-3).half()
    bad = (ref.float() + 4e-5).half()
    assert not compare_tensor("grad", ref, bad, None, Tolerance(1e-3))[0]
