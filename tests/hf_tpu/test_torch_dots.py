"""Large float dots by PyTorch's CPU matmul as an XLA FFI custom call inside programs (hf_tpu/torch_dot_ffi.py:
eager op programs, fused mode, compiled graphs). The oracle is CPU PyTorch:
float32 at "highest" (precision.cpu_reference), whose bits those dots must give (HF_TPU_TORCH_DOTS=all; by
default float32 dots stay XLA's, measured no faster here); at "medium" the precision rule's (both float32
operands rounded to bfloat16, then a float32 product), on any host; bfloat16 dots CPU PyTorch's own bfloat16
matmul's bits (the default). Float32 cases run in child processes with the setting they need (programs traced
under one setting must not be served to another)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import hooks, torch_dot_ffi

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]
# 64 x 1000 x 300 = 19.2M multiply-adds: above torch_dot_ffi.MIN_MACS, with sums long enough that XLA's dot and
# PyTorch's round differently somewhere (the child's HF_TPU_TORCH_DOTS=0 run checks that, so the tests can fail)
M, K, N = 64, 1000, 300

FLOAT32_CHILD = r"""
import json, sys, torch, hf_tpu
from hf_tpu import precision, torch_dot_ffi
by_torch = torch_dot_ffi.calls
M, K, N = %d, %d, %d
hf_tpu.set_matmul_precision("highest")
torch.manual_seed(0)
x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
t = lambda v: v.to("tpu")
def oracle(fn, *a):
    with precision.cpu_reference():
        return fn(*a)
