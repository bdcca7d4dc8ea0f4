"""addmm, addbmm and addr on bfloat16/float16 round where CPU's kernels round (half_kernels, lowering_parity's
OPMATH; issue 26): addmm once after beta * self + alpha * product in float32, addbmm after every batch, addr
after every step of `beta * self + alpha * vec1 * vec2`. Inputs are larger than OpInfo's samples, with CPU's
result compared at OpInfo's tolerances (op_parity.compare) and, for the elementwise addr, bit for bit."""

from __future__ import annotations

import pytest
import torch

import op_parity

HALF = (torch.bfloat16, torch.float16)


def _randn(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def _both(fn, *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return fn(*tensors), fn(*(t.to("tpu") for t in tensors)).cpu()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2), (0, 1)])
def test_addmm_rounds_once(highest, dtype: torch.dtype, beta: float, alpha: float) -> None:
    m, a, b = _randn(40, 30, seed=0, dtype=dtype), _randn(40, 6, seed=1, dtype=dtype), _randn(6, 30, seed=2, dtype=dtype)
    op_parity.compare(*_both(lambda m, a, b: torch.addmm(m, a, b, beta=beta, alpha=alpha), m, a, b))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2), (0, 1)])
def test_addbmm_rounds_after_each_batch(highest, dtype: torch.dtype, beta: float, alpha: float) -> None:
    m, a, b = (_randn(12, 20, seed=0, dtype=dtype), _randn(9, 12, 5, seed=1, dtype=dtype),
               _randn(9, 5, 20, seed=2, dtype=dtype))
    op_parity.compare(*_both(lambda m, a, b: torch.addbmm(m, a, b, beta=beta, alpha=alpha), m, a, b))


@pytest.mark.parametrize("dtype", [*HALF, torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 3), (0, 1)])
def test_addr_steps_as_cpu(dtype: torch.dtype, beta: float, alpha: float) -> None:
    if dtype in (torch.int64, torch.bool):
        beta, alpha = (bool(beta), bool(alpha)) if dtype == torch.bool else (int(beta * 2), alpha)
    m, a, b = _randn(1, 300, seed=0, dtype=dtype), _randn(200, seed=1, dtype=dtype), _randn(300, seed=2, dtype=dtype)
    expected, actual = _both(lambda m, a, b: torch.addr(m, a, b, beta=beta, alpha=alpha), m, a, b)
    if dtype == torch.float32:  # CPU's build may contract float32 steps into FMAs; no rounding to a half type
        op_parity.compare(expected, actual)
    else:
        assert torch.equal(expected, actual)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d"])
def test_convolutions_accumulate_in_float32(highest, dtype: torch.dtype, name: str) -> None:
    """Forward and input/weight gradients: CPU's float32 accumulation rounded once (lowering_parity's OPMATH);
    the order of a float32 sum may still differ from CPU's, so a few elements may round the other way."""
    fn = getattr(torch.nn.functional, name)
    spatial = 3 if name.endswith("3d") else 2
    x = _randn(2, 4, *([6] * spatial), seed=0, dtype=dtype)
    w = _randn(*((4, 3) if "transpose" in name else (3, 4)), *([3] * spatial), seed=1, dtype=dtype)
    bias = _randn(3, seed=2, dtype=dtype)
    results = []
    for dev in ("cpu", "tpu"):
        xv, wv = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        out = fn(xv, wv, bias.to(dev), padding=1)
        grads = torch.autograd.grad(out, (xv, wv), torch.ones_like(out) * 0.5)
        results.append([out.detach().cpu(), *(g.cpu() for g in grads)])
    for e, a in zip(*results, strict=True):
        op_parity.compare(e, a)
        assert (e != a).float().mean() < 0.02


@pytest.mark.parametrize("dtype", [*HALF, torch.float32], ids=str)
def test_bilinear_rounds_each_contraction(highest, dtype: torch.dtype) -> None:
    """_trilinear as CPU's (half_steps): x1 . W rounded, then . x2 rounded, then + bias; its gradients are
    _trilinear calls too (with a summed unroll dim: slices added in turn)."""
    x1, x2 = _randn(8, 6, seed=0, dtype=dtype), _randn(8, 7, seed=1, dtype=dtype)
    w, b = _randn(5, 6, 7, seed=2, dtype=dtype), _randn(5, seed=3, dtype=dtype)
    results = []
    for dev in ("cpu", "tpu"):
        ins = [t.to(dev).requires_grad_() for t in (x1, x2, w, b)]
        out = torch.nn.functional.bilinear(*ins)
        grads = torch.autograd.grad(out, ins, torch.ones_like(out) * 0.5)
        results.append([out.detach().cpu(), *(g.cpu() for g in grads)])
    for i, (e, a) in enumerate(zip(*results, strict=True)):
        op_parity.compare(e, a)
        if dtype != torch.float32:
            assert (e != a).float().mean() < (0.01 if i == 0 else 0.05), i
