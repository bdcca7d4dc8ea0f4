"""Shrunk models whose outputs carried no signal (issue 32): batch norms that let it die (EfficientNet, PP-LCNet),
zero codebooks (Mimi). Built now, their outputs are alive and follow their inputs."""

import pytest
import torch

from harness.sweep import informative
from harness.zoo import output_tensors
from harness.zoo.entry import BuiltEntry
from harness.zoo.norm_calibration import VANISHING, calibrate_batch_norms, dead, keep_alive


def _stack(depth: int = 12, gamma_std: float = 0.02) -> torch.nn.Module:
    """Conv-BN-ReLU blocks initialised as EfficientNet's _init_weights does (scale ~ N(0, 0.02^2))."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        conv, bn = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        torch.nn.init.normal_(conv.weight, std=0.02)
        torch.nn.init.zeros_(conv.bias)
        torch.nn.init.normal_(bn.weight, std=gamma_std)
        layers += [conv, bn, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


class _Wrap(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, pixel_values):
        return {"logits": self.body(pixel_values).mean((2, 3))}


def _built(model):
    x = torch.randn(2, 8, 16, 16, generator=torch.Generator().manual_seed(1))
    return BuiltEntry(model=_Wrap(model).eval(), inputs={"pixel_values": x})


def _out(built, inputs=None):
    with torch.no_grad():
        return output_tensors(built.call(built.model, inputs or built.inputs))


def test_dead_names_zero_constant_and_vanishing_outputs():
    assert dead({"a": torch.zeros(3)}) == "a: all zeros"
    assert dead({"a": torch.full((3,), 0.5)}) == "a: constant"
    assert dead({"a": torch.randn(3) * VANISHING / 10}) == "a: vanishing"
    assert dead({"a": torch.zeros(3), "b": torch.randn(3)}) == ""  # one live output keeps the model
    assert dead({"ids": torch.zeros(3, dtype=torch.long)}) == ""  # no floating output: nothing to judge


def test_dead_stack_is_calibrated_deterministically_and_carries_information():
    a, b = _built(_stack()), _built(_stack())
    assert dead(_out(a))  # the signal shrinks ~50x per block
    assert keep_alive(a, 0) and keep_alive(b, 0)
    assert a.notes["calibrated_batch_norms"]["count"] == 12
    out = _out(a)
    assert not dead(out) and float(out["logits"].abs().max()) > 1e-3
    assert torch.equal(out["logits"], _out(b)["logits"])  # the same model for the same seed
    perturbed = _out(a, informative.perturb_inputs(a.inputs, 0))
    assert informative.uninformative(out, perturbed) == ""
    assert all(not m.training for m in a.model.modules())  # back in eval mode


def test_live_model_is_left_alone():
    built = _built(_stack(depth=2, gamma_std=1.0))
    before = {k: v.clone() for k, v in built.model.state_dict().items()}
    assert keep_alive(built, 0) == "" and "calibrated_batch_norms" not in built.notes
    assert all(torch.equal(before[k], v) for k, v in built.model.state_dict().items())


def test_constant_channel_variance_is_floored():
    """A channel constant on the calibration inputs would divide float32 rounding by sqrt(eps) (PP-OCRv5's
    recogniser came out chaotic: float64 and float32 disagreed by 0.16 of the output's scale)."""
    from harness.zoo.norm_calibration import VAR_FLOOR

    bn = torch.nn.BatchNorm2d(3).eval()
    x = torch.randn(2, 3, 4, 4)
    x[:, 1] = 0.5  # a dead channel
    calibrate_batch_norms(bn, lambda: bn(x))
    var = x.double().var((0, 2, 3), unbiased=False)
    assert float(bn.running_var[1]) == pytest.approx(VAR_FLOOR * float(var.mean()), rel=1e-5)
    assert torch.allclose(bn.running_var[[0, 2]].double(), var[[0, 2]], rtol=1e-5)
    assert torch.allclose(bn.running_mean.double(), x.double().mean((0, 2, 3)), atol=1e-6)


def test_failed_calibration_restores_the_model():
    built = _built(_stack(depth=2))
    before = {k: v.clone() for k, v in built.model.state_dict().items()}

    def boom():
        raise RuntimeError("Expected more than 1 value per channel when training")

    with pytest.raises(RuntimeError):
        calibrate_batch_norms(built.model, boom)
    assert all(torch.equal(before[k], v) for k, v in built.model.state_dict().items())
    assert all(not m.training for m in built.model.modules())


@pytest.mark.parametrize("entry_id", ["transformers/efficientnet/EfficientNetModel",
                                      "transformers/pp_lcnet/PPLCNetForImageClassification"])
def test_zoo_entry_that_was_dead_is_informative(entry_id):
    """EfficientNet's outputs were all zeros and PP-LCNet's ~1e-38 (subnormal: XLA flushes them, a false
    fail_accuracy) in the accepted full zoo; built now, they carry information and follow their input."""
    from harness.zoo.registry import transformers_entries

    (entry,) = [e for e in transformers_entries() if e.id == entry_id]
    built = entry.build(0)
    assert built.notes["calibrated_batch_norms"]["count"] > 0
    out = _out(built)
    assert not dead(out)
    assert informative.uninformative(out, _out(built, informative.perturb_inputs(built.inputs, 0))) == ""


# ------------------------------------------------------------------------------------------ zero codebooks
class _Codebook(torch.nn.Module):
    """As Mimi's EuclideanCodebook: zero centroids in a buffer, a derived cache filled at first use."""

    def __init__(self):
        super().__init__()
        self.embed_sum = torch.nn.Buffer(torch.zeros(16, 4))
        self.cluster_usage = torch.nn.Buffer(torch.zeros(16))
        self._embed = None

    def forward(self, x):
        if self._embed is None:
            self._embed = self.embed_sum.clone()
        return self._embed[torch.cdist(x, self._embed).argmin(-1)]


def test_zero_codebook_is_drawn_and_its_cache_dropped():
    from harness.zoo.zero_init import reinit_zero_weights

    a, b = _Codebook(), _Codebook()
    a(torch.randn(5, 4))  # the builder's probes fill the cache from the zero centroids
    assert reinit_zero_weights(a, 0) == ["embed_sum"] == reinit_zero_weights(b, 0)  # 1-D statistics stay
    assert a._embed is None and torch.equal(a.embed_sum, b.embed_sum) and not bool(a.cluster_usage.any())
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    assert len(torch.unique(a(x), dim=0)) > 1  # frames map to different codes


def test_mimi_output_follows_its_input():
    """MimiModel's decoded audio was the same whatever the input (every frame quantised to code 0)."""
    from harness.zoo.registry import transformers_entries

    (entry,) = [e for e in transformers_entries() if e.id == "transformers/mimi/MimiModel"]
    built = entry.build(0)
    out = _out(built)
    assert informative.uninformative(out, _out(built, informative.perturb_inputs(built.inputs, 0))) == ""


class _Chaotic(torch.nn.Module):
    """A head that turns float32 rounding into O(1) differences: sin of a huge multiple of its input."""

    def forward(self, x):
        return torch.sin(x * 1e6)


def test_calibration_that_leaves_the_model_chaotic_is_reverted():
    """Calibrated, PPOCRV5MobileRecForTextRecognition's float32 and float64 outputs disagreed by 1.1e-2 of their
    scale: every backend 'failed' it. Such a calibration is undone, the drift recorded; the model stays as built."""
    built = _built(torch.nn.Sequential(_stack(), _Chaotic()))
    before = {k: v.clone() for k, v in built.model.state_dict().items()}
    assert keep_alive(built, 0) == ""
    assert "calibrated_batch_norms" not in built.notes
    assert built.notes["calibration_reverted"]["float64_drift"] > 1e-3
    assert all(torch.equal(before[k], v) for k, v in built.model.state_dict().items())
    healthy = _built(_stack())
    assert keep_alive(healthy, 0) and healthy.notes["calibrated_batch_norms"]["float64_drift"] < 1e-5


# ------------------------------------------------------------------------ selections over constant scores
class _Detector(torch.nn.Module):
    """As the RT-DETR family: a dead conv backbone leaves the query scores a constant bias, `topk` selects
    among exact ties, while another output (the anchors) stays alive so the model is not dead as a whole."""

    def __init__(self):
        super().__init__()
        self.body = _stack()
        self.score = torch.nn.Linear(8, 1)
        torch.nn.init.constant_(self.score.bias, -4.6)
        self.anchor = torch.nn.Parameter(torch.randn(64, 2, generator=torch.Generator().manual_seed(3)))

    def forward(self, pixel_values):
        memory = self.body(pixel_values).flatten(2).transpose(1, 2)  # (B, 64, 8)
        scores = self.score(memory).squeeze(-1)
        idx = torch.topk(scores, 4, dim=1).indices
        boxes = self.anchor[idx] + memory.gather(1, idx.unsqueeze(-1).expand(-1, -1, 8))[..., :2]
        return {"pred_boxes": boxes, "anchors": self.anchor.expand(pixel_values.shape[0], -1, -1)}


def test_selection_over_constant_scores_is_calibrated():
    from harness.zoo.norm_calibration import ConstantSelections

    x = torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    built = BuiltEntry(model=_Detector().eval(), inputs={"pixel_values": x})
    with ConstantSelections() as watch, torch.no_grad():
        assert not dead(_out(built))  # the anchors keep it alive: the dead-outputs rule alone would not act
    assert watch.seen and "topk" in watch.seen[0]
    assert keep_alive(built, 0).startswith("selection over constant scores: topk")
    from harness.zoo.norm_calibration import SELECTION_ILL_CONDITIONED

    assert built.notes["calibrated_batch_norms"]["float64_drift"] < SELECTION_ILL_CONDITIONED
    with ConstantSelections() as watch, torch.no_grad():
        _out(built)
    assert watch.seen == []  # the scores now rank something


def test_selection_over_live_scores_is_left_alone():
    from harness.zoo.norm_calibration import ConstantSelections

    with ConstantSelections() as watch:
        torch.topk(torch.tensor([[0.5, 0.5, 0.1]]), 2)  # a tie between some scores is not a constant score map
        torch.topk(torch.zeros(4, 1), 1)  # one candidate per row (Informer's sparsity scores): no choice made
        torch.sort(torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), dim=0)  # constant only across the dim ranked
        torch.argmax(torch.tensor([1.0, 1.0, 1.0]))
    assert watch.seen == ["argmax(3,) over constant 1"]


@pytest.mark.parametrize("entry_id, calibrated", [("transformers/pp_doclayout_v3/PPDocLayoutV3Model", True),
                                                  ("transformers/d_fine/DFineModel", False)])
def test_detr_family_selection_rule(entry_id, calibrated):
    """PP-DocLayout V3's query scores were one constant (84 exact ties for 16 queries: every kernel picked other
    queries, 10 false fail_accuracy rows); calibrated it is well-conditioned. D-FINE calibrated comes out near
    the reference bound (an eager row failed on float32 noise), so it stays as built."""
    from harness.zoo.registry import transformers_entries

    (entry,) = [e for e in transformers_entries() if e.id == entry_id]
    built = entry.build(0)
    assert ("calibrated_batch_norms" in built.notes) == calibrated
    note = built.notes.get("calibrated_batch_norms") or built.notes.get("calibration_reverted")
    assert note["was"].startswith("selection over constant scores: topk")
