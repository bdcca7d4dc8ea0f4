"""Large float dots inside XLA:CPU programs as a call into PyTorch's CPU matmul (an XLA FFI custom call); and,
through the same handler library, log_softmax over long rows and its backward (LONG_ROW) and the fused Adam(W)
step (fused_adam), at the end.

A compiled graph (torch.compile(backend="tpu")), a fused-mode graph or an eager op's program is one XLA program;
its dots are XLA:CPU's own (YNNPACK), which on the 2-core host of issue 31 ran each M=64 layer dot mostly on
one thread where PyTorch's matmul (MKL / oneDNN) splits it over its intra-op threads. Here the lowering of mm,
bmm, addmm, matmul and linear emits, for bfloat16 operands (float32 too with HF_TPU_TORCH_DOTS=all: DTYPES)
and at least MIN_MACS multiply-adds, a custom call whose handler (native/torch_dot.cpp) runs at::mm / at::bmm / at::addmm on XLA's
buffers (no copies; a transposed operand is passed as stored with a flag, so XLA copies no weight). The
stand-in's precision is applied to the operands first, as for XLA's own dot (precision.round_args), and the
handler multiplies float32 at IEEE precision on every host; bfloat16 operands give PyTorch's bfloat16 matmul
(float32 sums, one rounding, as precision.wide_accumulation_matmul).

The handler library is built once per machine with torch.utils.cpp_extension.load (next to the device's C++
hooks, native/__init__.py) against the installed torch and jaxlib's XLA FFI headers (jax.ffi.include_dir()),
and registered with XLA when first needed, before any saved executable is loaded (executable_cache asks
`ensure()` for the targets an entry records). Without a compiler, on another platform, or with
HF_TPU_TORCH_DOTS=0 the lowerings keep XLA's dot.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from hf_tpu import executable_cache, runtime

SOURCE = Path(__file__).with_name("native") / "torch_dot.cpp"
SOURCES = (SOURCE, SOURCE.with_name("packed_dot.cpp"))  # packed_dot.cpp: packed_weights.py's handlers
TARGETS = ("hf_tpu_torch_mm", "hf_tpu_torch_addmm", "hf_tpu_torch_log_softmax", "hf_tpu_torch_log_softmax_backward",
           "hf_tpu_torch_fused_adam", "hf_tpu_packed_mm", "hf_tpu_packed_addmm")
# Which dots go to PyTorch (in eager op programs, fused and compiled graphs alike), by HF_TPU_TORCH_DOTS: "1" (the default)
# bfloat16 ones, "all" float32 ones too, "0" none. Measured on this 2-core AMX-BF16 host
# (benchmarks/torch_dots_bench.py, the fastest of many calls, so the nearest to a quiet machine): bfloat16
# dots take 0.2-0.9x XLA's wall time and 0.3-0.5x its CPU time at GPT-2's training shapes (oneDNN's AMX kernel
# against YNNPACK's); float32 ones at M=64 gain nothing where it counts, so float32 stays XLA's unless asked
# for. Per dot with the weight as models hold it ((N, K), nn.Linear and tied LM heads: torch_dots_bench.py
# --weight nk), a quiet moment: torch 1.00-1.05x XLA's wall at GPT-2's shapes, 1.19x at Qwen3's LM head (XLA's
# YNNPACK is slower only with a (K, N) weight: the LM head 0.77x). In the compiled forward, paired in one
# process: GPT-2 with every float32 dot through torch 1.01x wall, 0.99x CPU-s; Qwen3-wide 1.14x, 1.23x; beside
# a second busy process worse in every round (MKL's OpenMP splits each dot statically over two threads, one
# team per XLA thread calling it, where YNNPACK's tasks rebalance when a core is taken).
_SETTING = os.environ.get("HF_TPU_TORCH_DOTS", "1")
ENABLED = _SETTING != "0"
DTYPES = ("bfloat16", "float32") if _SETTING == "all" else ("bfloat16",)
# Multiply-adds from which a dot goes to PyTorch: below it XLA's own dot costs as little (the handler's call
# and PyTorch's threads are not free). An eager path on DLPack views of the JAX buffers was measured slower
# (it waits for its operands at every dot; ~80 CPU-us of exchange per call) and removed.
MIN_MACS = int(os.environ.get("HF_TPU_TORCH_DOT_MACS", str(1 << 22)))
_lock = threading.Lock()
_state: dict[str, Any] = {"registered": False, "reason": "not loaded yet"}


def _module_name() -> str:
    import torch

    h = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES))
    h.update(f"{torch.__version__}|{runtime.jax().__version__}|{sys.version}|{sys.platform}".encode())
    return f"hf_tpu_torch_dot_{h.hexdigest()[:12]}"


def _load() -> ctypes.CDLL:
    from torch.utils import cpp_extension

    name = _module_name()
    directory = runtime.native_build_dir() / name
    path, done = directory / f"{name}.so", directory / "built"
    if not done.exists():
        directory.mkdir(parents=True, exist_ok=True)
        print(f"hf_tpu: building the torch-dot XLA handlers once for this machine into {directory} ...",
              file=sys.stderr, flush=True)
        cpp_extension.load(name=name, sources=[str(src) for src in SOURCES], build_directory=str(directory),
                           extra_cflags=["-O2"], extra_include_paths=[runtime.jax().ffi.include_dir()],
                           extra_ldflags=["-ldl"],  # packed_dot.cpp's dlopen/dlsym (in libc from glibc 2.34)
                           is_python_module=False, verbose=False)
        done.write_text("ok\n")
    return ctypes.CDLL(str(path))


def ensure() -> bool:
    """The handlers built, loaded and registered with XLA:CPU (once per process); False when they cannot be
    (then the lowerings keep XLA's dot; the reason is in status())."""
    if _state["registered"]:
        return True
    if not ENABLED or runtime.platform() != "cpu":
        _state["reason"] = "HF_TPU_TORCH_DOTS=0" if not ENABLED else f"platform {runtime.platform()}"
        return False
    with _lock:
        if _state["registered"]:
            return True
        if _state.get("failed"):
            return False
        try:
            jax = runtime.jax()
            lib = _load()
            for target in TARGETS:
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)), platform="cpu")
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers: XLA's dots, with a warning
            _state.update(failed=True, reason=f"{type(exc).__name__}: {exc}")
            warnings.warn("hf_tpu: could not build or load the torch-dot XLA handlers ("
                          + _state["reason"].splitlines()[0] + "); large dots stay XLA's. Install g++ and ninja, or "
                          "set HF_TPU_TORCH_DOTS=0 to silence this.", RuntimeWarning, stacklevel=2)
            return False
        _state.update(registered=True, reason="", lib=lib)
        return True


