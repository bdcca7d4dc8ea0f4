"""torch.library custom ops in compiled graphs: Dynamo keeps a custom op whole, and eager runs its Python body
on tpu tensors; the graph compiler traces a device-agnostic body into the program the same way
(graph_compiler._custom_op_body). F.linear_cross_entropy's chunked path is such an op (PyTorch's torch_nn
namespace), forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_tpu  # noqa: F401


@torch.library.custom_op("hf_tpu_test::scaled_softplus", mutates_args=())
def scaled_softplus(x: torch.Tensor, scale: float) -> torch.Tensor:
    buf = torch.empty_like(x)  # written in place, as PyTorch's own bodies do
    buf.copy_(F.softplus(x))
    return buf * scale


@scaled_softplus.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("hf_tpu_test::cpu_only", mutates_args=(), device_types="cpu")
def cpu_only(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.numpy() * 2)


@cpu_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_device_agnostic_custom_op_compiles_as_its_body(highest) -> None:
    x = torch.randn(4, 5)
    out = torch.compile(lambda t: scaled_softplus(t * 2, 0.5) + 1, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), scaled_softplus(x * 2, 0.5) + 1, rtol=1.3e-6, atol=1e-6)


def test_a_cpu_only_custom_op_has_no_lowering() -> None:
    with pytest.raises(Exception, match=r"no JAX lowering for hf_tpu_test::cpu_only"):
        torch.compile(lambda t: cpu_only(t + 1), backend="tpu")(torch.randn(3).to("tpu"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_linear_cross_entropy_forward_and_backward(reduction: str, highest) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 8), torch.randn(11, 8), torch.randn(11)
    target = torch.randint(0, 11, (6,))
    # allow_retain_graph: the scalar reductions then take the chunked custom op too (as OpInfo's sample does)
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True)

    def loss(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, options=opts).sum()

    leaves = [v.clone().requires_grad_() for v in (x, w, b)]
    ref = loss(*leaves, target)
    ref_grads = torch.autograd.grad(ref, leaves)
    tleaves = [v.detach().to("tpu").requires_grad_() for v in (x, w, b)]
    out = torch.compile(loss, backend="tpu")(*tleaves, target.to("tpu"))
    grads = torch.autograd.grad(out, tleaves)
    torch.testing.assert_close(out.cpu(), ref, rtol=1.3e-6, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu(), r, rtol=1.3e-6, atol=1e-5)


def test_a_users_custom_op_body_gives_its_graph_no_executable_name() -> None:
    """The executable cache names a graph by its ops; a user's custom op body can change between processes
    under the same name, so such a graph is traced in every process (no name); PyTorch's own keep one."""
    from hf_tpu.graph_ident import graph_ident

    def ident(op, *args):  # a one-node ATen graph calling `op`, as AOTAutograd leaves a custom op
        g = torch.fx.Graph()
        ins = []
        for i, a in enumerate(args):
            ins.append(g.placeholder(f"a{i}"))
            ins[-1].meta["val"] = a
        node = g.call_function(op, tuple(ins))
        node.meta["val"] = op(*args)
        g.output(node)
        return graph_ident(torch.fx.GraphModule(torch.nn.Module(), g), "highest")

    x = torch.randn(4, 5)
    assert ident(torch.ops.aten.exp.default, x) is not None
    assert ident(torch.ops.hf_tpu_test.scaled_softplus.default, x, 0.5) is None
