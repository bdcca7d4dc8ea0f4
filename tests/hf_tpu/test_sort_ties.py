"""Unstable descending sorts order tied values as CPU does (hf_tpu/lowering_ops.py `_sort`)."""

from __future__ import annotations

import pytest
import torch

DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [17, 300])
@pytest.mark.parametrize("dim", [0, -1])
def test_descending_ties_give_cpus_indices(dtype, n, dim):
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 3, (3, n), generator=g).to(dtype)  # many ties: three distinct values
    if dtype.is_floating_point:
        x[0, ::7] = float("nan")  # CPU puts NaN first when descending
    want = torch.sort(x, dim=dim, descending=True)
    got = torch.sort(x.to("tpu"), dim=dim, descending=True)
    assert got.indices.dtype == torch.int64
    assert torch.equal(got.indices.cpu(), want.indices)
    assert torch.equal(got.values.cpu().nan_to_num(), want.values.nan_to_num())
    assert torch.equal(torch.argsort(x.to("tpu"), dim=dim, descending=True).cpu(), want.indices)


def test_int_minimum_and_stable_sorts_unchanged():
    x = torch.tensor([torch.iinfo(torch.int64).min, 0, 5, torch.iinfo(torch.int64).min, 5])
    for stable in (False, True):
        want = torch.sort(x, descending=True, stable=stable)
        got = torch.sort(x.to("tpu"), descending=True, stable=stable)
        assert torch.equal(got.indices.cpu(), want.indices) and torch.equal(got.values.cpu(), want.values)
