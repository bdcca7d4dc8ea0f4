"""Printing a tpu tensor formats its CPU copy (as PyTorch does for xla/lazy tensors): the same text as on
CPU plus the device, and no element-by-element reads on the device (each was a compiled program)."""

from __future__ import annotations

import re

import torch

import hf_tpu  # noqa: F401
from hf_tpu import hooks


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(3, 4), torch.randn(5, 6)[:, ::2], torch.arange(12).reshape(3, 4) > 5,
            torch.randint(-50, 50, (2, 3), dtype=torch.int32), torch.randn(40, 40),  # summarised (> 1000)
            torch.tensor(1.5), torch.zeros(0, 3), torch.randn(2, 3, dtype=torch.bfloat16),
            torch.tensor([float("nan"), float("inf"), 1e-8])]


def test_repr_matches_cpu_plus_device() -> None:
    for cpu in _tensors():
        text = repr(cpu.to("tpu"))
        assert "device='tpu:0'" in text
        assert re.sub(r",\s*device='tpu:0'", "", text) == repr(cpu)  # the suffix may wrap onto its own line


def test_printing_reads_no_element_on_the_device() -> None:
    seen: list[str] = []

    def counting(dispatch, op, args, kwargs):  # noqa: ANN001, ANN202 - every tpu op comes through here
        seen.append(op.__name__)
        return dispatch(op, args, kwargs)

    x = torch.randn(8, 8).to("tpu")
    with hooks.observe_ops(counting):
        str(x)
        f"{torch.isinf(x)}"
    assert seen  # the copies to CPU
    assert "_local_scalar_dense.default" not in seen
    assert len(seen) < 10  # the copies to CPU (and isinf), not a read per element


def test_repr_of_a_tensor_requiring_grad() -> None:
    w = torch.randn(3, requires_grad=True)
    assert repr(w.to("tpu")) == repr(w.detach()).replace(")", ", device='tpu:0', grad_fn=<ToCopyBackward0>)")
