"""log_softmax over rows longer than torch_dot_ffi.LONG_ROW (a language model's vocabulary) and its backward run
PyTorch's CPU kernels inside the XLA program, in eager mode and compiled graphs: CPU's bits, through the
handlers; shorter rows keep XLA's."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import torch_dot_ffi

aten = torch.ops.aten
LONG = torch_dot_ffi.LONG_ROW + 7  # an odd length, as GPT-2's 50,257

pytestmark = pytest.mark.skipif(not torch_dot_ffi.ensure(), reason=f"no handlers: {torch_dot_ffi.status()}")


def _forward_backward(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    out = torch.log_softmax(x, -1)
    out.backward(g)
    return out.detach().cpu(), x.grad.cpu()


def test_long_rows_are_cpu_pytorchs_in_eager_mode() -> None:
    torch.manual_seed(0)
    x, g = torch.randn(3, LONG) * 4, torch.randn(3, LONG)
    calls = torch_dot_ffi.calls("log_softmax")
    out, grad = _forward_backward(x.to("tpu"), g.to("tpu"))
    assert torch_dot_ffi.calls("log_softmax") == calls + 2  # the forward and the backward
    want_out, want_grad = _forward_backward(x, g)
    assert torch.equal(out, want_out) and torch.equal(grad, want_grad)


def test_short_rows_stay_with_xla() -> None:
    x, g = torch.randn(3, 1000), torch.randn(3, 1000)
    calls = torch_dot_ffi.calls("log_softmax")
    out, grad = _forward_backward(x.to("tpu"), g.to("tpu"))
    assert torch_dot_ffi.calls("log_softmax") == calls
    want_out, want_grad = _forward_backward(x, g)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(grad, want_grad)


def test_compiled_cross_entropy_over_a_long_vocabulary() -> None:
    # what a language model's loss compiles to: _log_softmax, nll_loss, and their backwards, in one graph each
    torch.manual_seed(0)
    logits, labels = torch.randn(6, LONG) * 3, torch.randint(0, LONG, (6,))

    def loss_and_grad(x: torch.Tensor, y: torch.Tensor, compiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.clone().requires_grad_()
        fn = torch.nn.functional.cross_entropy
        loss = (torch.compile(fn, backend="tpu") if compiled else fn)(x, y)
        loss.backward()
        return loss.detach().cpu(), x.grad.cpu()

    calls = torch_dot_ffi.calls("log_softmax")
    loss, grad = loss_and_grad(logits.to("tpu"), labels.to("tpu"), compiled=True)
    assert torch_dot_ffi.calls("log_softmax") >= calls + 2
    want_loss, want_grad = loss_and_grad(logits, labels, compiled=False)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-6)  # nll's sum is XLA's
    assert torch.equal(grad, want_grad)


def test_lowering_emits_the_custom_call_and_differentiates() -> None:
    from hf_tpu import lowering, runtime

    jax = runtime.jax()
    jnp = jax.numpy
    log_softmax = lowering.find(aten._log_softmax.default)
    x = jnp.linspace(-3.0, 3.0, 2 * LONG, dtype=jnp.float32).reshape(2, LONG)
    assert "custom_call @hf_tpu_torch_log_softmax" in jax.jit(lambda a: log_softmax(a, -1)).lower(x).as_text()
    assert "custom_call" not in jax.jit(lambda a: log_softmax(a, 0)).lower(x).as_text()  # not the last dim
    # jax.vjp through the lowering (backward_lowerings traces forward lowerings under it): the handler's backward
    g = jnp.cos(x)
    out, pull = jax.vjp(lambda a: log_softmax(a, -1), x)
    want_out, want_pull = jax.vjp(lambda a: jax.nn.log_softmax(a, -1), x)
    assert jnp.allclose(out, want_out, atol=1e-5)
    assert jnp.allclose(pull(g)[0], want_pull(g)[0], atol=1e-5)
