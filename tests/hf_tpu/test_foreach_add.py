"""`torch._foreach_add_(tensors, scalar)` on tpu (hf_tpu/foreach_add.py): deferred, then one program for the
whole list when something reads one of them, with CPU's values; the cases it does not defer run PyTorch's loop
of `add_` as before."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import counters


def _programs(fn) -> int:
    before = counters.count("eager_programs")
    fn()
    return counters.count("eager_programs") - before


def _tensors(dtype: torch.dtype, n: int = 30) -> list[torch.Tensor]:
    torch.manual_seed(0)
    shapes = [(), (3,), (2, 5)]
    return [(torch.randn(shapes[i % 3]) * 10).to(dtype) for i in range(n)]


@pytest.mark.parametrize("dtype,scalars", [(torch.float32, [1, 0.25]), (torch.bfloat16, [1, 0.1]),
                                           (torch.int64, [1, -3]), (torch.float64, [2.5])])
def test_values_as_on_cpu_and_one_program_for_the_list(dtype: torch.dtype, scalars: list) -> None:
    """Two adds in a row, then a read: CPU's values in every tensor; the adds run no program themselves,
    and the read runs the second add's whole list as one program (the first ran when the second took
    its tensors)."""
    cpu = _tensors(dtype)
    tpu = [t.to("tpu") for t in cpu]
    for s in scalars:
        torch._foreach_add_(cpu, s)
        assert _programs(lambda s=s: torch._foreach_add_(tpu, s)) <= 1  # the earlier add, when there was one
    assert _programs(lambda: tpu[7].cpu()) == 1  # every tensor of the list, in one program
    assert _programs(lambda: [t.cpu() for t in tpu]) == 0
    for a, b in zip(tpu, cpu, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


def test_a_write_before_the_read_wins() -> None:
    """A tensor written after the deferred add (here by copy_) keeps what was written; the others get the add."""
    tpu = [torch.zeros(3, device="tpu") for _ in range(4)]
    torch._foreach_add_(tpu, 1)
    tpu[2].copy_(torch.full((3,), 7.0))
    assert [t.cpu().tolist() for t in tpu] == [[1.0] * 3, [1.0] * 3, [7.0] * 3, [1.0] * 3]


def test_an_op_reading_a_waiting_tensor_sees_the_add() -> None:
    tpu = [torch.arange(3.0, device="tpu"), torch.ones((), device="tpu")]
    torch._foreach_add_(tpu, 2)
    assert (tpu[0] * tpu[1]).cpu().tolist() == [6.0, 9.0, 12.0]
    assert tpu[1].item() == 3.0


def test_views_and_odd_cases_take_the_loop() -> None:
    """Views, a buffer listed twice, a float scalar on integers and bool: PyTorch's composite loop."""
    base_c = torch.arange(12.0).reshape(3, 4)
    base_t = base_c.to("tpu")
    views_c, views_t = [base_c[:, 1], base_c[0]], [base_t[:, 1], base_t[0]]
    torch._foreach_add_(views_c, 1)
    torch._foreach_add_(views_t, 1)
    torch.testing.assert_close(base_t.cpu(), base_c, rtol=0, atol=0)
    twice_c = torch.zeros(2)
    twice_t = twice_c.to("tpu")
    torch._foreach_add_([twice_c, twice_c], 1)
    torch._foreach_add_([twice_t, twice_t], 1)
    assert twice_t.cpu().tolist() == twice_c.tolist() == [2.0, 2.0]
    ints = [torch.ones(2, dtype=torch.int64, device="tpu")]
    torch._foreach_add_(ints, 0.5)  # CPU raises here; tpu's add_ does not (its own gap): not deferred at least
    assert ints[0].cpu().tolist() == [1, 1]
    flags = [torch.tensor([True, False], device="tpu")]
    torch._foreach_add_(flags, True)
    assert flags[0].cpu().tolist() == [True, True]


def test_capturable_foreach_adamw_counts_in_one_program() -> None:
    """AdamW(foreach, capturable) keeps its step counts on tpu: their increment is one program for all of
    them (it was one per parameter), and the step equals CPU's."""
    torch.manual_seed(0)
    cpu = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(12)]
    tpu = [torch.nn.Parameter(p.detach().to("tpu")) for p in cpu]
    opt_c = torch.optim.AdamW(cpu, lr=0.1, foreach=True)
    opt_t = torch.optim.AdamW(tpu, lr=0.1, foreach=True, capturable=True)
    for _ in range(3):
        for pc, pt in zip(cpu, tpu, strict=True):
            pc.grad = torch.randn(4, 3)
            pt.grad = pc.grad.to("tpu")
        opt_c.step()
        opt_t.step()
    counts = [opt_t.state[p]["step"] for p in tpu]
    torch._foreach_add_(counts, 1)
    assert _programs(lambda: counts[0].cpu()) == 1
    torch._foreach_add_(counts, -1)
    for pc, pt in zip(cpu, tpu, strict=True):
        # capturable computes the bias corrections in float32 tensors, CPU's foreach in Python floats
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), rtol=1e-5, atol=1e-5)
        assert opt_t.state[pt]["step"].item() == opt_c.state[pc]["step"].item() == 3
