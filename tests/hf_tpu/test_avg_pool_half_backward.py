"""avg_pool2d's backward for float16/bfloat16 on tpu as CPU's kernel accumulates it (half_steps.avg_pool2d_backward:
each window's grad / divisor rounded, added to its inputs in the half type, windows in (oh, ow) order): bit-equal
to CPU over overlapping, strided, padded, ceil-mode windows and every divisor rule; local_response_norm's
float16 gradient (OpInfo) went through it 1 ulp off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

CASES = [
    dict(kernel_size=(3, 1), stride=1),  # local_response_norm's pool
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, divisor_override=3),
]


def _grad(device: str, x: torch.Tensor, g: torch.Tensor, kwargs: dict) -> torch.Tensor:
    x = x.detach().to(device, copy=True).requires_grad_()
    out = F.avg_pool2d(x, **kwargs)
    (gx,) = torch.autograd.grad(out, x, g.to(device))
    return gx.cpu()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kwargs", CASES, ids=[str(i) for i in range(len(CASES))])
def test_avg_pool2d_half_backward_is_cpus(dtype: torch.dtype, kwargs: dict) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 6, generator=gen).to(dtype)
    shape = F.avg_pool2d(x.float(), **kwargs).shape
    g = (torch.randn(shape, generator=gen) * 3).to(dtype)
    want = _grad("cpu", x, g, kwargs)
    got = _grad("tpu", x, g, kwargs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_local_response_norm_half_gradient_is_cpus() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 5, generator=gen).to(torch.float16)
    grads = []
    for device in ("cpu", "tpu"):
        xd = x.to(device, copy=True).requires_grad_()
        out = F.local_response_norm(xd, 3, alpha=3e-2, beta=0.5, k=1.25)
        (gx,) = torch.autograd.grad(out, xd, torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape).to(device, x.dtype))
        grads.append(gx.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