def library() -> ctypes.CDLL | None:
    """The loaded handler library (its C entry points), or None when it cannot be loaded (see ensure)."""
    return _state["lib"] if ensure() else None


def status() -> dict[str, Any]:
    return {k: v for k, v in _state.items() if k != "lib"}


def calls(kind: str = "dot") -> int:
    """Dots (kind "dot"), log_softmax forwards and backwards ("log_softmax") or Adam(W) steps ("fused_adam")
    the handlers computed in this process so far (0 before they are loaded)."""
    lib = _state.get("lib")
    if lib is None:
        return 0
    fn = getattr(lib, f"hf_tpu_torch_{kind}_calls")
    fn.restype = ctypes.c_int64
    return int(fn())


executable_cache.register_targets(TARGETS, ensure)


# ----------------------------------------------------------------------------------------------- lowering
def _source(a: Any) -> tuple[Any, int]:
    """(what to pass, transposed flag): the source of traced last-two-dims transposes, so the handler reads it
    as stored (precision._transposed_from: a `weight.t()` view, a compiled graph's permute node), else `a`.
    Looks through a chain of them: a backward's `t(t(weight))` is the weight itself (a tied LM head's gradient
    dot: XLA copied Qwen3's 151,936 x 1,024 bfloat16 weight transposed, 0.17 s a step)."""
    from hf_tpu import precision

    flag = 0
    while (src := precision._transposed_from(a)) is not None:
        a, flag = src, 1 - flag
    return a, flag


def _dot(lhs: Any, rhs: Any, tl: int, tr: int, bias: Any, beta: float, alpha: float) -> Any:
    """lhs @ rhs (each transposed first where flagged; 2-D, or 3-D with equal batch) [beta * bias + alpha *
    (lhs @ rhs)], through the handler."""
    import numpy as np

    jax = runtime.jax()
    m = lhs.shape[-1] if tl else lhs.shape[-2]
    n = rhs.shape[-2] if tr else rhs.shape[-1]
    out = jax.ShapeDtypeStruct((*lhs.shape[:-2], m, n), lhs.dtype)
    flags = dict(transpose_lhs=np.int64(tl), transpose_rhs=np.int64(tr))
    if bias is None:
        return jax.ffi.ffi_call("hf_tpu_torch_mm", out)(lhs, rhs, **flags)
    return jax.ffi.ffi_call("hf_tpu_torch_addmm", out)(bias, lhs, rhs, beta=np.float64(beta),
                                                        alpha=np.float64(alpha), **flags)


