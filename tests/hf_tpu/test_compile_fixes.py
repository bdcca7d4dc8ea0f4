"""Regression tests for compiled-mode failures found by the zoo sweep (issue 13), each from a minimal repro
that `hf-tpu diagnose ENTRY --mode compiled` wrote. CPU PyTorch is the oracle."""

from __future__ import annotations

import torch
import torch._dynamo


def _compiled_vs_cpu(module: torch.nn.Module, *inputs: torch.Tensor, atol: float = 1e-4) -> None:
    torch._dynamo.reset()
    module = module.eval()
    with torch.no_grad():
        want = module(*inputs)
        dev = torch.compile(module.to("tpu"), backend="tpu")
        got = dev(*(x.to("tpu") for x in inputs))
    module.to("cpu")
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=1e-4)


def test_convolution_padding_given_as_one_element_list(highest) -> None:
    # Siglip/Align/PaliGemma patch embeddings: Conv2d(padding="valid") reaches aten.convolution with padding
    # [0]; torchax's lowering extends that list in place, which FX's immutable_list refused.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, padding="valid")
    _compiled_vs_cpu(conv, torch.randn(2, 3, 16, 16))
