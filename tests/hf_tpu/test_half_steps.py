"""Ops whose CPU kernels step in the half type (hf_tpu/half_steps.py) or accumulate in float32 and round once
(embedding_bag, lowering_parity's OPMATH), bit for bit against CPU on bfloat16 and float16 (issue 26)."""

from __future__ import annotations

import pytest
import torch

F = torch.nn.functional
HALF = (torch.bfloat16, torch.float16)


def _randn(*shape: int, seed: int, dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("shape,out", [((8, 8, 8, 8), (5, 7, 4)), ((2, 3, 9, 6, 7), (4, 3, 5)),
                                       ((1, 2, 4, 4, 4), (1, 1, 1)), ((3, 5, 6, 7), (5, 6, 7))])
def test_adaptive_avg_pool3d_sums_in_the_half_type(dtype: torch.dtype, shape: tuple, out: tuple) -> None:
    x = _randn(*shape, seed=0, dtype=dtype)
    assert torch.equal(F.adaptive_avg_pool3d(x, out), F.adaptive_avg_pool3d(x.to("tpu"), out).cpu())


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_soft_margin_loss_steps_in_the_half_type(dtype: torch.dtype, reduction: str) -> None:
    """Scale 6: -x * y reaches past float16's exp overflow (CPU's loss inf, its gradient NaN there)."""
    x = _randn(300, seed=1, dtype=dtype, scale=6.0)
    y = torch.randn(300, generator=torch.Generator().manual_seed(2)).sign().to(dtype)
    results = []
    for dev in ("cpu", "tpu"):
        v = x.to(dev).requires_grad_()
        loss = F.soft_margin_loss(v, y.to(dev), reduction=reduction)
        (g,) = torch.autograd.grad(loss, v, torch.ones_like(loss) * 0.75)
        results.append((loss.detach().cpu(), g.cpu()))
    (e_loss, e_grad), (a_loss, a_grad) = results
    assert torch.equal(e_loss, a_loss) or (e_loss.isnan().all() and a_loss.isnan().all())
    assert torch.allclose(e_grad, a_grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("mode,weighted", [("sum", True), ("sum", False), ("mean", False)])
def test_embedding_bag_accumulates_in_float32(dtype: torch.dtype, mode: str, weighted: bool) -> None:
    """Bag 0 of the unweighted bfloat16 sum ends on half-way points (fbgemm rounds them away from zero)."""
    w = _randn(50, 16, seed=3, dtype=dtype)
    idx = torch.randint(0, 50, (200,), generator=torch.Generator().manual_seed(4))
    offsets = torch.tensor([0, 7, 40, 41, 120])
    psw = _randn(200, seed=5, dtype=dtype) if weighted else None
    expected = F.embedding_bag(idx, w, offsets, mode=mode, per_sample_weights=psw)
    actual = F.embedding_bag(idx.to("tpu"), w.to("tpu"), offsets.to("tpu"), mode=mode,
                             per_sample_weights=None if psw is None else psw.to("tpu"))
    assert torch.equal(expected, actual.cpu())


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("spatial", [2, 3])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_bilinear_zeros_steps_in_the_half_type(dtype: torch.dtype, spatial: int,
                                                           align_corners: bool) -> None:
    """hf_tpu/grid_sampler.py: coordinates, corner weights and the sum of corners each rounded to the half
    type, as CPU's kernels; the grid reaches past [-1, 1] so corners fall outside (zeros padding)."""
    g = torch.Generator().manual_seed(spatial)
    size = (2, 3, 9, 11) if spatial == 2 else (2, 3, 5, 6, 7)
    x = (torch.randn(*size, generator=g) * 3).to(dtype)
    grid = (torch.rand(2, *([7] * spatial), spatial, generator=g) * 2.4 - 1.2).to(dtype)
    fn = torch.grid_sampler_2d if spatial == 2 else torch.grid_sampler_3d
    assert torch.equal(fn(x, grid, 0, 0, align_corners), fn(x.to("tpu"), grid.to("tpu"), 0, 0, align_corners).cpu())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_mish_backward_is_one_float32_evaluation(dtype: torch.dtype) -> None:
    """mish_backward is composite outside CPU/CUDA (op by op, each rounded to the half type); tpu registers it
    as one op (device.PER_OP_KERNELS) whose lowering computes in float32 and rounds once, as CPU's kernel."""
    x = _randn(3000, seed=0, dtype=dtype, scale=4.0)
    g = (torch.rand(3000, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    grads = []
    for dev in ("cpu", "tpu"):
        v = x.detach().clone().to(dev).requires_grad_()
        (grad,) = torch.autograd.grad(F.mish(v), v, g.to(dev))
        grads.append(grad.cpu())
    assert torch.equal(*grads)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("shape,dim", [((5, 5, 5), 0), ((1000, 4), 0), ((50, 30), 0), ((50, 30), 1),
                                       ((6, 17), 1), ((3, 7, 40), 1)])
def test_prod_along_a_dim_multiplies_in_the_half_type(dtype: torch.dtype, shape: tuple, dim: int) -> None:
    """CPU's prod along a dim (not a long contiguous row) multiplies in order, each product rounded; its
    gradient (result / input) then matches too."""
    x = (torch.rand(*shape, generator=torch.Generator().manual_seed(0)) * 0.6 + 0.7).to(dtype)
    results = []
    for dev in ("cpu", "tpu"):
        v = x.detach().clone().to(dev).requires_grad_()
        out = torch.prod(v, dim)
        (grad,) = torch.autograd.grad(out, v, torch.ones_like(out))
        results.append((out.detach().cpu(), grad.cpu()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
