"""How hard XLA optimises each program: fast compile for small programs, full optimisation for large ones.

runtime.add_fast_compile_flags() puts FAST_COMPILE_FLAGS (LLVM's optimisation passes and XLA:CPU's fusion
emitters off) in XLA_FLAGS, so they are every program's default: the stand-in compiles thousands of tiny
eager programs, and for them compile time is nearly all the cost. On large arrays the code those flags give
is many times slower (measured on this machine, one program each, XLA defaults vs fast compile: a GELU on
512 x 3072 floats 0.9 vs 24 ms, a layer norm on 512 x 768 0.27 vs 3.7 ms, an add of two 512 x 768 0.21 vs
0.62 ms; dots call the same library kernel either way), and compiling with XLA's defaults costs at most a
few tens of milliseconds more. So the rule, per program:

- torch.compile graphs (graph_compiler.py): always XLA's default optimisation (`full_options()`);
- one eager op's program (op_jit.py: an op's lowering or its decomposition traced as one program): compiled
  with XLA's defaults for calls where an array argument has at least OP_LARGE_ELEMENTS elements
  (HF_TPU_FULL_OPT_OP_ELEMENTS, default 16,384), with the fast-compile defaults otherwise. A real model's
  activations are above it (GPT-2's 64 x 768 at 64 tokens: 49,152), a tiny zoo model's far below. Measured
  on this 2-core host, one program each, fast compile vs XLA's defaults, 64 x 768 floats: layer norm
  150 vs 20 CPU-us per call, tanh 220 vs 21, add 49 vs 14; compiling costs 20 vs 53, 9 vs 23 and 8 vs 24
  CPU-ms. GPT-2's forward runs its 25 layer norms and 25 residual adds at that size: ~5 CPU-ms less per
  forward (paired processes, loaded machine: process CPU 170 -> 166 ms, every round lower), and the extra
  ~25 ms of each of those compiles is repaid within a few dozen forwards (once per machine with the
  executable cache). A tiny Llama (a 1000 x 64 embedding) pays it cold: first training step 1.8 -> 2.0-2.1
  CPU-s. Values: that layer norm fully optimised differs from CPU's in 21,063 of 49,152 elements (24,600
  fast-compiled), mean error against float64 4.2e-8 (4.6e-8);
- every other program (a fused-mode graph, the fused optimizer step, a view's read or write, foreach ops): the
  same with LARGE_ELEMENTS (HF_TPU_FULL_OPT_ELEMENTS, default 65,536: every real weight, and GPT-2's
  64 x 3072 MLP activations at 64 tokens). These programs hold many ops, so a full compile costs more, and a
  tiny model's (its 1000 x 64 embedding of 64,000 elements is below) would pay it cold in every sweep run:
  a tiny Llama's first training step, cold caches, took 1.8 -> 2.2 CPU-s with every program at 16,384.

The overrides are XLA's own defaults for the flags hf-tpu itself added (never for a flag the user set in
XLA_FLAGS), passed per compilation as JAX's `compiler_options`, so nothing changes where the fast-compile
flags are off (HF_TPU_XLA_FAST_COMPILE=0, or an accelerator). Neither setting enables fast-math, but the
two may round a program differently in the last place (AdamW's step: 1 ulp in a few hundred of 77k elements,
measured; tests/hf_tpu/test_xla_options.py holds them within 1e-6), so which side of the limit a call falls
on can change its last bit, never more; a program that must be bit-stable across calls of different sizes
picks one variant for all of them. JAX's persistent cache keys each program by its compile options (and
XLA_FLAGS), so a program cached under one setting is never served for the other; hf-tpu's graph cache holds
ATen graphs, which are lowered and compiled again on load, so it needs no key of its own for this.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from hf_tpu import runtime

LARGE_ELEMENTS = int(os.environ.get("HF_TPU_FULL_OPT_ELEMENTS", str(1 << 16)))
OP_LARGE_ELEMENTS = int(os.environ.get("HF_TPU_FULL_OPT_OP_ELEMENTS", str(1 << 14)))
# XLA's defaults (DebugOptions) for the flags of runtime.FAST_COMPILE_FLAGS
_XLA_DEFAULTS = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}


def full_options() -> dict[str, Any] | None:
    """`compiler_options` undoing the fast-compile flags hf-tpu added (None when it added none)."""
    added = runtime.fast_compile_flags_added()
    opts = {name: value for name, value in _XLA_DEFAULTS.items() if any(f.startswith(f"--{name}=") for f in added)}
    return opts or None


@functools.cache
def fuses_half_multiply_adds() -> bool:
    """Whether XLA:CPU on this host merges float16 steps that are each rounded into one float16 fused
    multiply-add (one rounding) in fully optimised programs. It does where LLVM targets AVX-512 with FP16
    (measured on an AMX-BF16 Xeon: `1 - x * x` written as three rounded float16 steps came out as one
    rounding on 31% of elements; a compiled acos's float16 gradient then left OpInfo's tolerance), not on
    AVX2 hosts, not in fast-compile programs, never for bfloat16. Per-program options cannot stop it, and
    `--xla_cpu_max_isa=AVX2` for the process slows every program, so the lowerings round float16 through
    `reduce_precision` where it happens (lowering_parity.opmath), which LLVM cannot merge. A probe, not a
    CPU-flag test: it follows whatever the installed XLA does. Cached per process (one tiny compile)."""
    import concurrent.futures

    import numpy as np

    jax = runtime.jax()
    jnp = jax.numpy

    def steps(x: Any, xp: Any) -> Any:
        square = (x.astype(xp.float32) * x.astype(xp.float32)).astype(xp.float16)
        negated = (-square.astype(xp.float32)).astype(xp.float16)
        return (negated.astype(xp.float32) + 1).astype(xp.float16)

    x = np.asarray([-0.9502], np.float16)

    def probe() -> bool:
        program = jax.jit(lambda v: steps(v, jnp), compiler_options=full_options())
        return bool(np.asarray(program(x))[0] != steps(x, np)[0])

    # in a thread of its own: the first float16 op is usually met while a program is being traced, and JAX's
    # trace state is per thread (a nested jit takes no compiler options)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(probe).result()


def _has_large(args: tuple | list, limit: int) -> bool:
    for a in args:
        if type(a) is list or type(a) is tuple:
            if _has_large(a, limit):
                return True
        elif getattr(a, "size", 0) >= limit:
            return True
    return False


def _has_tracer(args: tuple | list, tracer: type) -> bool:
    return any(_has_tracer(a, tracer) if type(a) is list or type(a) is tuple else isinstance(a, tracer)
               for a in args)


def _large(args: tuple, limit: int) -> bool:
    """A call to compile fully: one with a large array, and not inside another program being traced (a
    decomposition traced as one program calls its sub-ops' programs on tracers; JAX takes compile options
    only at the top level, and the outer program's own options decide there)."""
    return _has_large(args, limit) and not _has_tracer(args, runtime.jax().core.Tracer)


def jit_full(fn: Callable[..., Any], ident: str | None = None, **jit_kwargs: Any) -> Any:
    """jax.jit(fn) with XLA's default optimisation (a compiled graph). With an `ident` (see jit) and no other
    jit arguments, its executables are shared with other processes through the executable cache."""
    jax = runtime.jax()
    opts = full_options()
    if ident is not None and not any(jit_kwargs.values()):
        from hf_tpu import executable_cache

        if executable_cache.enabled():
            return executable_cache.Program(ident, {"full": (jax.jit(fn, compiler_options=opts), opts)},
                                            lambda args: "full")
    return jax.jit(fn, compiler_options=opts, **jit_kwargs)


def jit(fn: Callable[..., Any], ident: str | None = None, large: int | None = None,
        **jit_kwargs: Any) -> Callable[..., Any]:
    """jax.jit(fn), compiled with XLA's default optimisation for calls with an array of `large` (default
    LARGE_ELEMENTS; OP_LARGE_ELEMENTS for one eager op's program) or more elements among the positional
    arguments (or in a list of them: the optimizer's parameters) and with the fast-compile defaults otherwise
    (the module's rule). With an `ident` (a text that determines `fn`
    completely, see executable_cache.py), executables are shared with other processes through the
    executable cache, which then skips tracing and lowering. `donate_argnums` is the one jit argument the
    cache takes with an ident (it is added to the ident: donation is compiled into the executable)."""
    from hf_tpu import counters

    jax = runtime.jax()
    fast = jax.jit(fn, **jit_kwargs)
    opts = full_options()
    limit = LARGE_ELEMENTS if large is None else large
    ran = counters.program_ran  # every call counts (counters' eager_programs: programs per step)
    if ident is not None and set(jit_kwargs) <= {"donate_argnums"}:
        from hf_tpu import executable_cache

        if executable_cache.enabled():
            if jit_kwargs:
                ident = f"{ident}|donate={executable_cache.stable(jit_kwargs['donate_argnums'])}"
            if opts is None:
                return executable_cache.Program(ident, {"fast": (fast, None)}, lambda args: "fast")
            full = jax.jit(fn, compiler_options=opts, **jit_kwargs)
            return executable_cache.Program(ident, {"fast": (fast, None), "full": (full, opts)},
                                            lambda args: "full" if _has_large(args, limit) else "fast")
    if opts is None:
        def call_fast(*args: Any, **kwargs: Any) -> Any:
            ran()
            return fast(*args, **kwargs)

        call_fast._cache_size = fast._cache_size  # type: ignore[attr-defined]
        call_fast.fast = fast  # type: ignore[attr-defined]
        return call_fast
    full = jax.jit(fn, compiler_options=opts, **jit_kwargs)

    def call(*args: Any, **kwargs: Any) -> Any:
        ran()
        return (full if _large(args, limit) else fast)(*args, **kwargs)

    call._cache_size = lambda: fast._cache_size() + full._cache_size()  # type: ignore[attr-defined]
    call.fast, call.full = fast, full  # type: ignore[attr-defined]
    return call

