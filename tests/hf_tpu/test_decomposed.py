"""Ops without a lowering run as one traced program of their decomposition; SDPA reaches us whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_tpu import hooks, rng

aten = torch.ops.aten


@pytest.fixture
def ops_seen():
    seen: list[str] = []

    def spy(dispatch, op, args, kwargs):
        seen.append(op.__name__)
        return dispatch(op, args, kwargs)

    with hooks.observe_ops(spy):
        yield seen


@pytest.mark.parametrize("make", [
    lambda x: torch.tril(x, -1),
    lambda x: torch.triu(x > 0, 2),
    lambda x: torch.isneginf(x.log()),
    lambda x: (x > -0.5).all(dim=1),
    lambda x: (x > -3).all(),
], ids=["tril", "triu-bool", "isneginf", "all-dim", "all"])
def test_a_decomposed_op_matches_cpu_and_runs_as_one_op(make, ops_seen):
    x = torch.randn(6, 6)
    xt = x.to("tpu")
    make(xt)  # traces
    ops_seen.clear()
    got = make(xt)
    torch.testing.assert_close(got.cpu(), make(x))
    # the second call: the op itself, then the .cpu() copy (_to_copy reaches the device's own kernel since
    # eefb5df, then _copy_from); none of its decomposition's ops
    copy = ("_to_copy.default", "_copy_from.default")
    assert len([o for o in ops_seen if o not in (*copy, "gt.Scalar", "log.default")]) == 1, ops_seen


def test_a_random_decomposition_is_never_frozen_into_a_program():
    x = torch.ones(64, 64).to("tpu")
    a = F.dropout(x, 0.5, training=True).cpu()
    b = F.dropout(x, 0.5, training=True).cpu()
    assert not torch.equal(a, b)  # a frozen key would give the same mask twice
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    import jax

    assert not isinstance(rng.get_state(), jax.core.Tracer)  # no tracer of the key leaked out of a trace
    torch.rand(3, device="tpu").cpu()  # the key left behind still works outside any trace


def _sdpa_cases():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g)
    k = torch.randn(2, 4, 16, 8, generator=g)
    v = torch.randn(2, 4, 16, 8, generator=g)
    kv2 = torch.randn(2, 2, 16, 8, generator=g)
    return {
        "causal": ((q, k, v), dict(is_causal=True)),
        "plain": ((q, k, v), {}),
        "bool-mask": ((q, k, v), dict(attn_mask=torch.rand(16, 16, generator=g) > 0.3)),
        "float-mask": ((q, k, v), dict(attn_mask=torch.randn(2, 1, 16, 16, generator=g))),
        "gqa": ((q, kv2, kv2), dict(is_causal=True, enable_gqa=True)),
        "scale": ((q, k, v), dict(scale=0.3)),
        "fully-masked-row": ((q, k, v), dict(attn_mask=torch.zeros(16, 16, dtype=torch.bool).tril().
                                             index_fill(0, torch.tensor([0]), False))),
    }


@pytest.mark.parametrize("case", list(_sdpa_cases()))
def test_sdpa_in_inference_is_one_op_and_matches_cpu(case, highest, ops_seen):
    args, kwargs = _sdpa_cases()[case]
    targs = [a.to("tpu") for a in args]
    tkwargs = {n: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for n, v in kwargs.items()}
    F.scaled_dot_product_attention(*targs, **tkwargs)
    ops_seen.clear()
    got = F.scaled_dot_product_attention(*targs, **tkwargs)
    assert ops_seen == ["scaled_dot_product_attention.default"]
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(*args, **kwargs), atol=1e-5, rtol=1e-5)


def test_sdpa_with_grad_keeps_the_composite_and_its_gradients(highest, ops_seen):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    qt = q.detach().to("tpu").requires_grad_()
    F.scaled_dot_product_attention(q, q * 2, q, is_causal=True).square().sum().backward()
    F.scaled_dot_product_attention(qt, qt * 2, qt, is_causal=True).square().sum().backward()
    assert "scaled_dot_product_attention.default" not in ops_seen  # autograd recorded the math path
    torch.testing.assert_close(qt.grad.cpu(), q.grad, atol=1e-5, rtol=1e-5)


def test_sdpa_with_dropout_draws_new_numbers_each_call():
    q = torch.ones(1, 1, 32, 8).to("tpu")
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu()
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu()
    assert not torch.equal(a, b)


def test_sdpa_compiles_as_before(highest):
    q = torch.randn(1, 2, 8, 4)
    f = torch.compile(lambda a: F.scaled_dot_product_attention(a, a, a, is_causal=True), backend="tpu")
    torch.testing.assert_close(f(q.to("tpu")).cpu(), F.scaled_dot_product_attention(q, q, q, is_causal=True),
                               atol=1e-5, rtol=1e-5)


def test_a_replaced_sub_op_lowering_reaches_a_traced_decomposition(highest):
    """SDPA's program has bmm's lowering baked in: a fault injected into bmm (the sweep's canary) must show."""
    from hf_tpu import hooks

    q = torch.randn(1, 2, 8, 4)
    qt = q.to("tpu")
    ref = F.scaled_dot_product_attention(q, q, q).abs().sum()
    torch.testing.assert_close(F.scaled_dot_product_attention(qt, qt, qt).cpu().abs().sum(), ref)  # traced now

    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) * 2) if op is torch.ops.aten.bmm.default else None

    with hooks.override_lowerings(replace):  # op_jit's programs are not cleared: the canary does not either
        faulty = F.scaled_dot_product_attention(qt, qt, qt).cpu().abs().sum()
    assert not torch.allclose(faulty, ref, rtol=1e-3)
    torch.testing.assert_close(F.scaled_dot_product_attention(qt, qt, qt).cpu().abs().sum(), ref)
