"""Keyword-only arguments of torch 2.13 schemas that torchax's (older) lowerings do not name, against CPU."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401


@pytest.mark.parametrize("src,dtype", [(torch.float32, torch.float64), (torch.int64, torch.float32),
                                       (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_mean_dim_with_dtype_matches_cpu(src: torch.dtype, dtype: torch.dtype) -> None:
    cpu = (torch.arange(24).reshape(2, 3, 4) * 0.37).to(src)
    dev = cpu.to("tpu")
    for kwargs in ({"dim": 1}, {"dim": (0, 2), "keepdim": True}, {}):
        want = torch.mean(cpu, dtype=dtype, **kwargs)
        got = torch.mean(dev, dtype=dtype, **kwargs)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


def test_mean_dtype_in_a_compiled_graph() -> None:
    cpu = torch.randn(4, 5)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=-1, dtype=torch.float64) * 2

    got = torch.compile(f, backend="tpu")(cpu.to("tpu"))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), f(cpu))


def test_value_free_kwargs_are_dropped() -> None:
    x = torch.tensor([1, 2, 3])
    reps = torch.tensor([2, 0, 1])
    want = torch.repeat_interleave(x, reps, output_size=3)
    got = torch.repeat_interleave(x.to("tpu"), reps.to("tpu"), output_size=3)
    torch.testing.assert_close(got.cpu(), want)


def test_factory_overload_uses_its_decomposition() -> None:
    torch.ones(1, device="tpu").add_(1)  # the direct kernels are registered on the first op
    torch.manual_seed(0)
    a = torch.normal(0.0, 1.0, (1000,), dtype=torch.float64, device="tpu")
    torch.manual_seed(0)
    b = torch.normal(0.0, 1.0, (1000,), dtype=torch.float64, device="tpu")
    assert a.dtype == torch.float64 and a.shape == (1000,)
    torch.testing.assert_close(a.cpu(), b.cpu())  # seeded, as on CPU
    assert abs(float(a.mean())) < 0.15 and 0.85 < float(a.std()) < 1.15


def test_unsupported_kwarg_value_names_the_op_and_argument() -> None:
    # A lowering written for an older schema (no `right` parameter), as torchax's searchsorted was before
    # hf_tpu lowered it itself: the default value passes, any other names the op and the argument.
    from hf_tpu import lowering

    def old_searchsorted(sorted_sequence, values, out_int32=False):
        return "ran"

    adapted = lowering._adapt_kwargs(old_searchsorted, torch.ops.aten.searchsorted.Tensor)
    assert adapted("seq", "val", right=False) == "ran"
    with pytest.raises(NotImplementedError, match=r"searchsorted.*right=True"):
        adapted("seq", "val", right=True)
    seq, val = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0])  # hf_tpu's own lowering takes right=
    assert torch.searchsorted(seq.to("tpu"), val.to("tpu"), right=True).cpu().tolist() == \
        torch.searchsorted(seq, val, right=True).tolist()
