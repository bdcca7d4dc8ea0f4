"""A large CPU tensor moved to tpu lands in a buffer XLA:CPU owns (hf_tpu/host_copy.py, OWNED_BYTES), so the
fused optimizer's first step donates the parameter and writes the new one over it instead of copying every
parameter once more (peak RSS of a training step's first optimizer step: issue 25); the copy is still a
copy (later writes to the CPU tensor do not reach it), and small tensors keep the adopted-numpy path."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import host_copy
from hf_tpu import tensor as T


def _pointer(t: torch.Tensor) -> int:
    return T.payload(t).buf.array.unsafe_buffer_pointer()


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_first_fused_step_writes_over_a_moved_parameter(opt_cls: type) -> None:
    cpu = torch.nn.Parameter(torch.randn(512, 1024))  # 2 MiB: above OWNED_BYTES
    p = torch.nn.Parameter(cpu.detach().to("tpu"))
    before = _pointer(p)
    p.grad = torch.full_like(p, 0.5)
    cpu.grad = torch.full_like(cpu, 0.5)
    kwargs = dict(lr=0.1, fused=True) if opt_cls is torch.optim.AdamW else dict(lr=0.1, momentum=0.9, fused=True)
    opt_cls([p], **kwargs).step()
    opt_cls([cpu], **kwargs).step()
    assert _pointer(p) == before  # donated: no second buffer for the parameter (a new one before)
    torch.testing.assert_close(p.detach().cpu(), cpu.detach())  # CPU fused step, within float32 rounding


@pytest.mark.parametrize("shape", [(300, 1024), (8,)])
def test_moved_tensor_is_a_copy(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    y = x.to("tpu")
    expected = x.clone()
    x.add_(1)  # the CPU tensor changes after the move
    assert torch.equal(y.cpu(), expected)


def test_large_move_threshold_is_what_the_docstring_says() -> None:
    # a strided source (not a view of contiguous memory) takes the same owned path after contiguous()
    x = torch.randn(1024, 512).t()
    assert x.numel() * 4 >= host_copy.OWNED_BYTES
    assert torch.equal(x.to("tpu").cpu(), x)