cases = {
    "linear": lambda x, w, b: torch.nn.functional.linear(x, w, b),  # addmm(b, x, w.t())
    "linear_3d": lambda x, w, b: torch.nn.functional.linear(x.view(4, M // 4, K), w, b),
    "mm_t": lambda x, w, b: x @ w.t(),
    "addmm_scaled": lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),
    # (a tpu tensor's .contiguous() of a view is the view: bits are CPU's where the strides are CPU's)
    "bmm": lambda x, w, b: torch.bmm(x.view(4, M // 4, K), w.view(4, N // 4, K).transpose(1, 2)),
}
res = {}
for name, fn in cases.items():
    calls = by_torch()
    res[name] = torch.equal(fn(t(x), t(w), t(b)).cpu(), oracle(fn, x, w, b))
    res[name + "_by_torch"] = by_torch() > calls
lin = torch.nn.functional.linear
# torch's own "bf16" float32 matmul precision (AMX hosts) must not reach tpu's "highest" dots
before = torch.backends.mkldnn.matmul.fp32_precision
torch.backends.mkldnn.matmul.fp32_precision = "bf16"
got = lin(t(x), t(w), t(b)).cpu()
res["torch_bf16_setting_kept"] = torch.backends.mkldnn.matmul.fp32_precision == "bf16"
torch.backends.mkldnn.matmul.fp32_precision = before
res["under_torch_bf16_setting"] = torch.equal(got, oracle(lin, x, w, b))
# gradients: the backward's dots (grad @ w, grad.t() @ x: transposed views)
grads = []
for dev in ("cpu", "tpu"):
    xs, ws, bs = (v.detach().to(dev).requires_grad_() for v in (x, w, b))
    with precision.cpu_reference() if dev == "cpu" else torch.enable_grad():
        lin(xs, ws, bs).square().sum().backward()
    grads.append([v.grad.cpu() for v in (xs, ws, bs)])
res["grad_x"], res["grad_w"] = torch.equal(grads[0][0], grads[1][0]), torch.equal(grads[0][1], grads[1][1])
res["grad_b_close"] = bool(torch.allclose(grads[0][2], grads[1][2], rtol=1e-4, atol=1e-3))  # XLA's row sum
# fused mode: the dot is a node of the fused program (the custom call)
calls = by_torch()
with hf_tpu.defer_and_fuse():
    got = (lin(t(x), t(w), t(b)) * 2).cpu()
res["fused"], res["fused_by_torch"] = torch.equal(got, oracle(lin, x, w, b) * 2), by_torch() > calls
# a compiled graph: its dots are custom calls into PyTorch
model = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.ReLU(), torch.nn.Linear(N, K))  # ReLU: exact
expected = oracle(model, x)
with torch.no_grad():
    res["compiled"] = torch.equal(torch.compile(model.to("tpu"), backend="tpu")(t(x)).cpu(), expected)
# "medium": both operands rounded to bfloat16, a float32 product
hf_tpu.set_matmul_precision("medium")
got = lin(t(x), t(w), t(b)).cpu()
res["medium_rule"] = torch.equal(got, oracle(lin, x.bfloat16().float(), w.bfloat16().float(), b))
res["medium_not_highest"] = not torch.equal(got, oracle(lin, x, w, b))
res["close"] = bool(torch.allclose(lin(t(x), t(w), t(b)).cpu(), oracle(lin, x.bfloat16().float(), w.bfloat16().float(), b), atol=1e-3))
print(json.dumps(res))
""" % (M, K, N)


def _child(setting: str) -> dict:
    env = {**os.environ, "HF_TPU_TORCH_DOTS": setting, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", FLOAT32_CHILD], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def float32_on() -> dict:
    return _child("all")


@pytest.fixture(scope="module")
def float32_off() -> dict:
    return _child("0")


BIT_CASES = ["linear", "linear_3d", "mm_t", "addmm_scaled", "bmm", "under_torch_bf16_setting", "grad_x", "grad_w",
             "fused", "compiled", "medium_rule"]


@pytest.mark.parametrize("case", BIT_CASES)
def test_float32_dots_are_the_oracles_bits(case: str, float32_on: dict) -> None:
    assert float32_on[case], float32_on


def test_float32_dots_by_torch_where_expected(float32_on: dict) -> None:
    assert all(float32_on[c + "_by_torch"] for c in ("linear", "linear_3d", "mm_t", "addmm_scaled", "bmm", "fused"))
    assert float32_on["torch_bf16_setting_kept"]
    assert float32_on["grad_b_close"] and float32_on["medium_not_highest"] and float32_on["close"]


def test_without_torch_dots_the_bits_differ(float32_off: dict) -> None:
    """What the float32 tests see with XLA's dots (so they can fail): the same values, other last bits."""
    assert not any(float32_off[c] for c in BIT_CASES if c not in ("grad_b_close",)), float32_off
    assert float32_off["close"] and not any(float32_off[c + "_by_torch"] for c in ("linear", "bmm"))


def _bf16_operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16(), torch.randn(N).bfloat16())


@pytest.mark.parametrize("case", ["linear", "mm_t", "bmm"])
def test_bfloat16_dots_are_cpu_pytorchs_by_default(case: str) -> None:
    fn = {"linear": torch.nn.functional.linear, "mm_t": lambda x, w, b: x @ w.t(),
          "bmm": lambda x, w, b: torch.bmm(x.view(4, M // 4, K), w.view(4, N // 4, K).transpose(1, 2))}[case]
    x, w, b = _bf16_operands()
    calls = torch_dot_ffi.calls()
    got = fn(x.to("tpu"), w.to("tpu"), b.to("tpu")).cpu()
    assert torch_dot_ffi.calls() > calls
    assert torch.equal(got, fn(x, w, b))  # CPU PyTorch's bfloat16 matmul (oneDNN), its bits
    exact = fn(x.double(), w.double(), b.double()).bfloat16().double()
    assert (got.double() != exact).float().mean() < 0.01  # float32 sums, one rounding


def test_bfloat16_dots_in_compiled_graphs_are_cpu_pytorchs() -> None:
    x, w, b = _bf16_operands()
    lin = torch.nn.Linear(K, N).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
        expected = lin(x)
        got = torch.compile(lin.to("tpu"), backend="tpu")(x.to("tpu")).cpu()
    assert torch.equal(got, expected)


def test_small_dots_stay_with_xla() -> None:
    x, w = torch.randn(8, 16).bfloat16(), torch.randn(16, 8).bfloat16()
    calls = torch_dot_ffi.calls()
    torch.testing.assert_close((x.to("tpu") @ w.to("tpu")).cpu(), x @ w)
    assert torch_dot_ffi.calls() == calls


def test_replaced_lowering_is_honoured() -> None:
    """hooks.override_lowerings (the sweep's canary) must reach eager dots: PyTorch's path steps aside."""
    x, w, b = _bf16_operands()

    def replace(op, fn):  # noqa: ANN001, ANN202
        if op is aten.addmm.default:
            return lambda *a, **k: fn(*a, **k) * 3
        return None

    with hooks.override_lowerings(replace):
        got = torch.nn.functional.linear(x.to("tpu"), w.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(got, 3 * torch.nn.functional.linear(x, w, b))


def test_lowering_emits_the_custom_call_and_differentiates() -> None:
    from hf_tpu import lowering, runtime

    jax = runtime.jax()
    jnp = jax.numpy
    mm = lowering.find(aten.mm.default)
    x, y = jnp.ones((M, K), jnp.bfloat16), jnp.ones((N, K), jnp.bfloat16)
    text = jax.jit(lambda a, b: mm(a, b.T)).lower(x, y).as_text()
    assert "custom_call @hf_tpu_torch_mm" in text and "stablehlo.transpose" not in text  # the weight as stored
    # a transpose of a transpose is the weight as stored (a backward's t(t(w))): no copy either
    twice = jax.jit(lambda a, b: mm(a, jnp.swapaxes(b.T, 0, 1).T)).lower(x, y).as_text()
    assert "custom_call @hf_tpu_torch_mm" in twice and "stablehlo.transpose" not in twice
    small = jax.jit(lambda a, b: mm(a, b)).lower(jnp.ones((4, 4), jnp.bfloat16), jnp.ones((4, 4), jnp.bfloat16))
    assert "custom_call" not in small.as_text()
    # jax.vjp through the lowering (backward_lowerings traces forward lowerings under it)
    out, pull = jax.vjp(lambda a: mm(a, y.T), x)
    (gx,) = pull(jnp.ones_like(out))
    assert jnp.allclose(gx.astype(jnp.float32), (jnp.ones((M, N), jnp.float32) @ y.astype(jnp.float32)))


CACHE_CHILD = r"""
import hashlib, json, torch, hf_tpu
from hf_tpu import executable_cache, op_jit
torch.manual_seed(0)
x, w = torch.randn(64, 256).bfloat16(), torch.randn(512, 256).bfloat16()
out = (x.to("tpu") @ w.to("tpu").t()).cpu()
print(json.dumps({"traces": op_jit.traces, "stats": executable_cache.stats(), "same": torch.equal(out, x @ w.t()),
                  "bits": hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest()}))
"""


def test_programs_calling_the_handlers_are_saved_and_load_in_a_new_process(tmp_path: Path) -> None:
    env = {**os.environ, "HF_TPU_CACHE_DIR": str(tmp_path), "HF_TPU_EXECUTABLE_CACHE": "1",
           "PYTHONPATH": str(ROOT)}
    env.pop("HF_TPU_DISABLE_DISK_CACHE", None)

    def run() -> dict:
        r = subprocess.run([sys.executable, "-c", CACHE_CHILD], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["same"] and cold["stats"]["saved"] >= 1 and cold["stats"]["unsaveable"] == 0, cold
    warm = run()  # the handlers are registered before the saved executable is loaded (else: SIGSEGV)
    assert warm["traces"] == 0 and warm["stats"]["hits"] == cold["stats"]["saved"], warm
    assert warm["same"] and warm["bits"] == cold["bits"]
