"""harness/sweep/float64_ops.py: float64 grouped matmuls for the sweep's float64 reference runs."""

import pytest
import torch
import torch.nn.functional as F

from harness.sweep import float64_ops

OFFS = torch.tensor([8, 8, 24], dtype=torch.int32)  # an empty group among them


def _layouts():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"2d x 3d": (r(24, 8), r(3, 8, 16), OFFS), "3d x 2d": (r(3, 8, 8), r(8, 24), OFFS),
            "2d x 2d": (r(8, 24), r(24, 16), OFFS), "3d x 3d": (r(3, 8, 8), r(3, 8, 16), None)}


@pytest.mark.parametrize("layout", list(_layouts()))
def test_grouped_mm_is_pytorchs_in_float32(layout):
    a, b, offs = _layouts()[layout]
    torch.testing.assert_close(float64_ops.grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs=offs),
                               rtol=1e-6, atol=1e-6)


def test_float64_grouped_mm_runs_and_differentiates_within_kernels():
    """As Transformers' MoE experts call it (F.grouped_mm, tokens sorted by expert): PyTorch's CPU kernel
    refuses float64; within kernels() the float64 result and gradients are float32's within its rounding."""
    a, b, offs = _layouts()["2d x 3d"]
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    with float64_ops.kernels():
        F.grouped_mm(a64, b64, offs=offs).pow(2).sum().backward()
    a32, b32 = a.clone().requires_grad_(), b.clone().requires_grad_()
    out32 = torch._grouped_mm(a32, b32, offs=offs)
    out32.pow(2).sum().backward()
    torch.testing.assert_close(a64.grad.float(), a32.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b64.grad.float(), b32.grad, rtol=1e-5, atol=1e-5)
    with float64_ops.kernels():  # float32 calls are PyTorch's own
        assert torch.equal(F.grouped_mm(a, b, offs=offs), out32.detach())


def test_a_float64_tensor_cast_to_float32_stays_float64_within_kernels():
    """Autoformer's attention builds `torch.zeros_like(v).float()` and adds to it: in the float64 reference run
    that mixed float32 into float64 (out_proj: "mat1 and mat2 must have the same dtype") and the entry had no
    reference. Within kernels() the casts keep float64; float32 tensors, other casts and code outside are
    untouched."""
    x = torch.randn(3, 4, dtype=torch.float64)
    with float64_ops.kernels():
        for cast in (lambda t: t.float(), lambda t: t.to(torch.float32), lambda t: t.to("cpu", torch.float32),
                     lambda t: t.to(dtype=torch.float32), lambda t: t.type(torch.float32)):
            y = cast(x)
            assert y.dtype == torch.float64 and torch.equal(y, x)
        assert x.to(torch.float16).dtype == torch.float16 and x.long().dtype == torch.int64
        assert torch.randn(2).to(torch.float32).dtype == torch.float32
        w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        (x.float() @ w).sum().backward()  # differentiable through the kept cast
    assert w.grad is not None and w.grad.dtype == torch.float64
    assert x.float().dtype == torch.float32  # outside kernels(): PyTorch's own cast
