"""F.linear_cross_entropy's chunked path (options=LinearCrossEntropyOptions()) on tpu in bfloat16 and float16:
its "auto" options resolve as CPU's (patches/torch_patches.py tpu_lce_options), so the loss and the gradients
are CPU's within OpInfo's tolerances (op_parity.TOLERANCES; before, the bfloat16 loss was 1 ulp off and the float16
gradients 0.5%: half-type accumulation)."""

from __future__ import annotations

import op_parity
import pytest
import torch
import torch.nn.functional as F
from torch.nn import LinearCrossEntropyOptions


def _run(device: str, dtype: torch.dtype, reduction: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g).to(dtype)
    w = torch.randn(40, 16, generator=g).to(dtype)
    target = torch.randint(0, 40, (8,), generator=g)
    x, w = x.to(device).requires_grad_(), w.to(device).requires_grad_()
    loss = F.linear_cross_entropy(x, w, target.to(device), reduction=reduction,
                                  options=LinearCrossEntropyOptions(batch_chunk_size=3))
    cot = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape).to(device, dtype)
    gx, gw = torch.autograd.grad(loss, (x, w), cot)
    return [loss.detach().cpu(), gx.cpu(), gw.cpu()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_chunked_linear_cross_entropy_half_is_cpus(highest, dtype: torch.dtype, reduction: str) -> None:
    for got, want in zip(_run("tpu", dtype, reduction), _run("cpu", dtype, reduction), strict=True):
        rtol, atol = op_parity.TOLERANCES[dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
