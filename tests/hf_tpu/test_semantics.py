"""PyTorch semantics on `tpu`, with CPU PyTorch as the oracle: dtypes, promotion, broadcasting,
aliasing of views and in-place ops, indexing, autograd, no_grad, random numbers."""

from __future__ import annotations

import pytest
import torch

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_round_trip(dtype) -> None:
    c = (torch.arange(6) % 3).to(dtype)
    t = c.to("tpu")
    assert t.dtype == dtype
    back = t.cpu()
    assert back.dtype == dtype and torch.equal(back, c)


def test_int64_keeps_64_bits() -> None:
    big = torch.tensor([2**40 + 1, -(2**40)], dtype=torch.int64)
    t = big.to("tpu") * 2
    assert t.dtype == torch.int64
    assert torch.equal(t.cpu(), big * 2)


def test_float64_is_float64() -> None:
    # Decision: float64 is supported (JAX x64), computed in float64, not silently float32.
    x = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    t = x.to("tpu") + 1e-12
    assert t.dtype == torch.float64
    assert t.cpu().item() == (x + 1e-12).item()


@pytest.mark.parametrize(
    "a,b",
    [
        (torch.tensor([1, 2], dtype=torch.int64), torch.tensor([0.5, 1.5])),
        (torch.tensor([1, 2], dtype=torch.int32), torch.tensor(3, dtype=torch.int64)),
        (torch.tensor([True, False]), torch.tensor([2, 3], dtype=torch.uint8)),
        (torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([2.0], dtype=torch.float16)),
        (torch.tensor([1, 2], dtype=torch.int64), 2.5),
        (torch.tensor([1.0, 2.0], dtype=torch.float16), 3),
    ],
)
def test_type_promotion(a, b) -> None:
    expected = a + b
    bt = b.to("tpu") if isinstance(b, torch.Tensor) else b
    actual = a.to("tpu") + bt
    assert actual.dtype == expected.dtype
    assert torch.equal(actual.cpu(), expected)
    assert (a.to("tpu") / bt).dtype == (a / b).dtype


def test_broadcasting() -> None:
    a, b = torch.randn(3, 1, 4), torch.randn(5, 1)
    assert torch.allclose((a.to("tpu") * b.to("tpu")).cpu(), a * b)


def _pair(shape=(3, 4)):
    c = torch.arange(12, dtype=torch.float32).reshape(shape)
    return c, c.to("tpu")


def test_slice_assignment_writes_through() -> None:
    c, t = _pair()
    y = torch.full((3, 2), -1.0)
    c[:, :2] = y
    t[:, :2] = y.to("tpu")
    assert torch.equal(t.cpu(), c)


def test_view_inplace_writes_base() -> None:
    c, t = _pair()
    c.view(-1).add_(1)
    t.view(-1).add_(1)
    assert torch.equal(t.cpu(), c)
    c.t().mul_(2)
    t.t().mul_(2)
    assert torch.equal(t.cpu(), c)
    c[1].zero_()
    t[1].zero_()
    assert torch.equal(t.cpu(), c)
    c.diagonal().fill_(9)
    t.diagonal().fill_(9)
    assert torch.equal(t.cpu(), c)


def test_base_change_shows_in_views() -> None:
    c, t = _pair()
    cv, tv = c[1:, ::2], t[1:, ::2]
    ct, tt = c.t(), t.t()
    c.mul_(-1)
    t.mul_(-1)
    assert torch.equal(tv.cpu(), cv) and torch.equal(tt.cpu(), ct)
    # a view of a view, then a write through it
    t.t()[1:3].unsqueeze(0).sub_(100)
    c.t()[1:3].unsqueeze(0).sub_(100)
    assert torch.equal(t.cpu(), c)


def test_detach_and_data_alias() -> None:
    c, t = _pair()
    t.detach().add_(1)
    c.detach().add_(1)
    assert torch.equal(t.cpu(), c)
    t.data.mul_(3)
    c.data.mul_(3)
    assert torch.equal(t.cpu(), c)


def test_indexing() -> None:
    c, t = _pair()
    mask = c > 5
    assert torch.equal(t[mask.to("tpu")].cpu(), c[mask])
    idx = torch.tensor([2, 0])
    assert torch.equal(t[idx.to("tpu")].cpu(), c[idx])
    assert torch.equal(t[:, idx.to("tpu")].cpu(), c[:, idx])
    t[mask.to("tpu")] = 0.5
    c[mask] = 0.5
    assert torch.equal(t.cpu(), c)
    t[idx.to("tpu"), 1] += 10
    c[idx, 1] += 10
    assert torch.equal(t.cpu(), c)


