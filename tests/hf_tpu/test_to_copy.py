"""`_to_copy` on tpu (storage_ops.to_copy): a dtype conversion on one device is one planned op, equal to CPU's
cast and to PyTorch's composite kernel (empty + copy_), which every other case (moves, pinned memory,
channels-last, float8, complex, a copy without a dtype change) still takes."""

from __future__ import annotations

import pytest
import torch

import hf_tpu
from hf_tpu import hooks, storage_ops

aten = torch.ops.aten


def _ops_of(f):
    """The ATen ops f dispatches on tpu, in order, and f's result."""
    seen = []

    def record(dispatch, op, args, kwargs):
        seen.append(op)
        return dispatch(op, args, kwargs)

    with hooks.observe_ops(record):
        out = f()
    return seen, out


@pytest.fixture
def composite():
    """Run the test's block with the composite kernel instead (the path before the direct one)."""
    def run(f):
        storage_ops.DIRECT_TO_COPY = False
        try:
            return f()
        finally:
            storage_ops.DIRECT_TO_COPY = True
    return run


def test_a_cast_is_one_op_not_empty_and_copy(composite):
    x = torch.randn(4, 5).to("tpu")
    ops, y = _ops_of(lambda: x.to(torch.bfloat16))
    assert ops == [aten._to_copy.default]
    old_ops, _ = composite(lambda: _ops_of(lambda: x.to(torch.bfloat16)))
    assert aten._copy_from.default in old_ops  # what the direct kernel saves: the composite's empty + copy_
    assert y.device.type == "tpu" and y.dtype == torch.bfloat16 and y.is_contiguous()


CASTS = [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.float16),
         (torch.float64, torch.float32), (torch.float32, torch.int32), (torch.int64, torch.float32),
         (torch.float32, torch.bool), (torch.bool, torch.float32), (torch.int64, torch.int8)]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{a}->{b}".replace("torch.", "") for a, b in CASTS])
def test_cast_equals_cpu_and_the_composite(src, dst, composite):
    torch.manual_seed(0)
    base = torch.randn(6, 7) * 100
    x = base.to(src)  # fractional, negative and out-of-range values for the integer casts
    if dst in (torch.int32, torch.int8):  # out-of-range float->int is undefined in C++: keep inside the range
        x = x.clamp(-100, 100)
    t = x.to("tpu")
    want = x.to(dst)
    got = t.to(dst)
    old = composite(lambda: t.to(dst))
    assert got.dtype == want.dtype == old.dtype
    assert torch.equal(got.cpu(), want)
    assert torch.equal(old.cpu(), want)


def test_cast_of_views_equals_cpu():
    torch.manual_seed(0)
    x = torch.randn(8, 6)
    t = x.to("tpu")
    for f in (lambda a: a.t(), lambda a: a[1:7:2, ::3], lambda a: a.view(6, 8)[2], lambda a: a.expand(2, 8, 6)):
        got = f(t).to(torch.bfloat16)
        assert torch.equal(got.cpu(), f(x).to(torch.bfloat16))
        assert got.is_contiguous()


def test_cast_is_recorded_by_autograd():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    tw = w.detach().to("tpu").requires_grad_()
    for a in (w, tw):
        (a.to(torch.bfloat16).float() * torch.arange(3.0, device=a.device)).sum().backward()
    assert torch.equal(tw.grad.cpu(), w.grad)


def test_the_other_cases_keep_the_composite(composite):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    t = x.to("tpu")
    # a move with a cast: tpu -> CPU, with the composite's result (strides included)
    got = t.transpose(1, 3).to("cpu", torch.bfloat16)
    old = composite(lambda: t.transpose(1, 3).to("cpu", torch.bfloat16))
    assert got.device.type == "cpu" and torch.equal(got, x.transpose(1, 3).to(torch.bfloat16))
    assert got.stride() == old.stride()
    # a copy without a dtype change: a new tensor, not an alias
    c = t.to("tpu", copy=True)
    c.add_(1)
    assert torch.equal(t.cpu(), x) and torch.equal(c.cpu(), x + 1)
    # channels-last, float8 and complex casts: the composite's results, equal to CPU's
    assert torch.equal(t.to(torch.bfloat16, memory_format=torch.channels_last).cpu(), x.to(torch.bfloat16))
    assert torch.equal(t.to(torch.float8_e4m3fn).cpu().float(), x.to(torch.float8_e4m3fn).float())
    z = torch.complex(x, -x)
    assert torch.equal(z.to("tpu").to(torch.complex128).cpu(), z.to(torch.complex128))


def test_cast_in_fused_mode_is_deferred():
    x = torch.randn(4, 4)
    t = x.to("tpu")
    with hf_tpu.defer_and_fuse():
        y = (t * 2).to(torch.bfloat16) + 1
        got = y.cpu()
    assert torch.equal(got, (x * 2).to(torch.bfloat16) + 1)
