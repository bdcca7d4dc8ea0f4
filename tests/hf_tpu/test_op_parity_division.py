"""True division correctly rounded when the divisor broadcasts (hf_tpu/lowering_parity.py, _ieee_div): XLA's
algebraic simplifier rewrites a / broadcast(b) into a * broadcast(1 / b), which put float32 `x / 3` an ulp off
CPU's on a third of the elements, eager and compiled. Bit-equal checks: the ulp is inside every tolerance."""

from __future__ import annotations

import pytest
import torch


def _off(expected: torch.Tensor, actual: torch.Tensor) -> int:
    actual = actual.cpu()
    assert expected.dtype == actual.dtype and expected.shape == actual.shape
    return int((expected != actual).sum())


def _cases():
    torch.manual_seed(0)
    x = torch.randn(300, 64) * 10
    row = x.std(-1, keepdim=True)
    return [
        ("x / 3.0", lambda a: a / 3.0, (x,)),
        ("x / 7 (int)", lambda a: a / 7, (x,)),
        ("div(x, 196.0, rounding_mode=None)", lambda a: torch.div(a, 196.0, rounding_mode=None), (x,)),
        ("x / 0-d tensor", lambda a, b: a / b, (x, torch.tensor(3.0))),
        ("x / row statistic", lambda a, b: a / b, (x, row)),
        ("x /= 3.0 in place", lambda a: a.clone().div_(3.0), (x,)),
        ("float64 x / 3.0", lambda a: a / 3.0, (x.double(),)),
        ("bfloat16 x / 3.0", lambda a: a / 3.0, (x.bfloat16(),)),
        # a mean whose sums are exact (integers): only the division by the count can differ
        ("mean of integers over 7", lambda a: a.mean(-1), (torch.randint(-50, 50, (2000, 7)).float(),)),
    ]


@pytest.mark.parametrize("compiled", [False, True])
def test_division_by_a_broadcast_divisor_is_correctly_rounded(compiled) -> None:
    off = {}
    for name, fn, args in _cases():
        run = fn
        if compiled:
            torch._dynamo.reset()
            run = torch.compile(fn, backend="tpu", dynamic=False)
        off[name] = _off(fn(*args), run(*[a.to("tpu") for a in args]))
    assert not any(off.values()), f"elements off CPU's bits: {off}"


def test_floor_and_trunc_division_unchanged() -> None:
    x = torch.arange(-2000, 2000, dtype=torch.float32)
    for mode in ("floor", "trunc"):
        assert _off(torch.div(x, 7.0, rounding_mode=mode), torch.div(x.to("tpu"), 7.0, rounding_mode=mode)) == 0
    i = torch.arange(-20, 20)
    assert _off(torch.div(i, 3, rounding_mode="floor"), torch.div(i.to("tpu"), 3, rounding_mode="floor")) == 0
    assert _off(i / 3, i.to("tpu") / 3) == 0
