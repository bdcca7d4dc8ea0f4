"""TorchTPU's `torch.compile(..., backend="tpu", options={...})` options, checked as torch_tpu checks them.

async_compile: accepted (JAX compiles at the first call either way; the results are the same).
num_dynamic_buckets (1-8), bucket_size (> 0): the buckets of bounded dynamic shapes.
serializable (default True): False asks for freshly compiled programs, so the graph cache is skipped.
debug_callback: a callable; the graph cache is skipped so that there is a compile to report.
Other keys (e.g. custom_module_name, name) are accepted, as torch_tpu does.

Also here, as a setting of every compiled training graph: partition_fn(), how AOTAutograd splits it into the
forward and backward programs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_DYNAMIC_BUCKETS = 8
KNOWN = ("async_compile", "num_dynamic_buckets", "bucket_size", "serializable", "debug_callback",
         "custom_module_name", "name")


def check(options: dict[str, Any] | None) -> dict[str, Any]:
    """The options with defaults filled in; ValueError/TypeError naming a bad value."""
    options = dict(options or {})
    buckets = options.get("num_dynamic_buckets", 1)
    buckets = 1 if buckets is None else buckets
    if not isinstance(buckets, int) or isinstance(buckets, bool) or not 1 <= buckets <= MAX_DYNAMIC_BUCKETS:
        raise ValueError(f"`num_dynamic_buckets` must be an integer between 1 and {MAX_DYNAMIC_BUCKETS}, got {buckets}")
    size = options.get("bucket_size", 128)
    size = 128 if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"`bucket_size` must be a positive integer, got {size}")
    callback = options.get("debug_callback")
    if callback is not None and not callable(callback):
        raise TypeError("'debug_callback' must be callable")
    return {**options, "num_dynamic_buckets": buckets, "bucket_size": size,
            "async_compile": bool(options.get("async_compile", False)),
            "serializable": bool(options.get("serializable", True))}


def cacheable(options: dict[str, Any] | None) -> bool:
    """Whether a compile with these options may be served from the graph cache."""
    if not options:
        return True
    opts = check(options)
    return opts["serializable"] and opts.get("debug_callback") is None


def partition_fn() -> Callable[..., Any]:
    """How AOTAutograd splits a training graph into its forward and backward programs: PyTorch's min-cut
    rematerialization partitioner (Inductor's), which saves for the backward the fewest bytes it can and
    recomputes cheap ops (casts, views, pointwise) from what is saved or from the inputs, with the narrowing
    casts of parameters always recomputed (min_cut_recomputing_weight_casts). The default
    partitioner saved every intermediate the backward reads, bfloat16 copies of the weights under autocast
    among them, and a compiled backward is one XLA program that frees its saved inputs only when it returns,
    while it allocates the gradients: GPT-2 124M's compiled step (bf16 autocast, 4 x 128) saved 0.89 GB,
    0.59 GB with the min-cut partitioner (benchmarks/step_memory.py --compiled). Not bit-identical: XLA fuses the recomputed ops
    afresh (losses moved by ~3e-4 of ~9.4 on a 2-layer GPT-2; distance from CPU's losses and gradients
    unchanged, 0.0016 and 0.9% either way). HF_TPU_PARTITIONER=default keeps PyTorch's default partitioner,
    HF_TPU_PARTITIONER=min_cut the min-cut one as PyTorch has it."""
    import os

    from torch._functorch import partitioners

    if os.environ.get("HF_TPU_PARTITIONER") == "default":
        return partitioners.default_partition
    if os.environ.get("HF_TPU_PARTITIONER") == "min_cut":
        return partitioners.min_cut_rematerialization_partition
    return min_cut_recomputing_weight_casts


def min_cut_recomputing_weight_casts(joint_module: Any, joint_inputs: Any, **kwargs: Any) -> Any:
    """PyTorch's min-cut partitioner, with every narrowing cast of a parameter (float32 -> bfloat16/float16:
    autocast's copy of a weight for a matmul) recomputed in the backward rather than saved. The min-cut
    partitioner saves such a cast, because the backward's matmul reads it whole ("materialized in backward",
    a bandwidth rule for GPU kernels), though the parameter it comes from is alive anyway: GPT-2 124M's
    forward saved 0.24 GB of bfloat16 weight copies (its saved activations 0.66 GB), all live at the compiled
    backward's peak beside the gradients. Recomputed, a cast is one conversion per weight in the backward
    program, whose buffers XLA reuses layer after layer. The cast is the same conversion of the same values, so
    the backward reads the same bfloat16 weights, but not bit-identical steps: the recomputed weight reaches
    the backward's matmul in the other layout (XLA folds the transpose into the dot), so the GEMM sums in
    another order. Measured (finetune_step.py --modes cpu,tpu-compiled, 3 runs of 2 processes each, quiet,
    alternating with HF_TPU_PARTITIONER=min_cut): peak RSS 3.18-3.27 GB against 3.34-3.38 (CPU 2.87-3.01),
    CPU-seconds per step 1.55-1.65 against 1.56-1.73, largest loss difference from CPU over 5 steps 0.0027
    against 0.0021 (tpu eager's: 0.0040; both bfloat16 autocast noise). Parameters (AOTAutograd's static-lifetime inputs) only: for
    another input, the cut would keep the wider tensor alive instead of the narrower copy."""
    import torch
    from torch._functorch import partitioners
    from torch.utils.checkpoint import CheckpointPolicy

    primals = [n for n in joint_module.graph.nodes if partitioners._is_primal(n)]
    static = {primals[i] for i in (kwargs.get("static_lifetime_input_indices") or ()) if i < len(primals)}
    casts = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)
    for node in joint_module.graph.nodes:
        if node.op != "call_function" or node.target not in casts or not node.args or node.args[0] not in static:
            continue
        src, out = node.args[0].meta.get("val"), node.meta.get("val")
        if (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and out.dtype.is_floating_point
                and out.element_size() < src.element_size() and node.meta.get("recompute") is None):
            node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
    return partitioners.min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
