"""A Linear's weight gradient on tpu comes out in the weight's own layout, as PyTorch's CPU backward makes it
(hf_tpu/mm_grad_layout.py): it was a transposed view, which every reader (autocast's cast, the optimizer) read
transposed."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import tensor as T


@pytest.fixture(autouse=True)
def _highest() -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def _linear_grads(device: str, bias: bool, autocast: bool, x_grad: bool = True) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=bias).to(device)
    x = torch.randn(4, 8, 64).to(device).requires_grad_(x_grad)
    with torch.autocast(device, torch.bfloat16, enabled=autocast):
        y = lin(x)
    (y.float() ** 2).sum().backward()
    if device == "tpu":
        # the gradient is W's (out, in) buffer itself, not a transposed view of an (in, out) one
        assert T.payload(lin.weight.grad).view is None
    return tuple(t.cpu() for t in (lin.weight.grad, x.grad) if t is not None)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_linear_weight_gradient_in_the_weights_layout_with_cpu_values(bias: bool, autocast: bool) -> None:
    cpu = _linear_grads("cpu", bias, autocast)
    tpu = _linear_grads("tpu", bias, autocast)
    for want, got in zip(cpu, tpu, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_input_without_gradient_keeps_the_plain_form() -> None:
    # mat2 is not saved when mat1 needs no gradient: nothing tells the layout, and the result is as before
    cpu = _linear_grads("cpu", True, False, x_grad=False)
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48).to("tpu")
    x = torch.randn(4, 8, 64).to("tpu")
    (lin(x) ** 2).sum().backward()
    torch.testing.assert_close(lin.weight.grad.cpu(), cpu[0], rtol=1e-5, atol=1e-4)


def test_a_matmul_with_a_plain_weight_is_left_as_it_was() -> None:
    # GPT-2's Conv1D: x @ W with W stored (in, out): its gradient is already W's layout
    grads = []
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        w = torch.randn(64, 48).to(device).requires_grad_()
        x = torch.randn(32, 64).to(device).requires_grad_()
        (torch.addmm(torch.zeros(48, device=device), x, w) ** 2).sum().backward()
        if device == "tpu":
            assert T.payload(w.grad).view is None
        grads.append(w.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-4)


def test_double_backward_through_a_linear() -> None:
    results = []
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 8).to(device)
        x = torch.randn(5, 16).to(device).requires_grad_()
        (gw,) = torch.autograd.grad((lin(x) ** 3).sum(), [lin.weight], create_graph=True)
        gw.pow(2).sum().backward()
        results.append((gw.detach().cpu(), x.grad.cpu(), lin.weight.grad.cpu()))
    for want, got in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
