"""aten::_index_put_impl (the backward of advanced indexing), against CPU."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_impl_matches_cpu(accumulate: bool) -> None:
    x = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    rows = torch.tensor([0, 2, 2, -1])  # a repeated row (summed when accumulating) and a negative one
    cols = torch.tensor([1, 3, 3, 0])
    vals = torch.tensor([10.0, 20.0, 30.0, 40.0])
    want = torch.ops.aten._index_put_impl_(x.clone(), [rows, cols], vals, accumulate, True)
    got = torch.ops.aten._index_put_impl_(x.to("tpu"), [rows.to("tpu"), cols.to("tpu")], vals.to("tpu"),
                                          accumulate, True)
    if accumulate:
        torch.testing.assert_close(got.cpu(), want)
    else:  # duplicate indices without accumulate: PyTorch leaves which write wins unspecified
        keep = torch.ones_like(want, dtype=torch.bool)
        keep[2, 3] = False
        torch.testing.assert_close(got.cpu()[keep], want[keep])


def test_backward_of_pooled_logits_matches_cpu() -> None:
    """GPT2ForSequenceClassification pools `logits[arange(batch), last_token]`; its backward is _index_put_impl_."""
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 4)
    last = torch.tensor([6, 2, 2])

    def grad(dev: str) -> torch.Tensor:
        x = logits.to(dev).requires_grad_()
        pooled = x[torch.arange(3, device=dev), last.to(dev)]
        (pooled * torch.arange(4.0, device=dev)).sum().backward()
        return x.grad.cpu()

    torch.testing.assert_close(grad("tpu"), grad("cpu"))


@pytest.mark.parametrize("index", ["long", "bool"])
def test_backward_of_indexing_with_a_cpu_index_matches_cpu(index: str) -> None:
    """A tpu tensor indexed by a CPU index tensor (allowed, as on CUDA): its backward's _index_put_impl got the
    CPU index too and raised "Expected all tensors to be on the same device" (DeepSeek-OCR2's train step)."""
    torch.manual_seed(0)
    base = torch.randn(5, 3)
    idx = torch.tensor([4, 0, 4]) if index == "long" else torch.tensor([True, False, True, True, False])

    def grad(dev: str) -> torch.Tensor:
        x = base.to(dev).requires_grad_()
        (x[idx] * torch.arange(3.0, device=dev)).sum().backward()
        return x.grad.cpu()

    torch.testing.assert_close(grad("tpu"), grad("cpu"))
