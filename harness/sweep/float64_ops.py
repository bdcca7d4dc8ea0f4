"""Float64 kernels CPU PyTorch lacks, for the sweep's float64 reference runs only.

`torch._grouped_mm` (what `F.grouped_mm` calls; Transformers' MoE experts run through it:
transformers/integrations/moe.py) has CPU kernels for float32, bfloat16 and float16 only: in float64 it
raises "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double". Every MoE model of the zoo
then had no float64 reference at all, and its rows were judged by allclose at 1e-4 of each tensor's scale
(15 of the full-zoo train run's 29 Transformers eager fail_accuracy rows: AFMoE, Aria, AXK1/2,
BailingHybrid, Beam). Within `kernels()`, a float64 grouped matmul runs as its definition, one matmul per
group, from ordinary differentiable ops, so the backward works too. Only float64 calls are taken over: the
float32 baseline and the device runs are untouched.

Models that cast to float32 by name (Autoformer's attention: `torch.zeros_like(value_states).float()`; RMS
norms that upcast with `.to(torch.float32)`) mean "at least float32": in a float64 reference run such a cast
would mix float32 into float64 ("mat1 and mat2 must have the same dtype") and the entry had no reference at
all. Within `kernels()`, a float64 tensor cast to float32 with `.float()`, `.to(torch.float32)` or
`.type(torch.float32)` stays float64, and so does an integer or boolean tensor cast so (Glm4v's vision
position embedding casts its integer image sizes to float32 for the float64 grid_sample grid: "expected scalar
type Double but found Float"). So does a tensor made with `dtype=torch.float32` (`torch.float`) by a
deterministic factory (zeros, ones, full, arange, tensor, ...): FastSpeech2Conformer's length regulator fills
`torch.zeros(..., dtype=torch.float)` with the encoder's float64 states and hands it to the float64 decoder
("Input type (float) and bias type (double) should be the same"), so no row of it had a reference. Random
factories are left alone (harness/sweep/draws.py draws in float32 whatever the dtype asked for, so that the
reference draws the baseline's numbers), and so is `empty` (draws.py's in-place draws fill a float32 `empty`
buffer, under this mode in the train reference run). And `torch.full` with no dtype and a Python float fill
value (its dtype is then the default one) makes float64: XGLM's attention and Kosmos-2's causal mask fill
`torch.finfo(float64).min` that way ("value cannot be converted to type float without overflow"). Other
factories relying on the default dtype are left alone: their float32 results are cast by the models that make
them, and the default dtype itself would also reach rebuilt models' initialisation and draws.py. Ops that
compute in a dtype asked for by argument (softmax, log_softmax, sum, mean, cumsum, prod with `dtype=float32`)
compute a float64 input in float64 (PPOCRV5's head: `F.softmax(x, dim=2, dtype=torch.float32)`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch._grouped_mm's definition. `offs`: cumulative group ends along the dimension the 2-D operand(s)
    are grouped on (M for 2-D x 3-D, N for 3-D x 2-D, K for 2-D x 2-D); 3-D x 3-D is a batched matmul.
    Rows (or columns) past the last offset are zero."""
    if bias is not None:
        raise NotImplementedError("float64 grouped_mm with a bias")
    ends = [int(e) for e in offs.tolist()] if offs is not None else []
    starts = [0, *ends[:-1]]
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        out = torch.bmm(mat_a, mat_b)
    elif mat_a.dim() == 2 and mat_b.dim() == 3:  # tokens sorted by group: rows s:e use group g's matrix
        parts = [mat_a[s:e] @ mat_b[g] for g, (s, e) in enumerate(zip(starts, ends, strict=True))]
        rest = mat_a.new_zeros(mat_a.shape[0] - (ends[-1] if ends else 0), mat_b.shape[-1])
        out = torch.cat([*parts, rest], 0)
    elif mat_a.dim() == 3 and mat_b.dim() == 2:  # columns s:e of the output use group g's matrix
        parts = [mat_a[g] @ mat_b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends, strict=True))]
        rest = mat_a.new_zeros(mat_a.shape[1], mat_b.shape[-1] - (ends[-1] if ends else 0))
        out = torch.cat([*parts, rest], 1)
    elif mat_a.dim() == 2 and mat_b.dim() == 2:  # the contraction split by group: one output per group
        out = torch.stack([mat_a[:, s:e] @ mat_b[s:e] for s, e in zip(starts, ends, strict=True)])
    else:
        raise ValueError(f"grouped_mm of {mat_a.dim()}-D and {mat_b.dim()}-D operands")
    return out if out_dtype is None else out.to(out_dtype)


