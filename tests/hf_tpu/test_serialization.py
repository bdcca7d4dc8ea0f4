"""torch.save / torch.load of tpu tensors, state dicts and modules, every map_location form (issue 25)."""

import io

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu.serialization import storage_to_tpu


def _roundtrip(obj, **kwargs):
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    return torch.load(f, **kwargs)


def _model() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    m[1].to(torch.bfloat16)
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    return m.to("tpu"), ref


MAP_LOCATIONS = {
    "None": (None, "tpu"),
    "cpu": ("cpu", "cpu"),
    "tpu": ("tpu", "tpu"),
    "device": (torch.device("tpu:0"), "tpu"),
    "dict_to_cpu": ({"tpu:0": "cpu"}, "cpu"),
    "callable_keep": (lambda storage, loc: storage, "cpu"),
    "callable_none": (lambda storage, loc: None, "tpu"),
    "callable_to_tpu": (lambda storage, loc: storage_to_tpu(storage), "tpu"),
}


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("name", list(MAP_LOCATIONS))
def test_state_dict_roundtrip(name: str, weights_only: bool) -> None:
    map_location, where = MAP_LOCATIONS[name]
    m, ref = _model()
    sd = _roundtrip(m.state_dict(), map_location=map_location, weights_only=weights_only)
    assert sd.keys() == ref.keys()
    for k, v in sd.items():
        assert v.device.type == where, k
        assert v.dtype == ref[k].dtype
        assert torch.equal(v.cpu(), ref[k]), k


def test_cpu_checkpoint_loads_to_tpu() -> None:
    ref = {"w": torch.randn(3, 4), "h": torch.randn(5, dtype=torch.float16),
           "i": torch.arange(6).reshape(2, 3)}
    ref["view"] = ref["w"][1:, ::2]  # a view: rebuilt with an offset and strides over the shared storage
    for ml in ("tpu", {"cpu": "tpu"}):
        got = _roundtrip(ref, map_location=ml, weights_only=True)
        for k, v in ref.items():
            assert got[k].device.type == "tpu"
            assert torch.equal(got[k].cpu(), v), k


def test_tensors_and_whole_module(highest: None) -> None:
    m, ref = _model()
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    assert torch.equal(_roundtrip(x).cpu(), x.cpu())
    assert torch.equal(_roundtrip(x.t(), map_location="tpu").cpu(), x.cpu().t())
    p = torch.nn.Parameter(torch.ones(2, device="tpu"))
    q = _roundtrip(p, weights_only=True)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device.type == "tpu"
    loaded = _roundtrip(m, weights_only=False)
    assert next(loaded.parameters()).device.type == "tpu"
    for k, v in loaded.state_dict().items():
        assert torch.equal(v.cpu(), ref[k])
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    cpu[1].to(torch.bfloat16)
    cpu.load_state_dict(ref)
    xin = torch.randn(2, 3)
    torch.testing.assert_close(loaded[0](xin.to("tpu")).cpu(), cpu[0](xin))


def test_skip_data_is_a_clear_error() -> None:
    with torch.serialization.skip_data(), pytest.raises(RuntimeError, match="skip_data"):
        torch.save(torch.ones(2, device="tpu"), io.BytesIO())
