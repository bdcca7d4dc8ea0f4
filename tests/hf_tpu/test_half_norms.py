"""Vector norms of bfloat16/float16 tensors as CPU computes them (issue 26): |x|^p accumulated in float32 and
the root rounded once (lowering_parity's OPMATH), also when the caller passes the half type as `dtype`, as
torch.masked.norm does (opmath computes in float32 instead of casting back to the half type)."""

from __future__ import annotations

import pytest
import torch

HALF = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("ord", [2, 4, 6, 1, 3.5])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("explicit", [False, True], ids=["", "dtype"])
def test_vector_norm_bit_equal(dtype: torch.dtype, ord: float, dim: int, explicit: bool) -> None:
    x = (torch.randn(5, 2000, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    kw = {"dtype": dtype} if explicit else {}
    expected = torch.linalg.vector_norm(x, ord, dim, **kw)
    assert torch.equal(expected, torch.linalg.vector_norm(x.to("tpu"), ord, dim, **kw).cpu())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_dist_and_normalize_bit_equal(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    a, b = ((torch.randn(40, 50, generator=g) * 5).to(dtype) for _ in range(2))
    for p in (2, 4):
        assert torch.equal(torch.dist(a, b, p), torch.dist(a.to("tpu"), b.to("tpu"), p).cpu())
    assert torch.equal(torch.masked.normalize(a, 2.0, 0), torch.masked.normalize(a.to("tpu"), 2.0, 0).cpu())
    assert torch.equal(torch.nn.functional.normalize(a, dim=0),
                       torch.nn.functional.normalize(a.to("tpu"), dim=0).cpu())
