"""The eager fast path (plans.py): ops with several outputs are planned, in Strict and in fused mode."""

from __future__ import annotations

import pytest
import torch

import hf_tpu
from hf_tpu import fused, plans
from hf_tpu import tensor as T

aten = torch.ops.aten
MULTI = [
    ("native_layer_norm", aten.native_layer_norm.default,
     lambda x: aten.native_layer_norm(x, [6], x[0], x[1], 1e-5)),
    ("var_mean", aten.var_mean.correction, lambda x: torch.var_mean(x, 1)),
    ("max.dim", aten.max.dim, lambda x: torch.max(x, 1)),
    ("topk", aten.topk.default, lambda x: torch.topk(x, 3, dim=-1)),
    ("sort", aten.sort.default, lambda x: torch.sort(x, dim=0, descending=True)),
    ("aminmax", aten.aminmax.default, lambda x: torch.aminmax(x, dim=1)),
]


def _cpu(res):
    return [r.cpu() for r in res]


def _case(f):
    """f's CPU result on a seeded input, and that input on tpu."""
    torch.manual_seed(0)
    x = torch.randn(5, 6)
    return f(x), x.to("tpu")


def _check(got, want):
    for g, w in zip(_cpu(got), want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,op,f", MULTI, ids=[m[0] for m in MULTI])
def test_multi_output_ops_are_planned_and_match_cpu(name, op, f):
    want, t = _case(f)
    plans.table.clear()
    f(t)  # the general path, once: it leaves a plan
    mine = [p for k, p in plans.table.items() if k[0] == op]
    assert len(mine) == 1 and mine[0].multi is tuple, "the op should have been planned"
    plan = mine[0]
    calls = []
    real = plan.program
    plan.program = lambda *arrays: calls.append(1) or real(*arrays)
    try:
        got = f(t)
    finally:
        plan.program = real
    assert calls == [1]  # the second call ran the plan
    assert isinstance(got, tuple) and len(got) == len(want)
    _check(got, want)


@pytest.mark.parametrize("name,op,f", MULTI, ids=[m[0] for m in MULTI])
def test_multi_output_ops_defer_in_fused_mode(name, op, f):
    want, t = _case(f)
    f(t)
    fused.reset_stats()
    with hf_tpu.defer_and_fuse():
        got = f(t * 1)
        assert all(T.payload(g).buf._array is None for g in got), "every output should still be pending"
        got = _cpu(got)
    _check(got, want)


def test_layer_norm_does_not_cut_a_fused_graph(highest):
    # GPT-2's 25 layer norms used to end a fused program each: a chain of them is one program now
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(16)
    x = torch.randn(4, 16)
    want = ln(torch.relu(ln(x)) * 2).detach()
    lt, xt = ln.to("tpu"), x.to("tpu")
    with torch.no_grad():
        lt(torch.relu(lt(xt)) * 2).cpu()  # plans made
        fused.reset_stats()
        with hf_tpu.defer_and_fuse():
            got = lt(torch.relu(lt(xt)) * 2).cpu()
    assert fused.stats()["graphs"] == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_the_outputs_still_held_are_kept():
    torch.manual_seed(0)
    x = torch.randn(5, 6)
    t = x.to("tpu")
    torch.var_mean(t, 1)
    with hf_tpu.defer_and_fuse():
        var, mean = torch.var_mean(t * 2, 1)
        var_node = T.payload(var).buf._loader
        del var
        got = mean.cpu()
    assert var_node.value is None  # the dropped output was never an output of the program
    torch.testing.assert_close(got, (x * 2).mean(1))


def test_layer_norm_backward_through_fused_outputs(highest):
    torch.manual_seed(0)
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    torch.nn.functional.layer_norm(x, (8,), w).sum().backward()
    want_x, want_w = x.grad.clone(), w.grad.clone()
    xt = x.detach().to("tpu").requires_grad_()
    wt = w.detach().to("tpu").requires_grad_()
    for _ in range(2):
        xt.grad = wt.grad = None
        with hf_tpu.defer_and_fuse():
            torch.nn.functional.layer_norm(xt, (8,), wt).sum().backward()
            gx, gw = xt.grad.cpu(), wt.grad.cpu()
    torch.testing.assert_close(gx, want_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, want_w, rtol=1e-5, atol=1e-5)
