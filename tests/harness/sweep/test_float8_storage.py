"""`hf-tpu sweep --dtype float8_e4m3fn`: float8 weight storage with bfloat16 compute (Diffusers' layerwise
casting) on CPU and tpu, judged against CPU's own float8-storage run and a float64 reference that keeps the
same float8 weights."""

import dataclasses

import pytest
import torch

from harness.core import model_dtype
from harness.entry_calls import prepare_inputs, prepare_model
from harness.sweep import runner, testzoo
from harness.sweep.device import get_device
from harness.sweep.options import SweepOptions


def _opts(tmp_path, dtype="float8_e4m3fn"):
    return SweepOptions(zoo="test:pass", device="tpu", out=str(tmp_path / "run"), run_id="t", timeout=300,
                        memory_cap_gb=4, progress="none", repeats=1, precision="highest", dtype=dtype)


def _rows(opts, modes=("eager", "compiled")):
    (entry,) = testzoo.parse_spec("test:pass")
    events = []
    runner.run_entry(entry, modes, opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    return {p["mode"]: p for k, p in events if k == "row"}


@pytest.mark.parametrize("name", model_dtype.FLOAT8_STORAGE)
def test_float8_storage_keeps_float8_weights_and_computes_in_bfloat16(name):
    storage = getattr(torch, name)
    (entry,) = testzoo.parse_spec("test:pass")
    built = entry.build(seed=0)
    spec = model_dtype.resolve(name)
    m = prepare_model(built.model, "tpu", spec)
    linears = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    assert linears and all(mod.weight.dtype == storage and mod.weight.device.type == "tpu" for mod in linears)
    with torch.no_grad():
        out = built.call(m, prepare_inputs(built.inputs, "tpu", spec))
        cpu = built.call(prepare_model(built.model, None, spec), prepare_inputs(built.inputs, None, spec))
    out, cpu = (next(iter(o.values())) if isinstance(o, dict) else o for o in (out, cpu))
    assert out.dtype == torch.bfloat16 and all(mod.weight.dtype == storage for mod in linears)  # stored again
    torch.testing.assert_close(out.cpu(), cpu, rtol=1.6e-2, atol=1e-2)


def test_the_float64_reference_keeps_the_float8_weights():
    (entry,) = testzoo.parse_spec("test:pass")
    built = entry.build(seed=0)
    spec = model_dtype.resolve("float8_e4m3fn")
    ref = prepare_model(built.model, None, model_dtype.float64_reference(spec))
    fc1 = ref.fc1
    assert fc1.weight.dtype == torch.float8_e4m3fn
    # the float8 values are the bfloat16 model's, rounded once: the same weights the CPU baseline and tpu hold
    expected = built.model.fc1.weight.detach().to(torch.bfloat16).to(torch.float8_e4m3fn)
    assert torch.equal(fc1.weight.view(torch.uint8), expected.view(torch.uint8))
    with torch.no_grad():
        out = built.call(ref, prepare_inputs(built.inputs, None, model_dtype.float64_reference(spec)))
    out = next(iter(out.values())) if isinstance(out, dict) else out
    assert out.dtype == torch.float64


def test_a_float8_run_passes_on_tpu_and_says_its_dtype(tmp_path):
    rows = _rows(_opts(tmp_path))
    for mode in ("eager", "compiled"):
        assert rows[mode]["status"] == "pass", rows[mode]
        assert rows[mode]["dtype"] == "float8_e4m3fn" and rows[mode]["reference"] == "valid"


def test_a_backend_that_ignores_the_float8_storage_fails(tmp_path, monkeypatch):
    """The rows can fail: tpu computing with the bfloat16 weights instead of their float8 rounding (what a
    backend whose float8 casts were identities would do) is a fail_accuracy."""
    real = runner.prepare_model

    def bfloat16_on_tpu(model, device=None, dtype=None, rebuild=None):
        if device == "tpu" and isinstance(dtype, model_dtype.LayerwiseCast):
            dtype = dtype.compute
        return real(model, device, dtype, rebuild)

    monkeypatch.setattr(runner, "prepare_model", bfloat16_on_tpu)
    rows = _rows(_opts(tmp_path), modes=("eager",))
    assert rows["eager"]["status"] == "fail_accuracy", rows["eager"]


def test_float8_storage_with_the_train_phase_is_refused_with_the_fix(tmp_path, capsys):
    from harness.cli import main

    assert main(["sweep", "--zoo", "test:pass", "--dtype", "float8_e4m3fn", "--phases", "inference,train",
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "float8_e4m3fn" in err and "Train at float32 or bfloat16" in err


def test_unknown_model_dtype_names_the_choices():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        model_dtype.resolve("float8")
    assert dataclasses.is_dataclass(model_dtype.resolve("float8_e5m2"))


def test_a_layer_tied_to_a_skipped_one_keeps_the_compute_dtype():
    """Whisper's `proj_out` (skipped by Diffusers' default patterns) shares `embed_tokens`' weight: storing the
    embedding in float8 made the output projection fail on CPU ("expected m1 and m2 to have the same dtype")."""

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(10, 8)
            self.hidden = torch.nn.Linear(8, 8)
            self.proj_out = torch.nn.Linear(8, 10, bias=False)
            self.proj_out.weight = self.embed_tokens.weight

        def forward(self, ids):
            return self.proj_out(self.hidden(self.embed_tokens(ids)))

    spec = model_dtype.resolve("float8_e4m3fn")
    m = model_dtype.cast_model(Tied(), spec)
    assert m.hidden.weight.dtype == torch.float8_e4m3fn and m.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3]])
    assert m(ids).dtype == torch.bfloat16
    assert m.to("tpu")(ids.to("tpu")).cpu().dtype == torch.bfloat16
