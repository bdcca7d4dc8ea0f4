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


def test_graph_without_tpu_inputs_returns_tpu_tensors() -> None:
    # Qwen2-VL's vision position ids: after a graph break on grid_thw.tolist(), a graph builds tpu tensors from
    # Python ints only; its outputs came back on CPU and the next graph saw CPU and tpu tensors mixed
    # ("Tensor device mismatch" during Dynamo's fake-tensor propagation).
    torch._dynamo.reset()

    def positions(h: int, w: int) -> torch.Tensor:
        a, b = torch.meshgrid(torch.arange(h, device="tpu"), torch.arange(w, device="tpu"), indexing="ij")
        return torch.stack([a.flatten(), b.flatten()], dim=-1)

    got = torch.compile(positions, backend="tpu")(3, 4)
    assert got.device.type == "tpu"
    want = torch.stack([t.flatten() for t in torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")], -1)
    torch.testing.assert_close(got.cpu(), want)
    # and a graph that makes a CPU tensor still returns it on CPU
    cpu_out = torch.compile(lambda x: (x + 1, torch.arange(3)), backend="tpu")(torch.ones(2, device="tpu"))
    assert cpu_out[0].device.type == "tpu" and cpu_out[1].device.type == "cpu"


class _Pool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # FocalNet/DonutSwin pooling: adaptive_avg_pool1d of a transposed (channels-last-looking) tensor makes
        # PyTorch's kernel call as_strided_ on its output; under AOTAutograd that lands on FunctionalTensor's
        # data-less wrapper ("this tpu tensor has no data attached")
        return torch.nn.functional.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1)


def test_inplace_view_on_functional_wrapper_updates_metadata_only(highest) -> None:
    torch.manual_seed(0)
    _compiled_vs_cpu(_Pool(), torch.randn(2, 9, 16))

