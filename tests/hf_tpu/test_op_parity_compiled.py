"""Pairs of the OpInfo parity run that passed in eager but failed through torch.compile(backend="tpu"), each
against CPU in a compiled function (one small graph each)."""

from __future__ import annotations

import torch

import op_parity

F = torch.nn.functional


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu", dynamic=False)


def _check(fn, *args) -> None:
    expected = fn(*args)
    op_parity.compare(expected, _compiled(fn)(*[a.to("tpu") for a in args]))


def test_decomposition_only_in_pytorchs_full_table() -> None:
    """ldexp.Tensor has a decomposition in PyTorch's table but not among the core ATen ones compiled graphs
    used: it failed to compile with NoLowering while eager decomposed it."""
    _check(torch.ldexp, torch.tensor([1.5, -2.0, 3.0]), torch.tensor([2, -1, 0]))


def test_integer_and_bool_inputs_of_float_ops_promoted_in_graphs() -> None:
    """Eager promotes them before the lowering; a graph handed the bool array to JAX's float function."""
    _check(torch.special.bessel_j1, torch.tensor([True, False, True]))
    _check(torch.special.bessel_j0, torch.arange(-3, 4))


def test_compiled_code_may_fork_the_tpu_rng() -> None:
    """PyTorch's OpInfo runs `item` inside fork_rng: Dynamo traced the tpu generator's state (a NumPy view of
    the JAX key) and failed; the state functions now run eagerly."""

    def fn(x):
        with torch.random.fork_rng(devices=["tpu:0"], device_type="tpu"):
            return x * 2

    _check(fn, torch.tensor([1.0, 2.0]))


def test_max_unpool_is_one_scatter() -> None:
    """torchax's lowering read every index on the host: a tracer error in a graph."""
    x = torch.randn(2, 3, 4, 4, 4)
    out, idx = F.max_pool3d(x, 2, stride=1, return_indices=True)  # overlapping windows: repeated indices
    _check(lambda o, i: F.max_unpool3d(o, i, 2, stride=1, output_size=x.shape[-3:]), out, idx)
    out, idx = F.max_pool2d(x[0], 2, return_indices=True)
    _check(lambda o, i: F.max_unpool2d(o, i, 2), out, idx)
