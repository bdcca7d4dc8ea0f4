"""float32 matmul precision on tpu: "medium" (bfloat16 products, the tpu default), "high", "highest"."""

from __future__ import annotations

import torch

import hf_tpu


def _mm_err(precision_value: str, precision) -> float:
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    expected = (a.double() @ b.double())
    precision(precision_value)
    actual = (a.to("tpu") @ b.to("tpu")).cpu().double()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def test_default_is_medium(monkeypatch) -> None:
    from hf_tpu import precision as p

    monkeypatch.setattr(p, "_explicit", None)
    monkeypatch.delenv("HF_TPU_MATMUL_PRECISION", raising=False)
    assert hf_tpu.get_matmul_precision() == "medium"


def test_highest_matches_float32(precision) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    precision("highest")
    torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b, rtol=1e-6, atol=1e-5)


def test_medium_is_bfloat16_products(precision) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    precision("medium")
    actual = (a.to("tpu") @ b.to("tpu")).cpu()
    # exactly the product of bfloat16-rounded operands, summed in float32
    expected = a.bfloat16().float() @ b.bfloat16().float()
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-5)
    assert (actual - a @ b).abs().max() > 1e-3  # and visibly not float32


def test_error_shrinks_with_precision(precision) -> None:
    medium, high, highest = (_mm_err(p, precision) for p in ("medium", "high", "highest"))
    assert 1e-4 < medium < 2e-2  # about bfloat16 rounding (8 bits)
    assert high < medium / 50  # three bfloat16 passes: about 16 bits
    assert highest < 1e-6


def test_precision_applies_to_linear_conv_bmm_einsum_attention(precision) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    conv = torch.nn.Conv2d(3, 4, 3)
    lin = torch.nn.Linear(8, 8)
    q = torch.randn(2, 2, 4, 8)
    cases = {
        "linear": (lambda d: lin.to(d)(x.to(d))),
        "conv": (lambda d: conv.to(d)(x.to(d))),
        "bmm": (lambda d: torch.bmm(x.flatten(0, 1).to(d), x.flatten(0, 1).to(d))),
        "einsum": (lambda d: torch.einsum("bchw,bcwv->bchv", x.to(d), x.to(d))),
        "sdpa": (lambda d: torch.nn.functional.scaled_dot_product_attention(q.to(d), q.to(d), q.to(d))),
    }
    for name, f in cases.items():
        precision("highest")
        expected = f("cpu").detach()
        hi = f("tpu").detach().cpu()
        precision("medium")
        med = f("tpu").detach().cpu()
        assert (hi - expected).abs().max() < 1e-5, name
        assert (med - expected).abs().max() > 1e-5, name  # medium really rounds this op


def test_compiled_program_follows_precision(precision) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    f = torch.compile(lambda x, y: x @ y, backend="tpu")
    precision("highest")
    hi = f(a.to("tpu"), b.to("tpu")).cpu()
    precision("medium")
    med = f(a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(hi, a @ b, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(med, a.bfloat16().float() @ b.bfloat16().float(), rtol=1e-6, atol=1e-5)
