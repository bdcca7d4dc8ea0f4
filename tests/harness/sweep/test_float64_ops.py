"""harness/sweep/float64_ops.py: float64 grouped matmuls for the sweep's float64 reference runs."""

import pytest
import torch
import torch.nn.functional as F

from harness.sweep import float64_ops, train

OFFS = torch.tensor([8, 8, 24], dtype=torch.int32)  # an empty group among them


def _layouts():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"2d x 3d": (r(24, 8), r(3, 8, 16), OFFS), "3d x 2d": (r(3, 8, 8), r(8, 24), OFFS),
            "2d x 2d": (r(8, 24), r(24, 16), OFFS), "3d x 3d": (r(3, 8, 8), r(3, 8, 16), None)}


@pytest.mark.parametrize("layout", list(_layouts()))
def test_grouped_mm_is_pytorchs_in_float32(layout):
    a, b, offs = _layouts()[layout]
    torch.testing.assert_close(float64_ops.grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs=offs),
                               rtol=1e-6, atol=1e-6)


def test_float64_grouped_mm_runs_and_differentiates_within_kernels():
    """As Transformers' MoE experts call it (F.grouped_mm, tokens sorted by expert): PyTorch's CPU kernel
    refuses float64; within kernels() the float64 result and gradients are float32's within its rounding."""
    a, b, offs = _layouts()["2d x 3d"]
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    with float64_ops.kernels():
        F.grouped_mm(a64, b64, offs=offs).pow(2).sum().backward()
    a32, b32 = a.clone().requires_grad_(), b.clone().requires_grad_()
    out32 = torch._grouped_mm(a32, b32, offs=offs)
    out32.pow(2).sum().backward()
    torch.testing.assert_close(a64.grad.float(), a32.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b64.grad.float(), b32.grad, rtol=1e-5, atol=1e-5)
    with float64_ops.kernels():  # float32 calls are PyTorch's own
        assert torch.equal(F.grouped_mm(a, b, offs=offs), out32.detach())


def test_a_float64_tensor_cast_to_float32_stays_float64_within_kernels():
    """Autoformer's attention builds `torch.zeros_like(v).float()` and adds to it: in the float64 reference run
    that mixed float32 into float64 (out_proj: "mat1 and mat2 must have the same dtype") and the entry had no
    reference. Within kernels() the casts keep float64; float32 tensors, other casts and code outside are
    untouched."""
    x = torch.randn(3, 4, dtype=torch.float64)
    with float64_ops.kernels():
        for cast in (lambda t: t.float(), lambda t: t.to(torch.float32), lambda t: t.to("cpu", torch.float32),
                     lambda t: t.to(dtype=torch.float32), lambda t: t.type(torch.float32)):
            y = cast(x)
            assert y.dtype == torch.float64 and torch.equal(y, x)
        assert x.to(torch.float16).dtype == torch.float16 and x.long().dtype == torch.int64
        assert torch.randn(2).to(torch.float32).dtype == torch.float32
        w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        (x.float() @ w).sum().backward()  # differentiable through the kept cast
    assert w.grad is not None and w.grad.dtype == torch.float64
    assert x.float().dtype == torch.float32  # outside kernels(): PyTorch's own cast


def test_a_float32_factory_makes_float64_within_kernels():
    """FastSpeech2Conformer's length regulator writes the encoder's states into `torch.zeros(..., dtype=
    torch.float)` and hands that to the decoder: in the float64 reference run it was float32 (the states rounded
    to it) and the float64 decoder raised "Input type (float) and bias type (double) should be the same", so
    the entry had no reference in either phase. Within kernels() such a factory makes float64; outside, PyTorch's own dtype."""
    from transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer import length_regulator

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    durations = torch.tensor([[1, 2, 0], [2, 1, 1]])
    w = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    with float64_ops.kernels():
        out = length_regulator(x, durations)
        assert out.dtype == torch.float64
        (out @ w).pow(2).sum().backward()  # the decoder's matmul: raised before
    # the states themselves, not their float32 rounding
    assert torch.equal(out[0, :3].detach(), x[0].detach().repeat_interleave(durations[0], 0))
    assert x.grad is not None and w.grad is not None and x.grad.dtype == torch.float64
    x64 = torch.ones(3, dtype=torch.float64)
    makes = (lambda: torch.zeros(3, dtype=torch.float32), lambda: torch.ones(3, dtype=torch.float),
             lambda: torch.full((3,), 0.1, dtype=torch.float32), lambda: torch.arange(3, dtype=torch.float32),
             lambda: torch.linspace(0, 1, 3, dtype=torch.float32), lambda: torch.eye(3, dtype=torch.float32),
             lambda: torch.tensor([0.1], dtype=torch.float32), lambda: torch.zeros_like(x64, dtype=torch.float32),
             lambda: x64.new_zeros(3, dtype=torch.float32), lambda: x64.new_full((3,), 0.1, dtype=torch.float32))
    with float64_ops.kernels():
        assert [m().dtype for m in makes] == [torch.float64] * len(makes)
        assert torch.full((1,), 0.1, dtype=torch.float32).item() == 0.1  # float64's 0.1, not float32's
        assert torch.zeros(3).dtype == torch.float32  # the default dtype is not asked for by name: untouched
        assert torch.zeros(3, dtype=torch.float16).dtype == torch.float16
    assert [m().dtype for m in makes] == [torch.float32] * len(makes)


