"""Per-program compile options (hf_tpu/xla_options.py): small programs keep fast compile, large ones and
compiled graphs get XLA's default optimisation; the user's XLA_FLAGS are never overridden; values unchanged."""

import json
import os
import subprocess
import sys

import pytest
import torch

from hf_tpu import op_jit, precision, runtime, xla_options

pytestmark = pytest.mark.skipif(not runtime._cpu_only(), reason="the fast-compile flags are for XLA:CPU only")

# One child process decides every case: full_options() depends only on the environment JAX starts with, and
# add_fast_compile_flags() acts while no JAX backend has started, so the child sets each case's environment,
# adds the flags and reads full_options() (one process, not one per case: each costs a torch + JAX import).
# The last case then runs an op, so the flags are also checked on a backend that really started.
CHILD = """
import json, os, sys
from hf_tpu import runtime, xla_options
base = {k: v for k, v in os.environ.items()}
out = []
for case in json.loads(sys.argv[1]):
    os.environ.clear(); os.environ.update(base); os.environ.update(case)
    runtime.add_fast_compile_flags()
    out.append(xla_options.full_options())
import torch
(torch.ones(2, device="tpu") + 1).cpu()
out.append(xla_options.full_options())
print(json.dumps(out))
"""


def _full_options(*cases: dict[str, str]) -> list[dict | None]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("XLA_FLAGS", "HF_TPU_XLA_FAST_COMPILE", "JAX_PLATFORMS", runtime.FAST_COMPILE_MARK_ENV)}
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], env=base, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_full_options_undo_only_the_flags_hf_tpu_added():
    both = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
    inherited = " ".join(runtime.FAST_COMPILE_FLAGS)
    got = _full_options(
        {"XLA_FLAGS": "--xla_backend_optimization_level=0"},  # the user's own level stays: only ours is undone
        {"HF_TPU_XLA_FAST_COMPILE": "0"},
        # a child process inherits XLA_FLAGS with hf-tpu's flags and the mark naming them: still hf-tpu's
        {"XLA_FLAGS": inherited, runtime.FAST_COMPILE_MARK_ENV: inherited},
        {"XLA_FLAGS": inherited},  # the same flags set by a user (no mark) are the user's
        {},  # nothing set: hf-tpu adds both, and the backend that then starts (an op runs) keeps them
    )
    assert got == [{"xla_cpu_use_fusion_emitters": True}, None, both, None, both, both]


def _program_sizes() -> tuple[int, int]:
    progs = [p for p in op_jit._programs.values() if hasattr(p, "full")]
    return sum(p.fast._cache_size() for p in progs), sum(p.full._cache_size() for p in progs)


def _need_fast_compile() -> None:
    runtime.jax()  # the flags are added when JAX starts
    if xla_options.full_options() is None:
        pytest.skip("fast compile is off in this process")


def test_large_eager_ops_compile_fully_small_ones_fast_and_agree_with_cpu(highest):
    _need_fast_compile()
    torch.manual_seed(0)
    small = torch.randn(16, 64)
    large = torch.randn(2 * xla_options.LARGE_ELEMENTS // 256, 256)
    fast0, full0 = _program_sizes()
    got_small = torch.nn.functional.gelu(small.to("tpu"), approximate="tanh").cpu()
    fast1, full1 = _program_sizes()
    assert fast1 > fast0 and full1 == full0
    got_large = torch.nn.functional.gelu(large.to("tpu"), approximate="tanh").cpu()
    fast2, full2 = _program_sizes()
    assert full2 > full1 and fast2 == fast1
    with precision.cpu_reference():
        want_small = torch.nn.functional.gelu(small, approximate="tanh")
        want_large = torch.nn.functional.gelu(large, approximate="tanh")
    torch.testing.assert_close(got_small, want_small)
    torch.testing.assert_close(got_large, want_large)


def test_one_eager_op_compiles_fully_from_its_own_smaller_limit(highest):
    """An eager op's program is compiled with XLA's defaults from OP_LARGE_ELEMENTS (a real model's 64 x 768
    activations: GPT-2's layer norms ran ~7x slower fast-compiled), a program of many ops only from
    LARGE_ELEMENTS (its full compile costs more)."""
    _need_fast_compile()
    assert xla_options.OP_LARGE_ELEMENTS < xla_options.LARGE_ELEMENTS
    torch.manual_seed(0)
    rows = (xla_options.OP_LARGE_ELEMENTS + xla_options.LARGE_ELEMENTS) // 2 // 256  # between the two limits
    x, w, b = torch.randn(rows, 256), torch.randn(256), torch.randn(256)
    fast0, full0 = _program_sizes()
    got = torch.nn.functional.layer_norm(x.to("tpu"), (256,), w.to("tpu"), b.to("tpu")).cpu()
    fast1, full1 = _program_sizes()
    assert full1 > full0 and fast1 == fast0
    with precision.cpu_reference():
        want = torch.nn.functional.layer_norm(x, (256,), w, b)
    torch.testing.assert_close(got, want)
    jax = runtime.jax()
    several = xla_options.jit(lambda a: (a * 2.0 + 1.0).sum())
    several(jax.numpy.ones((rows, 256), jax.numpy.float32))
    assert several.fast._cache_size() == 1 and several.full._cache_size() == 0


def test_the_same_program_gives_the_same_values_fast_or_fully_optimised():
    """The switch changes how XLA compiles, not what it computes beyond the last place: no fast-math either
    way (the two may round an element differently by an ulp, as AdamW's step does; not by more)."""
    _need_fast_compile()
    jax = runtime.jax()
    jnp = jax.numpy

    def f(x, w):
        h = x @ w
        mu = h.mean(-1, keepdims=True)
        h = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        return jax.nn.gelu(h, approximate=True) + jnp.exp(-h) * jnp.tanh(h)

    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (256, 1024), jnp.float32)
    routed = xla_options.jit(f)
    fast = routed.fast(x, w)
    full = routed.full(x, w)
    assert routed.fast._cache_size() == 1 and routed.full._cache_size() == 1
    torch.testing.assert_close(torch.from_numpy(jax.device_get(full).copy()),
                               torch.from_numpy(jax.device_get(fast).copy()), rtol=1e-6, atol=1e-6)


def test_a_large_call_inside_a_traced_program_uses_the_outer_programs_options():
    """Programs called on tracers (a decomposition traced as one program calls its sub-ops' programs) take
    no compile options of their own: JAX accepts them only at the top level."""
    _need_fast_compile()
    jax = runtime.jax()
    inner = xla_options.jit(lambda a: a * 2.0 + 1.0)
    outer = xla_options.jit(lambda a: inner(a).sum())
    x = jax.numpy.ones((2 * xla_options.LARGE_ELEMENTS,), jax.numpy.float32)
    assert float(outer(x)) == 3.0 * x.size
    assert outer.full._cache_size() == 1 and inner.full._cache_size() == 0


def test_large_eager_ops_run_as_decompositions_agree_with_cpu(highest):
    """native_dropout_backward runs as its decomposition traced as one program (decomposed.py): its sub-ops'
    programs are called on tracers, with a large input too."""
    torch.manual_seed(0)
    grad = torch.randn(4, xla_options.LARGE_ELEMENTS // 2)
    mask = torch.rand(grad.shape) > 0.5
    got = torch.ops.aten.native_dropout_backward(grad.to("tpu"), mask.to("tpu"), 2.0).cpu()
    with precision.cpu_reference():
        want = torch.ops.aten.native_dropout_backward(grad, mask, 2.0)
    torch.testing.assert_close(got, want)