def test_autograd_matches_cpu(highest) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    w = torch.randn(5, 3, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    loss = (torch.tanh(x @ w) ** 2).mean()
    loss_t = (torch.tanh(x.to("tpu") @ wt) ** 2).mean()
    loss.backward()
    loss_t.backward()
    assert wt.grad.device.type == "tpu"
    torch.testing.assert_close(wt.grad.cpu(), w.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_t.cpu(), loss.detach())


def test_optimizer_step_matches_cpu(highest) -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    mt = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    mt.load_state_dict(m.state_dict())
    mt.to("tpu")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for model, xs, ys in ((m, x, y), (mt, x.to("tpu"), y.to("tpu"))):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
    for p, pt in zip(m.parameters(), mt.parameters(), strict=True):
        torch.testing.assert_close(pt.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)


def test_no_grad() -> None:
    w = torch.ones(3, device="tpu", requires_grad=True)
    with torch.no_grad():
        y = w * 2
    assert not y.requires_grad
    assert (w * 2).requires_grad


def test_random_reproducible() -> None:
    torch.manual_seed(123)
    a = torch.randn(4, device="tpu").cpu()
    b = torch.rand(4, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), b)
    assert not torch.equal(torch.randn(4, device="tpu").cpu(), a)  # the key advances
    w = torch.empty(64, device="tpu")
    torch.nn.init.uniform_(w, -1, 1)
    assert w.cpu().min() >= -1 and w.cpu().max() <= 1 and w.cpu().std() > 0.3


def test_cpu_source_is_copied_not_aliased() -> None:
    c = torch.arange(4, dtype=torch.float32)
    t = c.to("tpu")
    c.add_(100)  # the tpu tensor must keep the value it was given
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_copy_to_cpu_of_a_reshaped_whole_buffer_runs_no_device_reshape(dtype, monkeypatch) -> None:
    """`.cpu()` of a whole buffer held in another shape (a linear's `mm` result read as (1, seq, vocab)
    logits) reshapes on the host: the device reshape (tensor.fit, a copy on XLA:CPU) is not run; values equal
    CPU's, for a plain copy, a copy into a non-contiguous CPU tensor and a broadcasting copy_."""
    from hf_tpu import tensor as T

    c = (torch.arange(24) % 7).to(dtype).reshape(4, 6)
    whole = (c.to("tpu") + 1).view(2, 2, 6)  # a new buffer of (4, 6), read as (2, 2, 6)
    want = (c + 1).view(2, 2, 6)

    def no_fit(*a: object) -> None:
        raise AssertionError("device reshape run for a host copy")

    monkeypatch.setattr(T, "fit", no_fit)
    assert torch.equal(whole.cpu(), want)
    strided = torch.zeros(2, 6, 2, dtype=dtype).transpose(1, 2)  # (2, 2, 6), not contiguous
    strided.copy_(whole)
    assert torch.equal(strided, want)
    monkeypatch.undo()
    row = (c[0].to("tpu") + 1).view(1, 6)  # broadcast into (4, 6): needs its own shape
    big = torch.zeros(4, 6, dtype=dtype)
    big.copy_(row)
    assert torch.equal(big, (c[0] + 1).view(1, 6).expand(4, 6))


def test_view_as_real_and_complex() -> None:
    x = torch.randn(3, 4, dtype=torch.complex64)
    assert torch.equal(torch.view_as_real(x.to("tpu")).cpu(), torch.view_as_real(x))
    r = torch.randn(3, 4, 2)
    assert torch.equal(torch.view_as_complex(r.to("tpu")).cpu(), torch.view_as_complex(r))


@pytest.mark.parametrize("op", ["split_with_sizes_copy", "unbind_copy"])
def test_ops_writing_a_list_of_out_tensors(op) -> None:
    """`Tensor[] out` ops (FSDP2's all-gather copy-out is split_with_sizes_copy into views of its buffers):
    each out tensor, a view here, gets its piece, and the op returns None, as on CPU."""
    def run(device: str) -> list[torch.Tensor]:
        x = torch.arange(24.0).reshape(2, 12).to(device)
        if op == "split_with_sizes_copy":
            bufs = [torch.zeros(8, device=device), torch.zeros(16, device=device)]
            outs = [bufs[0].view(2, 4), bufs[1].view(2, 8)]
            assert torch.split_with_sizes_copy(x, [4, 8], dim=1, out=outs) is None
        else:
            bufs = [torch.zeros(12, device=device), torch.zeros(12, device=device)]
            outs = bufs
            assert torch.unbind_copy(x, 0, out=outs) is None
        return [b.cpu() for b in bufs]

    for c, t in zip(run("cpu"), run("tpu"), strict=True):
        assert torch.equal(c, t)


def test_inplace_write_to_a_reshape_of_a_whole_buffer() -> None:
    """An in-place op on a tensor that is its whole buffer in another shape (a gradient made by reshaping a
    result) runs one program, not a second one to reshape the result into the buffer's shape; the alias of
    the old shape and a strided view of the buffer read the new values, as on CPU."""
    from hf_tpu import counters

    def run(device: str) -> list[torch.Tensor]:
        base = torch.arange(12.0).reshape(3, 4).to(device)
        flat = base.reshape(12)
        flat.add_(1)  # compiles
        before = counters.count("eager_programs")
        flat.mul_(2)
        if device == "tpu":
            assert counters.count("eager_programs") - before == 1
        col = base[:, 1]
        col.add_(100)
        return [base.cpu(), flat.cpu(), col.cpu(), base.t().contiguous().cpu()]

    for c, t in zip(run("cpu"), run("tpu"), strict=True):
        assert torch.equal(c, t)
