"""`torch.autocast("tpu", dtype=torch.bfloat16 | torch.float16)`: PyTorch's per-op cast policy for tpu.

PyTorch gives every backend an Autocast dispatch key (AutocastPrivateUse1 for `tpu`) but registers kernels
only for its own devices; out-of-tree backends register theirs (a fallthrough for every op plus one casting
kernel per listed op). Without them the first op under autocast raised "Could not run 'aten::linear' with
arguments from the 'Autocasttpu' backend".

The policy is CUDA's (aten/src/ATen/autocast_mode.cpp's AutocastCUDA registrations, which TPU stacks follow
too), with the dtype the user asks for in place of CUDA's float16 default:
- lower_precision_fp: matmuls, convolutions, attention run in the autocast dtype;
- fp32: ops that lose too much in 16 bits (exp, log, norms, losses, upsampling) run in float32;
- fp32_set_opt_dtype: reductions with a `dtype=` argument (softmax, sum, cumsum, ...) get dtype=float32
  unless the caller set one;
- fp32_append_dtype: `norm` without a dtype is redispatched to its overload with dtype=float32;
- promote: ops mixing several float inputs run in the widest of their dtypes.
The table is checked against CUDA's own kernels, run on fake CUDA tensors, by tests/hf_tpu/test_autocast.py.

The kernels are Python and sit above autograd, as PyTorch's do, so the casts are recorded by autograd and
inputs are saved for backward in the low precision; under torch.compile, AOTAutograd traces through them
and the casts become part of the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

KEY = "AutocastPrivateUse1"

# What the C++ kernels exclude (AutocastFunctionality): the op the kernel calls must not be cast again by
# tpu's autocast, nor by CPU's for a CPU scalar tensor among the arguments.
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.AutocastCPU)

LOWER_PRECISION_FP = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# overload without a dtype -> the overload PyTorch redispatches to with dtype=float32 appended
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")
# PyTorch refuses these under autocast (they are unsafe in 16 bits) with its own message
BANNED = {"binary_cross_entropy": (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. Many models use a "
    "sigmoid layer right before the binary cross entropy layer. In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss. "
    "binary_cross_entropy_with_logits and BCEWithLogits are safe to autocast.")}


def policy() -> dict[str, str]:
    """{aten overload name: cast policy} for tpu autocast."""
    table = {n: "lower_precision_fp" for n in LOWER_PRECISION_FP}
    table |= {n: "fp32" for n in FP32}
    table |= {n: "fp32_set_opt_dtype" for n in FP32_SET_OPT_DTYPE}
    table |= {n: "fp32_append_dtype" for n in FP32_APPEND_DTYPE}
    table |= {n: "promote" for n in PROMOTE}
    table |= {n: "banned" for n in BANNED}
    return table


def _eligible(x: Any) -> bool:
    # as at::autocast::is_eligible: a floating tpu tensor other than float64
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "tpu"
            and x.dtype is not torch.float64)


def _cast(dtype: torch.dtype, x: Any) -> Any:
    if _eligible(x):
        return x if x.dtype is dtype else x.to(dtype)
    if isinstance(x, list | tuple) and any(_eligible(v) for v in x):
        return type(x)(_cast(dtype, v) for v in x)
    return x


def _cast_all(dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tuple(_cast(dtype, a) for a in args), {k: _cast(dtype, v) for k, v in kwargs.items()}


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    """The promote policy's dtype, as at::autocast::promote_type: from the autocast dtype, float32 as soon as
    an eligible input is float32; float64 inputs are ignored; an input of the other 16-bit type is an error
    (PyTorch's message)."""
    low = torch.get_autocast_dtype("tpu")
    out = low
    for x in (*args, *kwargs.values()):
        for v in (x if isinstance(x, list | tuple) else (x,)):
            if not _eligible(v):
                continue
            if out is torch.float32 or v.dtype is torch.float32:
                out = torch.float32
            elif not (out is low and v.dtype is low):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return out


def _first_tensor(args: tuple) -> Any:
    return args[0] if args else None


def _kernel(op: Any, how: str, target: Any = None) -> Callable[..., Any]:
    if how == "lower_precision_fp":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                args, kwargs = _cast_all(torch.get_autocast_dtype("tpu"), args, kwargs)
                return op(*args, **kwargs)
    elif how == "fp32":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                args, kwargs = _cast_all(torch.float32, args, kwargs)
                return op(*args, **kwargs)
    elif how == "promote":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                args, kwargs = _cast_all(_widest(args, kwargs), args, kwargs)
                return op(*args, **kwargs)
    elif how == "fp32_set_opt_dtype":
        names = [a.name for a in op._schema.arguments]
        where = names.index("dtype")

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                # only when the first input is eligible: setting dtype on other inputs would change PyTorch's
                # implicit promotion (as at::autocast's firstarg_is_eligible)
                if _eligible(_first_tensor(args)):
                    given = args[where] if len(args) > where else kwargs.get("dtype")
                    if given is None:
                        if len(args) > where:
                            args = (*args[:where], torch.float32, *args[where + 1:])
                        else:
                            kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
    elif how == "fp32_append_dtype":
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                x = _first_tensor(args)
                out = torch.float32 if _eligible(x) else x.dtype
                return target(*args, **kwargs, dtype=out)
    elif how == "banned":
        message = BANNED[op._schema.name.split("::")[1]]

        def kernel(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(message)
    else:
        raise ValueError(f"unknown autocast policy {how!r}")
    kernel.__name__ = f"autocast_{how}_{op.__name__}"
    return kernel


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


_libs: list[torch.library.Library] = []


def install() -> None:
    """Register the fallthrough and the per-op kernels for AutocastPrivateUse1 (once per process)."""
    if _libs:
        return
    from hf_tpu.no_dynamo import never_traced_by_dynamo as _never_traced_by_dynamo

    everything = torch.library.Library("_", "IMPL")  # noqa: TOR901 - held for the process
    # ops not in the table pass through autocast untouched, as on CUDA
    everything.fallback(torch.library.fallthrough_kernel, dispatch_key=KEY)
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    for name, how in policy().items():
        op = _overload(name)
        target = _overload(FP32_APPEND_DTYPE[name]) if how == "fp32_append_dtype" else None
        kernel = _kernel(op, how, target)
        _never_traced_by_dynamo(kernel)
        aten.impl(name, kernel, KEY)
    _libs.extend([everything, aten])

