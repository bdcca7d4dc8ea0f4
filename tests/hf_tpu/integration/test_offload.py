"""CPU and disk offload through Accelerate's hooks with `tpu` as the execution device, compared with CPU.

Transformers' own `test_cpu_offload` failed on tpu for T5 with "aten::mul.Tensor failed on tpu: Incompatible
shapes for broadcasting": every tpu tensor reported data_ptr() 0, and Accelerate's offload hooks keep the
tied weights already onloaded to a device in a dict keyed by data_ptr(), so a layer norm's weight was taken
for the (tied) embedding already on tpu. tpu tensors now report one data_ptr() per device buffer (shared by
its views and aliases, as a CUDA allocation's)."""

from __future__ import annotations

import pytest
import torch
from _hf_tiny import rel_err, save_tiny, t5

from hf_tpu.precision import cpu_reference

HIGHEST_RTOL = 1e-4


def test_data_ptr_names_the_device_buffer() -> None:
    a = torch.arange(12.0).reshape(3, 4).to("tpu")
    b = a + 1
    assert a.data_ptr() != 0 and b.data_ptr() != 0 and a.data_ptr() != b.data_ptr()
    # views and aliases share it; copies do not
    assert a.t().data_ptr() == a[1:].data_ptr() == a.detach().data_ptr() == a.view(12).data_ptr() == a.data_ptr()
    assert a.clone().data_ptr() != a.data_ptr()
    assert a.untyped_storage().data_ptr() == a.data_ptr()
    # an in-place write keeps the memory, as on any device
    ptr = a.data_ptr()
    a.add_(1)
    assert a.data_ptr() == ptr
    # tied weights (one Parameter) share it after a move, as Accelerate's tied-parameter map expects
    emb = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head}).to("tpu")
    assert model["emb"].weight.data_ptr() == model["head"].weight.data_ptr() != 0


def _t5_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(2, 99, (2, 7), generator=g),
            "decoder_input_ids": torch.randint(2, 99, (2, 5), generator=g),
            "attention_mask": torch.ones(2, 7, dtype=torch.long)}


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory: pytest.TempPathFactory):
    # five layers per stack so that a budget of half the model splits it inside the stacks
    config = t5()
    config.num_layers = config.num_decoder_layers = 5
    return save_tiny("AutoModel", config, tmp_path_factory.mktemp("t5_offload"))


def _cpu_reference(path) -> torch.Tensor:  # noqa: ANN001
    import transformers

    with cpu_reference(), torch.no_grad():
        return transformers.T5Model.from_pretrained(path).eval()(**_t5_inputs()).last_hidden_state


def _size(path) -> int:  # noqa: ANN001
    import transformers
    from accelerate.utils import compute_module_sizes

    return compute_module_sizes(transformers.T5Model.from_pretrained(path))[""]


@pytest.mark.parametrize("where", ["cpu", "disk"])
def test_from_pretrained_offload_matches_cpu(t5_dir, where: str, tmp_path, highest) -> None:  # noqa: ANN001
    import transformers

    size = _size(t5_dir)
    # "cpu": half the model on tpu:0, the rest offloaded to host memory; "disk": little host memory either
    budget = {0: size // 2, "cpu": 2 * size} if where == "cpu" else {0: size // 3, "cpu": size // 4}
    model = transformers.T5Model.from_pretrained(t5_dir, device_map="auto", max_memory=budget,
                                                 offload_folder=str(tmp_path)).eval()
    placed = set(model.hf_device_map.values())
    assert placed == {0, "cpu"} if where == "cpu" else {0, "disk"} <= placed, placed
    with torch.no_grad():
        out = model(**{k: v.to("tpu") for k, v in _t5_inputs().items()}).last_hidden_state
    assert out.device.type == "tpu"
    assert rel_err(_cpu_reference(t5_dir), out) <= HIGHEST_RTOL


def test_accelerate_cpu_offload_hooks_match_cpu(t5_dir, highest) -> None:  # noqa: ANN001
    """Accelerate's own `cpu_offload`: every weight on the meta device between calls, onloaded to tpu per
    module (tied embedding included)."""
    import accelerate
    import transformers

    model = transformers.T5Model.from_pretrained(t5_dir).eval()
    accelerate.cpu_offload(model, execution_device=torch.device("tpu"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    with torch.no_grad():
        out = model(**{k: v.to("tpu") for k, v in _t5_inputs().items()}).last_hidden_state
    assert out.device.type == "tpu"
    assert rel_err(_cpu_reference(t5_dir), out) <= HIGHEST_RTOL
