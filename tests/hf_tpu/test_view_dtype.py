"""`Tensor.view(dtype)` on tpu (a bitcast), against CPU. safetensors' `get_tensor` on a device reads the
bytes as uint8 and views them as the dtype: before the fix the view kept the uint8 values, so accelerate's
disk offload (weights read with `safe_open(device=0)`) ran GPT-2 on garbage weights."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import hf_tpu  # noqa: F401

PAIRS = [(torch.uint8, torch.float32), (torch.float32, torch.uint8), (torch.float32, torch.int32),
         (torch.int32, torch.float32), (torch.bfloat16, torch.int16), (torch.float16, torch.uint8),
         (torch.uint8, torch.float16), (torch.int8, torch.bool), (torch.int64, torch.float64),
         (torch.float32, torch.bfloat16), (torch.float32, torch.float32)]


@pytest.mark.parametrize("src,dst", PAIRS, ids=lambda d: str(d).removeprefix("torch."))
def test_view_dtype_matches_cpu(src: torch.dtype, dst: torch.dtype) -> None:
    torch.manual_seed(0)
    base = torch.randn(3, 8, 8).view(torch.uint8)  # arbitrary bytes, viewed as src
    # bytes other than 0 and 1 are not valid bools (PyTorch leaves them undefined)
    cpu = (base % 2 if torch.bool in (src, dst) else base).view(src)[:, ::2]  # a strided view of the source
    got = cpu.to("tpu").view(dst)
    want = cpu.view(dst)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))  # bit for bit (NaNs included)


def test_view_dtype_bad_size_raises() -> None:
    with pytest.raises(RuntimeError, match="divisible"):
        torch.zeros(3, dtype=torch.uint8, device="tpu").view(torch.float32)


def test_safetensors_get_tensor_on_tpu_matches_cpu() -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    ws = {"w": torch.randn(4, 6), "b": torch.arange(5, dtype=torch.bfloat16), "i": torch.arange(3)}
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "m.safetensors")
        save_file(ws, path)
        with safe_open(path, framework="pt", device=0) as f:  # as accelerate's disk offload reads weights
            for k, want in ws.items():
                got = f.get_tensor(k)
                assert got.device.type == "tpu"
                torch.testing.assert_close(got.cpu(), want)


def test_gpt2_with_disk_offload_matches_cpu(highest: None) -> None:
    """Transformers' test_disk_offload_safetensors, small: half the blocks on tpu, the rest on disk."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(vocab_size=99, n_embd=32, n_layer=4, n_head=4, n_positions=64)).eval()
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        want = model(ids).last_hidden_state
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        new = GPT2Model.from_pretrained(d, device_map="auto", max_memory={0: size // 2, "cpu": size // 2},
                                        offload_folder=d)
        assert "disk" in set(new.hf_device_map.values())
        with torch.no_grad():
            got = new(ids.to("tpu")).last_hidden_state
    torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-3)


def test_view_dtype_in_a_compiled_graph() -> None:
    """Compiled graphs look the op up in the same table (torchax's `view` lowering would reshape by a dtype)."""
    cpu = torch.randn(4, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).view(torch.int32) & 0xFFFF

    got = torch.compile(f, backend="tpu")(cpu.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(cpu))