@functools.cache
def _differentiable() -> Any:
    """_dot with JAX's own dot as its VJP: a lowering traced under jax.vjp (backward_lowerings) must not meet
    an FFI call without a derivative rule."""
    jax = runtime.jax()
    jnp = jax.numpy

    def reference(lhs: Any, rhs: Any, bias: Any, tl: int, tr: int, beta: float, alpha: float) -> Any:
        x = jnp.swapaxes(lhs, -1, -2) if tl else lhs
        y = jnp.swapaxes(rhs, -1, -2) if tr else rhs
        prod = jnp.matmul(x, y, preferred_element_type=jnp.float32)
        if bias is not None:
            prod = beta * bias.astype(jnp.float32) + alpha * prod
        return prod.astype(lhs.dtype)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
    def dot(lhs: Any, rhs: Any, bias: Any, tl: int, tr: int, beta: float, alpha: float) -> Any:
        return _dot(lhs, rhs, tl, tr, bias, beta, alpha)

    def fwd(lhs: Any, rhs: Any, bias: Any, tl: int, tr: int, beta: float, alpha: float) -> Any:
        return _dot(lhs, rhs, tl, tr, bias, beta, alpha), (lhs, rhs, bias)

    def bwd(tl: int, tr: int, beta: float, alpha: float, saved: Any, g: Any) -> Any:
        lhs, rhs, bias = saved
        return jax.vjp(lambda a, b, c: reference(a, b, c, tl, tr, beta, alpha), lhs, rhs, bias)[1](g)

    dot.defvjp(fwd, bwd)
    return dot


OPS = frozenset({"mm", "bmm", "addmm", "matmul", "linear"})


def _operands(name: str, args: tuple, kwargs: dict) -> tuple[Any, Any, int, Any, float, float] | None:
    """(x, y or its source, y transposed flag, bias, beta, alpha) of the op's call, or None."""
    if name == "addmm":
        if len(args) != 3 or set(kwargs) - {"beta", "alpha"}:
            return None
        bias, x, y = args
        beta, alpha = kwargs.get("beta", 1.0), kwargs.get("alpha", 1.0)
        if type(beta) not in (int, float) or type(alpha) not in (int, float):
            return None
        return (x, *_source(y), bias, float(beta), float(alpha))
    if name == "linear":
        if kwargs or len(args) not in (2, 3) or getattr(args[1], "ndim", 0) != 2:
            return None
        return args[0], args[1], 1, (args[2] if len(args) == 3 else None), 1.0, 1.0  # x @ w.T + b, w as stored
    if kwargs or len(args) != 2:
        return None
    return (args[0], *_source(args[1]), None, 1.0, 1.0)


def lowered(name: str, args: tuple, kwargs: dict, prec: str) -> Any:
    """The op's result through PyTorch's matmul, at matmul precision `prec` (applied to the operands here, after
    transposes are looked through), or None when the op, its shapes or dtypes are not ones this takes (the
    caller then runs XLA's dot)."""
    from hf_tpu import precision

    if not ENABLED or name not in OPS:
        return None
    got = _operands(name, args, kwargs)
    if got is None:
        return None
    x, y, tr, bias, beta, alpha = got
    dtype = getattr(x, "dtype", None)
    if dtype is None or dtype.name not in DTYPES or getattr(y, "dtype", None) != dtype \
            or (bias is not None and getattr(bias, "dtype", None) != dtype):
        return None
    lead = None
    if x.ndim >= 3 and y.ndim == 2 and name in ("matmul", "linear"):  # rows of every batch: one 2-D dot
        lead, x = x.shape[:-1], x.reshape(-1, x.shape[-1])
    x, tl = _source(x)
    if not ((x.ndim == 2 and y.ndim == 2) or (x.ndim == 3 and y.ndim == 3 and x.shape[0] == y.shape[0])):
        return None
    m, k = (x.shape[-1], x.shape[-2]) if tl else (x.shape[-2], x.shape[-1])
    k2, n = (y.shape[-1], y.shape[-2]) if tr else (y.shape[-2], y.shape[-1])
    if k != k2 or (bias is not None and x.ndim != 2):
        return None
    if m * k * n * (x.shape[0] if x.ndim == 3 else 1) < MIN_MACS or not ensure():
        return None
    x, y = precision.round_operand(x, prec), precision.round_operand(y, prec)  # a bias is added in float32
    out = _differentiable()(x, y, bias, tl, tr, beta, alpha)
    return out if lead is None else out.reshape(*lead, out.shape[-1])


# ------------------------------------------------------------------------------------ log_softmax, long rows
# Rows longer than this take PyTorch's log_softmax and its backward (HF_TPU_TORCH_LOG_SOFTMAX_ROW). XLA:CPU
# reduces exp(x) over a row of more than 32,768 elements on one thread and ~10x slower per element than over
# shorter ones (measured on this 2-core host, exp-sum over 26M float32 elements: rows of 32,768 4.2 ms, of
# 50,257 (GPT-2's vocabulary) 44 ms, of 65,536 39 ms); a language model's cross-entropy reduces over its
# vocabulary twice per training step (Qwen3's 151,936: ~0.3 s of a 1.7 s compiled step).
LONG_ROW = int(os.environ.get("HF_TPU_TORCH_LOG_SOFTMAX_ROW", str(1 << 15)))


