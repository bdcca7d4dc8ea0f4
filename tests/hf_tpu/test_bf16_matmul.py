"""bfloat16 matmuls on tpu ask XLA for a float32 dot result and round it once (precision.wide_accumulation_matmul):
the same arithmetic as XLA:CPU's own bfloat16 dot (operands widened, float32 accumulation, one rounding),
through YNNPACK's bfloat16 kernel. The values are checked against float64 on CPU, and the programs for the
dot's result type (what makes it the fast kernel)."""

from __future__ import annotations

import re

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import lowering, precision

aten = torch.ops.aten


def _bf16_ulps(actual: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|actual - exact| in units of the bfloat16 spacing at `exact`."""
    spacing = torch.finfo(torch.bfloat16).eps * exact.abs().clamp_min(1e-30)
    return (actual.double() - exact).abs() / spacing


@pytest.mark.parametrize("case", ["mm", "bmm", "matmul", "addmm", "addmm_scaled"])
def test_bf16_matmul_is_float32_accumulated_and_rounded_once(case: str) -> None:
    torch.manual_seed(0)
    if case == "bmm":
        a, b = torch.randn(3, 32, 200), torch.randn(3, 200, 24)
    else:
        a, b = torch.randn(48, 200), torch.randn(200, 40)
    a, b = a.bfloat16(), b.bfloat16()
    bias = torch.randn(b.shape[-1]).bfloat16()
    beta, alpha = (0.5, 2.0) if case == "addmm_scaled" else (1.0, 1.0)
    exact = a.double() @ b.double()
    ta, tb = a.to("tpu"), b.to("tpu")
    if case.startswith("addmm"):
        out = torch.addmm(bias.to("tpu"), ta, tb, beta=beta, alpha=alpha).cpu()
        # torchax's addmm (and so hf-tpu's): the product rounded to bfloat16, then beta * bias + alpha * it,
        # each step in bfloat16
        prod = exact.bfloat16()
        expected = (bias * torch.tensor(beta).bfloat16() + torch.tensor(alpha).bfloat16() * prod).double()
        assert out.dtype == torch.bfloat16
        assert (out.double() != expected).float().mean() < 0.01  # a product off by one ulp shifts a sum
        return
    out = {"mm": torch.mm, "bmm": torch.bmm, "matmul": torch.matmul}[case](ta, tb).cpu()
    assert out.dtype == torch.bfloat16
    ulps = _bf16_ulps(out, exact)
    # float32 accumulation then one rounding: within one bfloat16 ulp of the exact product, and nearly always
    # its correct rounding (bfloat16 accumulation would be off by many ulps over 200 terms)
    assert ulps.max() <= 1.0
    assert (out.double() == exact.bfloat16().double()).float().mean() > 0.99


def _dot_result_types(op: object, *arrays: object) -> list[str]:
    from hf_tpu import runtime

    jax = runtime.jax()
    fn = lowering.find(op)
    text = jax.jit(lambda *xs: fn(*xs)).lower(*arrays).as_text()
    return re.findall(r"stablehlo\.dot_general.*->\s*tensor<[0-9x]*(\w+)>", text)


@pytest.mark.parametrize("op", [aten.mm.default, aten.bmm.default, aten.matmul.default])
def test_bf16_dot_asks_for_a_float32_result(op: object) -> None:
    from hf_tpu import runtime

    jnp = runtime.jax().numpy
    shape = (2, 8, 16) if op is aten.bmm.default else (8, 16)
    a = jnp.ones(shape, jnp.bfloat16)
    b = jnp.ones((*shape[:-2], 16, 4), jnp.bfloat16)
    assert _dot_result_types(op, a, b) == ["f32"]


def test_other_dtypes_keep_their_lowering() -> None:
    from hf_tpu import runtime

    jnp = runtime.jax().numpy
    for dt, want in ((jnp.float32, "f32"), (jnp.float16, "f16")):
        a, b = jnp.ones((8, 16), dt), jnp.ones((16, 4), dt)
        assert _dot_result_types(aten.mm.default, a, b) == [want]
    # mixed operands are not this path's (PyTorch refuses them; a decomposition could still pass them)
    assert precision.wide_accumulation_matmul("mm", (jnp.ones((2, 2), jnp.bfloat16),
                                                     jnp.ones((2, 2), jnp.float32)), {}) is None
