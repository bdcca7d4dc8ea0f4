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


def _operands(shape_a: tuple[int, ...], shape_b: tuple[int, ...], transposed: str) -> tuple[torch.Tensor, ...]:
    """bfloat16 operands of the given logical shapes; `transposed` names those ("a", "b") that are
    transposed views of a buffer laid out the other way (a linear layer's weight.t(), its backward's x.t())."""
    def make(shape: tuple[int, ...], t: bool) -> torch.Tensor:
        if not t:
            return torch.randn(shape).bfloat16()
        return torch.randn(*shape[:-2], shape[-1], shape[-2]).bfloat16().transpose(-1, -2)
    return make(shape_a, "a" in transposed), make(shape_b, "b" in transposed)


@pytest.mark.parametrize("transposed", ["", "a", "b", "ab"])
@pytest.mark.parametrize("case", ["mm", "bmm", "matmul", "addmm", "addmm_scaled"])
def test_bf16_matmul_is_float32_accumulated_and_rounded_once(case: str, transposed: str) -> None:
    torch.manual_seed(0)
    if case == "bmm":
        a, b = _operands((3, 32, 200), (3, 200, 24), transposed)
    else:
        a, b = _operands((48, 200), (200, 40), transposed)
    bias = torch.randn(b.shape[-1]).bfloat16()
    beta, alpha = (0.5, 2.0) if case == "addmm_scaled" else (1.0, 1.0)
    exact = a.double() @ b.double()
    ta, tb = a.to("tpu"), b.to("tpu")
    if case.startswith("addmm"):
        out = torch.addmm(bias.to("tpu"), ta, tb, beta=beta, alpha=alpha).cpu()
        # CPU's addmm: beta * bias + alpha * product with the product unrounded, rounded once to bfloat16
        expected = (beta * bias.double() + alpha * exact).bfloat16().double()
        assert out.dtype == torch.bfloat16
        # float32 accumulation is within an ulp of the exact sum: the rounding rarely differs
        assert (out.double() != expected).float().mean() < 0.01
        assert (out != torch.addmm(bias, a, b, beta=beta, alpha=alpha)).float().mean() < 0.01
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


def _widened_operands(text: str, shapes: list[tuple[int, ...]]) -> list[str]:
    """Instructions of an optimised HLO module that make a float32 copy of a bfloat16 operand (either
    orientation): XLA:CPU widening the dot to float32 instead of giving it to YNNPACK's bfloat16 kernel."""
    dims = {",".join(map(str, s)) for shape in shapes for s in (shape, (*shape[:-2], shape[-1], shape[-2]))}
    return [line.strip() for line in text.splitlines()
            if re.search(r"= f32\[([0-9,]*)\]", line) and re.search(r"= f32\[([0-9,]*)\]", line).group(1) in dims]


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("transposed", ["a", "b", "ab"])
@pytest.mark.parametrize("op", [aten.mm.default, aten.bmm.default, aten.addmm.default])
def test_bf16_dot_with_transposed_operands_stays_bfloat16(op: object, transposed: str, full: bool) -> None:
    # a transposed operand (weight.t() in a linear layer, x.t() in its weight gradient) made XLA:CPU widen the
    # dot to float32 (a right operand) or to its own float32 dot (a left one), 2-2.5x slower: the dot is given
    # in a form YNNPACK's bfloat16 kernel takes (precision._canonical_dot)
    from hf_tpu import runtime, xla_options

    jax = runtime.jax()
    jnp = jax.numpy
    batch = (2,) if op is aten.bmm.default else ()
    m, k, n = 24, 40, 56
    a = jnp.ones((*batch, k, m) if "a" in transposed else (*batch, m, k), jnp.bfloat16)
    b = jnp.ones((*batch, n, k) if "b" in transposed else (*batch, k, n), jnp.bfloat16)
    fn = lowering.find(op)

    def program(a: object, b: object) -> object:
        a = jnp.swapaxes(a, -1, -2) if "a" in transposed else a  # as a view is read inside an op's program
        b = jnp.swapaxes(b, -1, -2) if "b" in transposed else b
        return fn(jnp.zeros((n,), jnp.bfloat16), a, b) if op is aten.addmm.default else fn(a, b)

    jit = xla_options.jit_full if full else jax.jit
    text = jit(program).lower(a, b).compile().as_text()
    assert "__ynn_fusion" in text
    assert _widened_operands(text, [(*batch, m, k), (*batch, k, n)]) == []
