"""torch.topk on tpu returns CPU's indices when values tie, and CPU's order when unsorted (hf_tpu/topk_ties.py).

CPU's choice among tied values comes from libstdc++'s nth_element / partial_sort / sort; jax.lax.top_k keeps the
lowest index instead, which made Qwen4-Exp's indexed attention pick another key block than CPU (issue 28)."""

from __future__ import annotations

import pytest
import torch


def _inputs(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows with many ties (three distinct values), one row of distinct values, and for floating point NaNs and
    signed zeros (CPU ties -0.0 with 0.0 and puts NaN above everything)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (24, n), generator=g).to(dtype)
    if dtype.is_floating_point:
        x[0] = torch.randn(n, generator=g).to(dtype)
        x[1, ::5] = float("nan")
        x[2, 1::3] = -0.0
        x[3] = torch.where(torch.rand(n, generator=g) < 0.5, 0.0, torch.randn(n, generator=g).relu()).to(dtype)
    return x


def _check(x: torch.Tensor, k: int, dim: int, largest: bool, sorted: bool) -> None:  # noqa: A002
    want = torch.topk(x, k, dim=dim, largest=largest, sorted=sorted)
    got = torch.topk(x.to("tpu"), k, dim=dim, largest=largest, sorted=sorted)
    assert got.indices.dtype == torch.int64
    assert torch.equal(got.indices.cpu(), want.indices), (k, largest, sorted)
    # the values are the elements at those indices, bit for bit (-0.0 stays -0.0)
    assert torch.equal(got.values.cpu().view(-1).nan_to_num(), want.values.view(-1).nan_to_num())
    assert torch.equal(torch.signbit(got.values.cpu()), torch.signbit(want.values))


# (n, k): nth_element + sort of k - 1 <= 16 (insertion sort) and > 16 (introsort); partial_sort (k * 64 <= n)
CASES = [(5, 2), (5, 5), (17, 3), (40, 20), (100, 30), (130, 2), (300, 4)]


@pytest.mark.parametrize("n,k", CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("sorted", [True, False], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_ties_give_cpus_indices_float(n, k, sorted, largest):  # noqa: A002
    _check(_inputs(n, torch.float32, seed=n + k), k, -1, largest, sorted)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sorted", [True, False], ids=["sorted", "unsorted"])
def test_ties_give_cpus_indices_other_dtypes(dtype, sorted):  # noqa: A002
    x = _inputs(40, dtype, seed=3)
    _check(x, 7, -1, True, sorted)
    _check(x, 3, 0, False, sorted)  # along a leading dim


def test_qwen4_exp_indexer_scores():
    """The row that made Qwen4-Exp wrong: relu'd block scores with three zeros tied for the second place."""
    _check(torch.tensor([0.0, 0.0, 0.0, 0.7164753, 0.0]), 2, 0, True, True)


def test_distinct_values_and_integer_extremes():
    g = torch.Generator().manual_seed(0)
    _check(torch.randn(8, 50, generator=g), 5, -1, True, True)  # no tie: the shortcut through lax.top_k
    info = torch.iinfo(torch.int64)
    _check(torch.tensor([info.min, 0, info.max, info.min, info.max, 0]), 3, 0, True, True)
    _check(torch.tensor([info.min, 0, info.max, info.min, info.max, 0]), 3, 0, False, False)


@pytest.mark.parametrize("name", ["median", "nanmedian"])
@pytest.mark.parametrize("n", [2, 5, 8, 33, 100])
def test_median_dim_ties_and_nans_take_cpus_index(name: str, n: int) -> None:
    """median/nanmedian along a dim replay CPU's std::nth_element (topk_ties._median_dim): among tied values
    the index CPU returns (their gradients go there), a row's first NaN for median, NaNs skipped by nanmedian."""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 4, (6, n), generator=g).float()
    x[1, ::3] = float("nan")
    x[2, :] = float("nan")
    x[3, :] = 0.0
    x[4, 1::2] = -0.0
    fn = getattr(torch, name)
    for dim, keepdim in ((1, False), (0, True)):
        e, a = fn(x, dim, keepdim), fn(x.to("tpu"), dim, keepdim)
        assert torch.equal(e.indices, a.indices.cpu())
        assert torch.allclose(e.values, a.values.cpu(), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 33, 100])
def test_kthvalue_ties_take_cpus_index(dtype: torch.dtype, n: int) -> None:
    """kthvalue replays CPU's quick_select_template (topk_ties._kthvalue): among tied values the index CPU
    returns, every k, along either dim; NaNs (largest) and -0.0 in the float rows."""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 4, (5, n), generator=g).to(dtype)
    if dtype.is_floating_point:
        x[1, ::3] = float("nan")
        x[2, 1::2] = -0.0
    for k in range(1, n + 1, max(1, n // 6)):  # each k is a program of its own
        e, a = torch.kthvalue(x, k, 1), torch.kthvalue(x.to("tpu"), k, 1)
        assert torch.equal(e.indices, a.indices.cpu()), k
        assert torch.allclose(e.values, a.values.cpu(), equal_nan=True)
    for k in (1, 3, 5):
        e, a = torch.kthvalue(x, k, 0, keepdim=True), torch.kthvalue(x.to("tpu"), k, 0, keepdim=True)
        assert torch.equal(e.indices, a.indices.cpu()), k
