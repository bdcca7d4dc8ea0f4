"""torch.compile(model) with no backend: a tpu model runs the "tpu" backend (Inductor cannot compile tpu
graphs without torch_tpu); a CPU model still runs Inductor."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo

import hf_tpu


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.ln(self.fc(x))) * 2 + x  # elementwise ops: Inductor codegen


def _models() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    cpu = Block()
    return cpu, copy.deepcopy(cpu).to("tpu")


def test_default_compile_of_a_tpu_model_runs_the_tpu_backend(highest) -> None:
    torch._dynamo.reset()
    hf_tpu.reset_compile_stats()
    cpu, dev = _models()
    x = torch.randn(3, 8, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    out = torch.compile(dev)(xt)
    assert hf_tpu.compile_stats()["graphs"] >= 1
    ref = cpu(x)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()  # the backward graph runs through the tpu backend too
    ref.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dev.fc.weight.grad.cpu(), cpu.fc.weight.grad, rtol=1e-5, atol=1e-5)


def test_inductor_mode_warns_and_still_runs(highest) -> None:
    torch._dynamo.reset()
    cpu, dev = _models()
    x = torch.randn(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(dev, mode="max-autotune-no-cudagraphs")(x.to("tpu"))
    assert any('backend="tpu"' in str(w.message) for w in caught)
    torch.testing.assert_close(out.detach().cpu(), cpu(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # Inductor's C++ codegen on CPU takes ~20 s here
def test_default_compile_of_a_cpu_model_is_still_inductor() -> None:
    torch._dynamo.reset()
    hf_tpu.reset_compile_stats()
    cpu, _ = _models()
    x = torch.randn(2, 8)
    out = torch.compile(cpu)(x)
    assert hf_tpu.compile_stats()["graphs"] == 0
    torch.testing.assert_close(out, cpu(x))
