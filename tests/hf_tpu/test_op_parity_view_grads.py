"""Gradients through in-place writes into views, eager on tpu against CPU float32.

Autograd regenerates a written view from its base: with `as_strided(view.sizes(), view.strides(),
view.storage_offset())` unless it replays the view op. tpu tensors report themselves contiguous at offset 0
(hf_tpu/tensor.py), so the as_strided form read the wrong region: `t[:, 2:].copy_(src)` gave src the gradient
of `t[:, :3]`. It made the eager train rows of AXK1/AXK2 (MLA attention assembles its keys so) fail while
torch.compile, whose graphs are functionalized, was right. tensor._replay_views is the fix."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

import op_parity


def _grads(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], device: str) -> list[torch.Tensor]:
    leaves = [x.detach().clone().to(device).requires_grad_() for x in inputs]
    out = fn(*leaves)
    # a weighted sum: every output element gets its own gradient, so a shifted region shows
    weight = torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape).to(device)
    (out * weight).sum().backward()
    return [x.grad.cpu() for x in leaves]


def _check(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    expected = _grads(fn, list(inputs), "cpu")
    op_parity.compare(expected, _grads(fn, list(inputs), "tpu"))


def test_copy_into_a_slice_of_a_new_tensor() -> None:
    def fn(a: torch.Tensor) -> torch.Tensor:
        t = torch.zeros(2, 5, device=a.device)
        t[:, 2:].copy_(a)
        return t

    _check(fn, torch.randn(2, 3))


@pytest.mark.usefixtures("highest")  # CPU's attention is IEEE float32
def test_mla_key_assembly() -> None:
    """DeepSeek-style multi-head latent attention (AXK2Attention.expand_kv): keys assembled by copying the
    per-head part and a broadcast rotary part into slices of new_empty, then attention."""

    def fn(kv: torch.Tensor, k_rot: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        k_nope, value = torch.split(kv, [6, 4], dim=-1)
        keys = kv.new_empty(*kv.shape[:-1], 6 + 3)
        keys[..., :6].copy_(k_nope)
        keys[..., 6:].copy_(k_rot.expand(-1, kv.shape[1], -1, -1))
        return torch.nn.functional.scaled_dot_product_attention(q, keys, value)

    torch.manual_seed(0)
    _check(fn, torch.randn(2, 3, 5, 10), torch.randn(2, 1, 5, 3), torch.randn(2, 3, 5, 9))


def test_setitem_and_inplace_op_on_a_view() -> None:
    """`t[1:, ::2] = src` and an in-place op on a transposed slice: the view read after the write is
    regenerated from its base (AsStridedBackward without view replay)."""

    def fn(a: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        t = a * 1.0
        t[1:, ::2] = src
        v = t.t()[1:3]
        v.mul_(3.0)
        return v + t[2:, 1:].sum()

    torch.manual_seed(1)
    _check(fn, torch.randn(4, 6), torch.randn(3, 3))


def test_view_written_in_another_thread() -> None:
    """Autograd's view replay flag is thread-local: a thread's first tpu view turns it on there too."""
    results: list[BaseException | None] = []

    def run() -> None:
        try:
            test_copy_into_a_slice_of_a_new_tensor()
            results.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            results.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert results == [None], results
