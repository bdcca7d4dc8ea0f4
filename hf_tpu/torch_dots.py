"""Eager mode's large float dots through PyTorch's CPU matmul, on the JAX arrays themselves (DLPack, no copy), with
HF_TPU_TORCH_DOTS_EAGER=dlpack (by default eager dots call PyTorch from inside their programs: ENABLED below).

Where the stand-in runs on XLA:CPU, a large `mm` / `addmm` / `bmm` of float32 or bfloat16 tensors is computed
by `torch.mm` (`addmm`, `bmm`) on CPU tensors that view the operands' JAX buffers, and the result, a CPU tensor,
becomes the output's JAX array without a copy. Why: XLA:CPU's dot (YNNPACK) is no faster than oneDNN/MKL's on
the same core, but runs most of an M=64 layer dot on the calling thread where PyTorch splits it over its
intra-op threads; measured on GPT-2's layer shapes torch's matmul took 0.42-0.51x of XLA's time on the same
buffers (issue 31's note). Results are then CPU PyTorch's own: the oracle's bits at "highest".

Precision is the stand-in's (precision.py), on every host: "highest" multiplies float32 in float32, and PyTorch is
called with its CPU float32 matmuls as in the oracle (precision.cpu_reference's matmul switches: on an AMX-BF16
host torch's own "medium" would make them bfloat16), so the result is the oracle's bits; "medium" rounds both
float32 operands to bfloat16 first, then multiplies in float32 (the same switches); bfloat16 operands go to
PyTorch's bfloat16 matmul (oneDNN: float32 sums, one rounding, as precision.wide_accumulation_matmul; CPU
PyTorch's own bits). "high" (three bfloat16 passes) stays with XLA.

Which dots: bfloat16 (float32 too with HF_TPU_TORCH_DOTS=all; the measured rule is torch_dot_ffi's), every
operand a tpu tensor of one device and one dtype, at least torch_dot_ffi.MIN_MACS multiply-adds
(HF_TPU_TORCH_DOT_MACS): below it XLA's program is as fast and keeps the asynchronous dispatch. Not in fused mode
(the dot is a node of the fused program there, a custom call into PyTorch: torch_dot_ffi.py), nor under
hooks.override_lowerings (a replaced lowering must run), nor with several tpu devices. HF_TPU_TORCH_DOTS=0 turns
it off. Everything else goes on to the op's lowering (eager_functional.run_functional), as before.

An operand that is a view is read through its strides, as CPU's tensor would be; but a tpu tensor's
`.contiguous()` of a view is the view itself (tpu tensors report themselves contiguous) where CPU copies, and
PyTorch's GEMM may then round such a dot differently in the last place (another layout, the same values).

The arrays may still be being computed (JAX's asynchronous dispatch): each is waited for before PyTorch reads
it. The result's memory belongs to PyTorch's CPU allocator; JAX keeps the tensor alive while the array lives,
and a program that takes the array as a donated buffer gets a new one from XLA:CPU (memory XLA does not own is
never donated; host_copy.from_cpu adopts host memory the same way).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from hf_tpu import devices, fused, precision, runtime, torch_dot_ffi
from hf_tpu import tensor as T
from hf_tpu.eager_functional import _own_lowerings, run_functional
from hf_tpu.op_registry import lowers

aten = torch.ops.aten

# Used when HF_TPU_TORCH_DOTS_EAGER=dlpack. By default ("program") an eager dot is a one-op program whose dot is
# the custom call into PyTorch (torch_dot_ffi), dispatched asynchronously like every other program: measured on
# GPT-2's bfloat16 training step, eager, two rounds each alternating, loaded machine
# (benchmarks/finetune_step.py --modes tpu): program 2.00/2.07 CPU-s and 5.27/5.85 s per step, DLPack here
# 2.14/2.16 CPU-s and 6.30/6.68 s (it waits for its operands: the main thread stalls at every dot).
# HF_TPU_TORCH_DOTS (torch_dot_ffi: which dtypes, from what size) applies here too.
ENABLED = torch_dot_ffi.ENABLED and os.environ.get("HF_TPU_TORCH_DOTS_EAGER", "program") == "dlpack"
_DTYPES = tuple(getattr(torch, name) for name in torch_dot_ffi.DTYPES)
calls = 0  # dots computed by PyTorch in this process (tests read it)


@functools.cache
def _on_host() -> bool:
    """The stand-in runs on the host CPU (XLA:CPU): PyTorch can read its buffers in place."""
    return runtime.platform() == "cpu"


def _host_view(t: torch.Tensor) -> torch.Tensor | None:
    """A CPU tensor sharing the memory of tpu tensor `t`'s JAX buffer, with t's values (its view geometry as
    strides), or None when the geometry has no strided form (then XLA's path takes the op)."""
    p = T.payload(t)
    shape = tuple(t.shape)
    if p.view is None:
        a = p.buf.array
        a.block_until_ready()  # JAX's dispatch is asynchronous: the array may still be being computed
        h = torch.from_dlpack(a)
        return h if a.shape == shape else h.view(shape)
    if len(p.view) != 1:
        return None
    sizes, strides, offset = p.view[0]
    if any(s < 0 for s in strides) or tuple(sizes) != shape:
        return None
    a = p.buf.array
    a.block_until_ready()
    return torch.from_dlpack(a).view(-1).as_strided(sizes, strides, offset)


def _macs(op: Any, args: tuple) -> int:
    if op is aten.addmm.default:
        x, y = args[1], args[2]
    else:
        x, y = args[0], args[1]
    if x.dim() != y.dim() or x.dim() not in (2, 3):
        return 0
    batch = x.shape[0] if x.dim() == 3 else 1
    return batch * x.shape[-2] * x.shape[-1] * y.shape[-1]


def _eligible(op: Any, args: tuple, kwargs: dict) -> bool:
    if not ENABLED or fused.ACTIVE or devices.MULTI or not _on_host() or not _own_lowerings():
        return False
    if kwargs and (op is not aten.addmm.default or set(kwargs) - {"beta", "alpha"}):
        return False
    dtype = args[0].dtype if isinstance(args[0], torch.Tensor) else None
    if dtype not in _DTYPES:
        return False
    for a in args:
        if not isinstance(a, torch.Tensor) or a.dtype != dtype or a.is_cpu:
            return False
    if dtype == torch.float32 and precision.current() == "high":
        return False
    return _macs(op, args) >= torch_dot_ffi.MIN_MACS


def _rounded(h: torch.Tensor) -> torch.Tensor:
    # "medium": the operand rounded to bfloat16 (round to nearest even, as XLA's convert), then used in float32
    return h.to(torch.bfloat16).to(torch.float32)


class _Float32Reference:
    """PyTorch's CPU float32 matmuls as the oracle's (precision.cpu_reference) within the block: oneDNN's matmul
    leaf at IEEE (on an AMX-BF16 host torch's "medium" makes it bfloat16) and oneDNN off (its float32 bmm
    rounds differently from ATen's); restored after, and each touched only when it is not so already. Only the
    matmul leaf is read (the legacy getter raises once the user mixed the legacy and new APIs)."""

    __slots__ = ("leaf", "mkldnn")

    def __enter__(self) -> None:
        self.leaf = torch._C._get_fp32_precision_getter("mkldnn", "matmul")
        self.mkldnn = torch._C._get_mkldnn_enabled()
        if self.leaf not in ("ieee", "none"):  # "none": inherited, IEEE unless the legacy setter said otherwise
            torch._C._set_fp32_precision_setter("mkldnn", "matmul", "ieee")
        if self.mkldnn:
            torch._C._set_mkldnn_enabled(False)

    def __exit__(self, *exc: Any) -> None:
        if self.mkldnn:
            torch._C._set_mkldnn_enabled(True)
        if self.leaf not in ("ieee", "none"):
            torch._C._set_fp32_precision_setter("mkldnn", "matmul", self.leaf)


def _torch_dot(op: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The op computed by PyTorch on host views of its operands, as a new tpu tensor; None when an operand
    has no host view."""
    global calls
    views = [_host_view(a) for a in args]
    if any(v is None for v in views):
        return None
    dtype = args[0].dtype
    if dtype == torch.float32 and precision.current() == "medium":
        first = 1 if op is aten.addmm.default else 0  # addmm's bias is added in float32, not rounded
        views = [v if i < first else _rounded(v) for i, v in enumerate(views)]
    if torch.is_autocast_enabled("cpu"):  # these are CPU tensors: the user's CPU autocast must not recast them
        with torch.autocast("cpu", enabled=False):
            out = _call(op, views, kwargs, dtype)
    else:
        out = _call(op, views, kwargs, dtype)
    calls += 1
    return T.wrap(runtime.jax().dlpack.from_dlpack(out), dtype)


def _call(op: Any, views: list[torch.Tensor], kwargs: dict, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        with _Float32Reference():
            return op(*views, **kwargs)
    return op(*views, **kwargs)  # bfloat16: oneDNN's kernels (AMX where the host has it), float32 sums


def _kernel(op: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        if _eligible(op, args, kwargs):
            out = _torch_dot(op, args, kwargs)
            if out is not None:
                return out
        return run_functional(op, args, kwargs)

    run.__name__ = run.__qualname__ = f"torch_{op.__name__.split('.')[0]}"
    run.__doc__ = f"{op.__name__}: a large float dot by PyTorch's CPU matmul on the JAX buffers, else its lowering"
    return run


for _op in (aten.mm.default, aten.addmm.default, aten.bmm.default):
    lowers(_op, kind="eager")(_kernel(_op))
