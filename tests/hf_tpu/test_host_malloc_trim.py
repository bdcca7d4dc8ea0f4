"""glibc's free heap is given back to the kernel as a backward pass on tpu starts (hf_tpu/host_malloc.py,
trim_before_backward): a training step's peak RSS comes early in the backward, when the forward's freed
temporaries would otherwise still be resident (issue 25/31). Gradients are unchanged; CPU backwards are not
touched."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import host_malloc

pytestmark = pytest.mark.skipif(not host_malloc._is_glibc(), reason="malloc_trim is glibc's")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_installed_when_tpu_starts() -> None:
    torch.ones(1, device="tpu").cpu()  # starts JAX on the host CPU
    assert host_malloc.trim_before_backward()
    assert torch.autograd.backward.__wrapped__ is not None  # functools.wraps of PyTorch's own


def _backward(x: torch.Tensor, w: torch.Tensor) -> None:
    (x * w).square().sum().backward()  # elementwise: the same arithmetic on both devices


def test_backward_on_tpu_gives_free_heap_back_and_keeps_gradients() -> None:
    x = torch.randn(8, 8)
    w = torch.randn(8, 8, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    _backward(x.to("tpu"), wt)  # its programs compiled and loaded now, not in the measured backward
    wt.grad = None
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # M_MMAP_THRESHOLD (fixed from here on in this process): these blocks come from the heap, as tpu buffers do
    libc.mallopt(-3, 32 << 20)
    blocks = [libc.malloc(256 << 10) for _ in range(401)]  # 100 MiB of heap, touched
    for b in blocks:
        ctypes.memset(b, 1, 256 << 10)
    keep = blocks.pop(blocks.index(max(blocks)))  # the highest stays: the heap's top cannot shrink over the rest
    for b in blocks:
        libc.free(b)  # 100 MiB free in the heap, still resident
    xt = x.to("tpu")
    before = _rss()
    _backward(xt, wt)
    after = _rss()
    libc.free(keep)
    assert before - after > 50 << 20, (before, after)  # without the trim the 100 MiB stay resident
    _backward(x, w)
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


def test_cpu_backward_does_not_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.ones(1, device="tpu").cpu()
    assert host_malloc._on_tpu(torch.ones(1, device="tpu"))
    assert not host_malloc._on_tpu(torch.ones(1))
    assert not host_malloc._on_tpu([torch.ones(1), torch.ones(2)])
    assert host_malloc._on_tpu((torch.ones(1), torch.ones(1, device="tpu")))


def test_optimizer_step_on_tpu_gives_free_heap_back_and_keeps_the_update() -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    opt, opt_t = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([wt], lr=0.1)
    for p, o in ((w, opt), (wt, opt_t)):
        p.grad = torch.ones_like(p)
    opt_t.step()  # its program compiled and loaded now, not in the measured step
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt(-3, 32 << 20)  # heap blocks, as tpu buffers are (test above)
    blocks = [libc.malloc(256 << 10) for _ in range(401)]
    for b in blocks:
        ctypes.memset(b, 1, 256 << 10)
    keep = blocks.pop(blocks.index(max(blocks)))
    for b in blocks:
        libc.free(b)  # 100 MiB free in the heap, still resident
    before = _rss()
    opt_t.step()
    after = _rss()
    libc.free(keep)
    assert before - after > 50 << 20, (before, after)  # without the trim the 100 MiB stay resident
    opt.step()
    opt.step()
    torch.testing.assert_close(wt.detach().cpu(), w.detach())