class _Float64Kernels(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _TAKEN and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            return grouped_mm(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("dtype") is torch.float32 or _default_float_full(func, args, kwargs):
            kwargs = {**kwargs, "dtype": torch.float64}
        elif func in _DTYPE_ARG and kwargs.get("dtype") is torch.float32 and args and \
                isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            kwargs = {**kwargs, "dtype": torch.float64}
        elif func in _CASTS and args and isinstance(args[0], torch.Tensor) and (
                args[0].dtype == torch.float64 or not (args[0].is_floating_point() or args[0].is_complex())):
            func, args, kwargs = _keep_float64(func, args, kwargs)
        return func(*args, **kwargs)


def _default_float_full(func: Any, args: tuple, kwargs: dict) -> bool:
    """torch.full(size, fill) with no dtype and a Python float fill: PyTorch gives it the default dtype."""
    if func is not torch.full or kwargs.get("dtype") is not None:
        return False
    fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
    return isinstance(fill, float)


def _keep_float64(func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """A cast of a float64 tensor with float32 replaced by float64 (other casts unchanged)."""
    if func is torch.Tensor.float:  # .float(memory_format=...) -> .to(float64, memory_format=...)
        return torch.Tensor.to, (args[0], torch.float64), kwargs
    if kwargs.get("dtype") is torch.float32:
        kwargs = {**kwargs, "dtype": torch.float64}
    # .to(float32), .to(device, float32), .type(float32); dtypes are singletons, and `is` spares tensors' __eq__
    return func, tuple(torch.float64 if a is torch.float32 else a for a in args), kwargs


_CASTS = {torch.Tensor.float, torch.Tensor.to, torch.Tensor.type}
# factories whose float32 result is the rounding of values float64 holds more exactly (not random, not empty)
_FACTORIES = {torch.zeros, torch.ones, torch.full, torch.zeros_like, torch.ones_like, torch.full_like, torch.arange,
              torch.linspace, torch.logspace, torch.eye, torch.tensor, torch.as_tensor, torch.Tensor.new_zeros,
              torch.Tensor.new_ones, torch.Tensor.new_full, torch.Tensor.new_tensor}
# ops computing in the dtype they are asked for: PPOCRV5's head takes `F.softmax(x, dim=2, dtype=torch.float32)`
# of a uniform distribution, whose loss gradient is zero in exact arithmetic; computed in float32 the float64
# run kept float32's rounding residue (1e-29..1e-14) as its "exact" gradients, so none were known null and
# tpu's exact zeros failed every gradient
_DTYPE_ARG = {torch.nn.functional.softmax, torch.nn.functional.log_softmax, torch.softmax, torch.log_softmax,
              torch.Tensor.softmax, torch.Tensor.log_softmax, torch.sum, torch.Tensor.sum, torch.mean,
              torch.Tensor.mean, torch.cumsum, torch.Tensor.cumsum, torch.prod, torch.Tensor.prod}
_TAKEN = {torch._grouped_mm, *([torch.nn.functional.grouped_mm] if hasattr(torch.nn.functional, "grouped_mm")
                               else [])}


@contextlib.contextmanager
def kernels() -> Iterator[None]:
    """Within: float64 calls of the ops above run by their definitions (a float64 reference run)."""
    with _Float64Kernels():
        yield