def _takes_rows(x: Any, dim: int) -> bool:
    return (ENABLED and getattr(x, "dtype", None) is not None and x.dtype.name == "float32" and x.ndim >= 1
            and dim % x.ndim == x.ndim - 1 and x.shape[-1] > LONG_ROW and ensure())


def _log_softmax_backward_call(grad: Any, out: Any) -> Any:
    jax = runtime.jax()
    return jax.ffi.ffi_call("hf_tpu_torch_log_softmax_backward", jax.ShapeDtypeStruct(out.shape, out.dtype))(
        grad, out)


@functools.cache
def _differentiable_log_softmax() -> Any:
    """The handler's log_softmax with the handler's backward as its VJP (a lowering traced under jax.vjp by
    backward_lowerings must not meet an FFI call without a derivative rule)."""
    jax = runtime.jax()

    def call(x: Any) -> Any:
        return jax.ffi.ffi_call("hf_tpu_torch_log_softmax", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    @jax.custom_vjp
    def log_softmax(x: Any) -> Any:
        return call(x)

    def fwd(x: Any) -> Any:
        out = call(x)
        return out, out

    def bwd(out: Any, g: Any) -> Any:
        return (_log_softmax_backward_call(g, out),)

    log_softmax.defvjp(fwd, bwd)
    return log_softmax


def log_softmax(x: Any, dim: int) -> Any | None:
    """log_softmax of a float32 array over its last dimension `dim` through PyTorch's kernel when its rows are
    longer than LONG_ROW, else None (the caller runs XLA's)."""
    if not _takes_rows(x, dim):
        return None
    return _differentiable_log_softmax()(x)


def log_softmax_backward(grad: Any, out: Any, dim: int) -> Any | None:
    """_log_softmax_backward_data of float32 arrays over the last dimension `dim` through PyTorch's kernel when
    the rows are longer than LONG_ROW, else None."""
    if not (_takes_rows(out, dim) and getattr(grad, "dtype", None) == out.dtype and grad.shape == out.shape):
        return None
    return _log_softmax_backward_call(grad, out)


# ------------------------------------------------------------------------------------------ fused Adam(W)
def fused_adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, state_steps: list, hyper: tuple,
               *, maximize: bool, decoupled: bool) -> tuple[list, list, list] | None:
    """(parameters, first moments, second moments) after one Adam(W) step by PyTorch's fused CPU kernel, in
    place on buffers XLA aliases to the operands (the step program donates them), or None when the lists are
    not all float32 (the caller runs its own lowering). `state_steps`: the counts, already incremented;
    `hyper`: lr, beta1, beta2, weight_decay and eps as 0-d arrays of one float type (the handler reads float64
    or float32).
    XLA:CPU makes one loop per result, each re-reading the gradient and moments (11 array passes where the
    kernel makes 7: a 155M-element AdamW step 149 ms against the kernel's 99, no multi-output loop fusion
    in XLA:CPU); the kernel also gives CPU's own bits."""
    if not ENABLED or not params:
        return None
    lists = (params, grads, exp_avgs, exp_avg_sqs)
    if any(len(ls) != len(params) for ls in lists) or any(
            getattr(a, "dtype", None) is None or a.dtype.name != "float32" for ls in lists for a in ls) or any(
            a.shape != p.shape for ls in lists[1:] for a, p in zip(ls, params, strict=True)) or any(
            getattr(s, "dtype", None) is None or s.dtype.name != "float32" or s.size != 1 for s in state_steps):
        return None
    if not ensure():
        return None
    import numpy as np

    jax = runtime.jax()
    jnp = jax.numpy
    n = len(params)
    operands = [jnp.stack(hyper), *[jnp.asarray(s).reshape(()) for s in state_steps], *params, *grads, *exp_avgs,
                *exp_avg_sqs]
    # results: parameters, first and second moments, each aliased to its operand (1 + n + ...: after hyper)
    aliases = {1 + n + i: i for i in range(n)} | {1 + 3 * n + i: n + i for i in range(n)} | {
        1 + 4 * n + i: 2 * n + i for i in range(n)}
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for ls in (params, exp_avgs, exp_avg_sqs) for a in ls]
    out = jax.ffi.ffi_call("hf_tpu_torch_fused_adam", shapes, input_output_aliases=aliases)(
        *operands, n=np.int64(n), adamw=np.int64(bool(decoupled)), maximize=np.int64(bool(maximize)))
    return list(out[:n]), list(out[n:2 * n]), list(out[2 * n:])