def test_shared_draws_are_the_baselines_within_kernels():
    """The train reference run enters draws.shared_draws (per step) above kernels(), so kernels() sees the
    calls draws.py makes to draw: a float64 reference must still draw the float32 baseline's numbers (random
    factories and the `empty` buffer of in-place draws are not made float64)."""
    from harness.sweep import draws

    def sample(dtype):
        with draws.shared_draws(0):
            return (torch.empty(6, dtype=dtype).normal_(), torch.randn(6, dtype=dtype),
                    torch.randn(6, dtype=torch.float32), torch.rand_like(torch.zeros(6, dtype=dtype)))
    base = sample(torch.float32)
    with float64_ops.kernels():
        ref = sample(torch.float64)
    assert [t.dtype for t in ref] == [torch.float64, torch.float64, torch.float32, torch.float64]
    for b, r in zip(base, ref, strict=True):
        assert torch.equal(b.double(), r.double())


def test_a_default_dtype_full_of_a_float_makes_float64_within_kernels():
    """XGLM's attention and Kosmos-2's causal mask: `torch.full(shape, torch.finfo(dtype).min)` with no dtype
    makes the default dtype, float32, which cannot hold float64's minimum: the float64 reference run raised
    "value cannot be converted to type float without overflow" and both had no reference."""
    from transformers.models.kosmos2.modeling_kosmos2 import _make_causal_mask

    with float64_ops.kernels():
        mask = _make_causal_mask((2, 4), torch.float64, torch.device("cpu"))
        full = torch.full((2,), torch.finfo(torch.float64).min)
        assert full.dtype == torch.float64 and full[0].item() == torch.finfo(torch.float64).min
        assert torch.full((2,), 0.5, dtype=torch.float16).dtype == torch.float16  # a dtype asked for: kept
        assert torch.full((2,), 3).dtype == torch.int64 and torch.full((2,), True).dtype == torch.bool
    assert mask.dtype == torch.float64 and mask[0, 0, 0, 1].item() == torch.finfo(torch.float64).min
    assert mask[0, 0, 1, 0].item() == 0.0
    assert torch.full((2,), 0.5).dtype == torch.float32  # outside kernels(): PyTorch's own


def test_an_integer_tensor_cast_to_float32_makes_float64_within_kernels():
    """Glm4v's vision embeddings cast the integer image sizes with `.to(dtype=torch.float32)` to build the grid
    of a grid_sample over the float64 position embedding: the float64 run raised "expected scalar type Double
    but found Float" (Glm4v, Glm46V: no reference). Within kernels() such a cast makes float64 (integers are
    exact in both); a float32 tensor's cast and casts outside are PyTorch's own."""

    sizes = torch.tensor([[1, 4, 4]])
    table = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    with float64_ops.kernels():
        h = sizes[:, 1].to(dtype=torch.float32)
        assert h.dtype == torch.float64 and torch.tensor([True]).float().dtype == torch.float64
        grid = torch.stack(((torch.arange(4) + 0.5) / h * 2 - 1,) * 2, -1).view(1, 4, 1, 2)
        out = F.grid_sample(table, grid, mode="bicubic", align_corners=False, padding_mode="border")
        assert out.dtype == torch.float64
        assert torch.randn(2).to(torch.float32).dtype == torch.float32
        assert sizes.to(torch.float16).dtype == torch.float16 and sizes.long().dtype == torch.int64
    assert sizes.to(torch.float32).dtype == torch.float32


def test_an_op_asked_for_float32_computes_float64_within_kernels():
    """PPOCRV5's head: `F.softmax(x, dim=2, dtype=torch.float32).to(x.dtype)` of equal logits (its output is
    uniform) and the train phase's loss mean(p ** 2): the gradient is zero in exact arithmetic. Computed in
    float32 the float64 run kept float32's rounding residue as its gradients, none was known null, and tpu's
    exact zeros failed all 575 of them."""

    x = torch.zeros(2, 3, 18385, dtype=torch.float64, requires_grad=True)
    y = torch.zeros(2, dtype=torch.float32)
    with float64_ops.kernels():
        p = F.softmax(x, dim=2, dtype=torch.float32)
        assert p.dtype == torch.float64
        p.to(x.dtype).pow(2).mean().backward()
        assert x.softmax(-1, dtype=torch.float32).dtype == torch.float64
        assert torch.sum(x, dtype=torch.float32).dtype == torch.float64
        assert x.float().sum(dtype=torch.float16).dtype == torch.float16  # another dtype asked for: kept
        assert F.softmax(x.float(), dim=2, dtype=torch.float32).dtype == torch.float64  # .float() stays float64
        assert F.softmax(y, dim=0, dtype=torch.float32).dtype == torch.float32  # a float32 input: float32
    x32 = torch.zeros(2, 3, 18385, dtype=torch.float32, requires_grad=True)
    F.softmax(x32, dim=2, dtype=torch.float32).pow(2).mean().backward()
    # null by the train rule: float64's residue is below NULL_GRADIENT of float32's (was equal to it)
    assert x.grad.norm().item() <= train.NULL_GRADIENT * x32.grad.norm().item()
    assert F.softmax(x.detach(), dim=2, dtype=torch.float32).dtype == torch.float32  # outside: PyTorch's own
