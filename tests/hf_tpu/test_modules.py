"""Module parity with CPU at precision "highest"."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _parity(module: torch.nn.Module, *inputs: torch.Tensor, atol: float = 1e-5) -> None:
    module.eval()
    with torch.no_grad():
        expected = module(*inputs)
    module.to("tpu")
    with torch.no_grad():
        actual = module(*[i.to("tpu") for i in inputs])
    if isinstance(expected, tuple):
        expected, actual = expected[0], actual[0]
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=atol)


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize(
    "make,inputs",
    [
        (lambda: torch.nn.Linear(8, 4), lambda: (torch.randn(2, 3, 8),)),
        (lambda: torch.nn.Conv2d(3, 4, 3, padding=1, stride=2), lambda: (torch.randn(2, 3, 9, 9),)),
        (lambda: torch.nn.LayerNorm(8), lambda: (torch.randn(2, 5, 8),)),
        (lambda: torch.nn.Embedding(10, 4), lambda: (torch.tensor([[1, 2, 9], [0, 0, 3]]),)),
        (lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True), lambda: (torch.randn(2, 5, 8),) * 3),
        (lambda: torch.nn.GroupNorm(2, 4), lambda: (torch.randn(2, 4, 3, 3),)),
        (lambda: torch.nn.BatchNorm2d(4), lambda: (torch.randn(2, 4, 3, 3),)),
    ],
    ids=["Linear", "Conv2d", "LayerNorm", "Embedding", "MultiheadAttention", "GroupNorm", "BatchNorm2d"],
)
def test_module_parity(make, inputs) -> None:
    torch.manual_seed(0)
    _parity(make(), *inputs())


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    actual = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=causal)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
