"""Conjugate and negative views on tpu: values like CPU's, and no crash when read back (found on the full-zoo
sweep: `x.conj()` read unconjugated in Autoformer, and with the conjugate bit set `.cpu()` overflowed the
C++ stack). tpu gives a conjugated copy, as for view_as_real (hf_tpu/dispatch.py `_conj`)."""

from __future__ import annotations

import subprocess
import sys

import torch

CHECKS = """
import torch, hf_tpu
torch.manual_seed(0)
x = torch.randn(3, 4, dtype=torch.complex64); t = x.to("tpu")
c = t.conj()
assert torch.equal(c.cpu(), x.conj().resolve_conj()), "conj values"
assert torch.equal(c.imag.cpu(), x.conj().imag), "conj imag"
assert torch.equal(t._neg_view().cpu(), x._neg_view().resolve_neg()), "neg view"
assert torch.allclose((c @ t.T).cpu(), x.conj() @ x.T, atol=1e-5), "matmul of a conj"
f = lambda z: torch.fft.irfft(torch.fft.rfft(z.real, dim=-1) * torch.fft.rfft(z.real, dim=-1).conj(), dim=-1)
assert torch.allclose(f(t).cpu(), f(x), atol=1e-5), "FFT autocorrelation"
print("ok")
"""


def test_conj_and_neg_views_read_like_cpu_in_a_fresh_process() -> None:
    # a subprocess: the old failure was a segfault, which would take the test run down with it
    r = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-500:], r.stderr[-2000:])


def test_complex_gradients_through_conj_match_cpu() -> None:
    c = torch.randn(4, dtype=torch.complex64, requires_grad=True)
    ct = c.detach().to("tpu").requires_grad_()
    for z in (c, ct):
        (z * z.conj()).real.sum().backward()
    assert torch.allclose(ct.grad.cpu(), c.grad, atol=1e-6)
