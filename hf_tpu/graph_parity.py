"""Rewrites that keep torch.compile(backend="tpu")'s results CPU's where PyTorch's tracing machinery changes
the arithmetic or the dtypes for a device that is not CPU (graph_compiler.py calls them):

  refuse_dynamos_addcdiv      -> Dynamo's addcdiv, taken apart into div/mul/add, put back whole
  register_batch_norm_rules   -> batch norm's fake-tensor rule gives CPU's saved-statistics dtypes and shapes
  register_layer_norm_rule    -> layer norm's fake-tensor rule gives CPU's saved-statistics dtypes
  register_sparse_rules       -> the sparse conversions (declared unsupported) graph-break, raising eager's error
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_HALF = (torch.float16, torch.bfloat16)


def refuse_dynamos_addcdiv(gm: torch.fx.GraphModule) -> None:
    """Put back the addcdiv Dynamo took apart. Dynamo traces `torch.addcdiv(x, t1, t2, value=v)` as
    x + (t1 / t2) * v (torch/_dynamo/variables/torch.py, handle_addcdiv), which in float16/bfloat16 rounds
    three times, while CPU's (and eager tpu's) addcdiv computes in float32 and rounds once (363 of 1000
    float16 elements 1 ulp off, compiled only). The three nodes are recognised by their shape and by the
    source line Dynamo records on them naming addcdiv, so the same arithmetic written out by the user keeps
    its three roundings."""
    aten = torch.ops.aten
    for add in list(gm.graph.nodes):
        if add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs:
            continue
        x, mul = add.args
        if not (isinstance(mul, torch.fx.Node) and mul.target is aten.mul.Tensor and len(mul.users) == 1):
            continue
        div, value = mul.args
        if not (isinstance(div, torch.fx.Node) and div.target is aten.div.Tensor and len(div.users) == 1
                and isinstance(value, (int, float)) and not div.kwargs):
            continue
        val = add.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dtype in _HALF):
            continue
        frame = (add.meta.get("stack_trace") or "").rpartition('File "')[2]  # the innermost frame's lines
        if "addcdiv" not in frame.partition("\n")[2]:  # its source line, not the file or function name
            continue
        add.target, add.args, add.kwargs = aten.addcdiv.default, (x, *div.args), {"value": value}
        gm.graph.erase_node(mul)
        gm.graph.erase_node(div)



_BATCH_NORMS = ("native_batch_norm.default", "_native_batch_norm_legit.default", "_native_batch_norm_legit.no_stats",
                "_native_batch_norm_legit_functional.default", "_native_batch_norm_legit_no_training.default",
                "_batch_norm_with_update.default", "_batch_norm_with_update_functional.default")


def _cpu_batch_norm_statistics(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """Batch norm's fake-tensor rule for tpu: the saved statistics (outputs 1 and 2) as CPU's kernel, and the
    eager lowering (batch_norm.batch_norm_train), make them. Fake tensors run PyTorch's decomposition,
    which gives CPU's dtypes only when `input.device.type == "cpu"`: float32 statistics for a half input on
    any other device, and in eval mode the running statistics where CPU returns empty ones. A compiled half
    batch norm then failed ("Cannot cast array data from float16 to float32") or gave float32 statistics.
    The wrapper keeps the decomposition's name and module, so fake tensors still take it as PyTorch's own
    (torch_decomp_decompositions) and other devices see no change."""

    @functools.wraps(decomposition)
    def rule(*args: Any, **kwargs: Any) -> Any:
        out = decomposition(*args, **kwargs)
        x = args[0] if args else kwargs.get("input")
        if not (isinstance(x, torch.Tensor) and x.device.type == "tpu"):
            return out
        name = rule.__dict__["_op_name"]
        if name.endswith("no_training"):
            training = False
        elif name.endswith("no_stats") or name.startswith("_batch_norm_with_update"):  # training forms
            training = True
        else:
            training = bool(args[5] if len(args) > 5 else kwargs.get("training"))
        params = [p for p in args[1:5] if isinstance(p, torch.Tensor)]
        keep = torch.float32 if x.dtype in _HALF and any(p.dtype == torch.float32 for p in params) else x.dtype
        if not training and not name.endswith("no_stats"):
            stats = [x.new_empty((0,), dtype=keep), x.new_empty((0,), dtype=keep)]
        else:
            stats = [out[1].to(keep), out[2].to(keep)]
        return (out[0], *stats, *out[3:])

    return rule


def register_batch_norm_rules() -> None:
    from torch._decomp import decomposition_table

    for name in _BATCH_NORMS:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        fn = decomposition_table.get(op)
        if fn is None or getattr(fn, "_op_name", None):
            continue
        rule = _cpu_batch_norm_statistics(fn)
        rule._op_name = name  # type: ignore[attr-defined]
        decomposition_table[op] = rule


def _layer_norm_statistics_dtype(x: torch.Tensor, weight: torch.Tensor | None) -> torch.dtype:
    """The dtype of native_layer_norm's saved mean and rstd for a half input, as CPU's kernel and the eager
    lowering (half_kernels._native_layer_norm) give them: the weight's when it differs, else the input's."""
    return weight.dtype if weight is not None and weight.dtype != x.dtype else x.dtype


def _cpu_layer_norm_statistics(impl: Callable[..., Any]) -> Callable[..., Any]:
    """native_layer_norm's fake-tensor rule for tpu: PyTorch's (torch._refs.native_layer_norm) keeps the mean
    and rstd of a half input in its dtype only when `input.device.type` is cpu or mtia, float32 elsewhere,
    while the lowering gives CPU's half statistics: a compiled half layer norm returning them failed
    ("Cannot cast array data from dtype(bfloat16) to dtype('float32')"). Other devices see no change."""

    @functools.wraps(impl)
    def rule(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        out = impl(fake_mode, func, *args, **kwargs)
        x = args[0] if args else kwargs.get("input")
        if not (isinstance(x, torch.Tensor) and x.device.type == "tpu" and x.dtype in _HALF):
            return out
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        keep = _layer_norm_statistics_dtype(x, weight)
        with fake_mode:
            return (out[0], out[1].to(keep), out[2].to(keep))

    rule._hf_tpu_rule = True  # type: ignore[attr-defined]
    return rule


def register_layer_norm_rule() -> None:
    from torch._subclasses import fake_impls

    op = torch.ops.aten.native_layer_norm.default
    impl = fake_impls.op_implementations_dict.get(op)
    if impl is not None and not getattr(impl, "_hf_tpu_rule", False):
        fake_impls.op_implementations_dict[op] = _cpu_layer_norm_statistics(impl)


_SPARSE_CONVERSIONS = (torch.ops.aten._to_sparse.default, torch.ops.aten._to_sparse.sparse_dim,
                       torch.ops.aten._to_sparse_csr.default, torch.ops.aten._to_sparse_csc.default,
                       torch.ops.aten._to_sparse_bsr.default, torch.ops.aten._to_sparse_bsc.default)


def _sparse_fake(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Fake-tensor rule of the sparse conversions for tpu tensors: PyTorch has no meta kernel for them, so fake
    tensors fell back to running the op on real tpu tensors made behind the backend's back, and Dynamo failed
    with "RuntimeError when making fake tensor call". Declared unsupported on tpu (docs/device.md), they are a
    graph break instead (UnsupportedOperatorException): the op then runs eagerly and raises eager's
    errors.Unsupported naming it and the alternative."""
    x = args[0] if args else kwargs.get("self")
    if not (isinstance(x, torch.Tensor) and x.device.type == "tpu"):
        return NotImplemented
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    raise UnsupportedOperatorException(func)


def register_sparse_rules() -> None:
    from torch._subclasses import fake_impls

    for op in _SPARSE_CONVERSIONS:
        if op not in fake_impls.op_implementations_dict:
            fake_impls.register_op_impl(op)(_sparse_fake)
