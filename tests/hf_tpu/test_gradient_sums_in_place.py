"""A weight used twice gets its two gradients summed in place on tpu, as on CPU (hooks.cpp's payloads,
tensor._mark_shared, donated_add.py): Qwen3's tied 622 MB embedding made a third gradient-sized array at the
training step's peak. In place, but never through a view into the tensor it views."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import native

MB = 2**20
needs_native = pytest.mark.skipif(not native.status()["loaded"], reason="the payload rides on the C++ hooks")


def _tied_grad(device: str) -> tuple[torch.Tensor, list[str]]:
    """The gradient of a tied embedding / LM head under bfloat16 casts (as autocast makes them), and the
    ATen add ops the backward ran."""
    torch.manual_seed(0)
    w = torch.randn(512, 64).to(device).requires_grad_()
    idx = torch.randint(0, 512, (4, 8)).to(device)
    h = torch.nn.functional.embedding(idx, w)
    loss = (h.bfloat16() @ w.bfloat16().t()).float().pow(2).mean()
    with torch.profiler.profile() as prof:
        loss.backward()
    adds = [e.name for e in prof.events() if e.name in ("aten::add", "aten::add_")]
    return w.grad.cpu(), adds


@needs_native
def test_tied_weight_gradients_are_summed_in_place_with_cpu_values() -> None:
    cpu, cpu_adds = _tied_grad("cpu")
    tpu, tpu_adds = _tied_grad("tpu")
    assert cpu_adds == ["aten::add_"]
    assert tpu_adds == ["aten::add_"]  # the functional sum (a third array) was "aten::add"
    torch.testing.assert_close(tpu, cpu, rtol=1e-2, atol=1e-3)  # bfloat16 products


def test_add_in_place_writes_over_the_target_without_a_second_array() -> None:
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    version = a._version
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    a.add_(b, alpha=0.5)
    torch.tpu.synchronize()
    assert torch.tpu.max_memory_allocated() - before < 16 * MB  # the functional path held a second 16 MB array
    assert a._version > version
    assert torch.equal(a.cpu(), a_cpu.add(b_cpu, alpha=0.5))


def test_add_in_place_leaves_arrays_others_still_read() -> None:
    a_cpu, b_cpu = torch.randn(256, 256), torch.randn(256, 256)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    twin = copy.deepcopy(a)  # shares a's array (JAX arrays are immutable) in a buffer of its own
    view = a[:4]
    a.add_(b)
    assert torch.equal(twin.cpu(), a_cpu)
    assert torch.equal(view.cpu(), (a_cpu + b_cpu)[:4])  # a view sees its base's write
    assert torch.equal(a.cpu(), a_cpu + b_cpu)
    a.add_(a)  # the operand is the target itself
    assert torch.equal(a.cpu(), (a_cpu + b_cpu) * 2)


class _GradIsAViewOf(torch.autograd.Function):
    """Identity whose backward hands back a view of a tensor it keeps (as TBackward hands back `grad.t()`)."""

    kept: torch.Tensor

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return _GradIsAViewOf.kept.t()


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_a_gradient_that_is_a_view_is_not_summed_into_what_it_views(device: str) -> None:
    # without tensor._mark_shared the view's own StorageImpl had one owner: autograd summed the second gradient
    # into it, and so into the tensor it views
    kept = torch.arange(12.0).reshape(3, 4).to(device)
    _GradIsAViewOf.kept = kept
    w = torch.ones(4, 3, device=device, requires_grad=True)
    # the Function's node is made last, so runs first: its view is the gradient the second one is added to
    ((w * 2).sum() + _GradIsAViewOf.apply(w).sum()).backward()
    assert torch.equal(kept.cpu(), torch.arange(12.0).reshape(3, 4))
    assert torch.equal(w.grad.cpu(), torch.arange(12.0).reshape(3, 4).t() + 2)
