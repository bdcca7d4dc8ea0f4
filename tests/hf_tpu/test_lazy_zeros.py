"""`zero_` on a tpu tensor that is its whole buffer drops the array and makes the zeros on first read, as `empty`
does (tensor.zero_lazily): every optimizer's state starts as zeros_like, which PyTorch runs as empty_like then
zero_, and a zeros program beside the old array made the first optimizer step's peak one state larger than
CPU's."""

from __future__ import annotations

import torch

import hf_tpu  # noqa: F401 - registers the tpu device

MB = 2**20


def test_zero_drops_the_array_until_read() -> None:
    a = torch.randn(1024, 1024).to("tpu")
    view = a[2:4]
    version = a._version
    before = torch.tpu.memory_allocated()
    a.zero_()
    assert torch.tpu.memory_allocated() <= before - 4 * MB  # the old array went, no zeros made yet
    assert a._version > version  # autograd sees the write
    assert torch.equal(view.cpu(), torch.zeros(2, 1024)) and torch.equal(a.cpu(), torch.zeros(1024, 1024))


def test_zero_of_a_view_writes_only_the_view() -> None:
    a = torch.arange(12.0).reshape(3, 4).to("tpu")
    a[1].zero_()
    want = torch.arange(12.0).reshape(3, 4)
    want[1] = 0
    assert torch.equal(a.cpu(), want)


def test_zeros_like_as_optimizers_make_their_state_allocates_nothing_until_read() -> None:
    # the optimizer's moments were filled zeros beside an empty_like buffer (measured on Qwen3-wide's embedding:
    # AdamW's first step peaked 1.74 GB above its start, 0.58 with these, CPU 1.16)
    p = torch.randn(1024, 1024).to("tpu")
    before = torch.tpu.memory_allocated()
    state = torch.zeros_like(p, memory_format=torch.preserve_format)
    assert torch.tpu.memory_allocated() == before
    assert torch.equal(state.cpu(), torch.zeros(1024, 1024))


def test_adamw_steps_match_cpu_from_zeroed_state() -> None:
    torch.manual_seed(0)
    w, g = torch.randn(64, 32), torch.randn(64, 32)
    results = []
    for device in ("cpu", "tpu"):
        p = torch.nn.Parameter(w.clone().to(device))
        opt = torch.optim.AdamW([p], lr=1e-2, fused=True)
        for _ in range(2):
            p.grad = g.to(device)
            opt.step()
        results.append((p.detach().cpu(), opt.state[p]["exp_avg"].cpu(), opt.state[p]["exp_avg_sq"].cpu()))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)
