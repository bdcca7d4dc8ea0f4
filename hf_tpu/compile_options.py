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
    recomputes cheap ops (casts, views, pointwise) from what is saved or from the inputs. The default
    partitioner saved every intermediate the backward reads, bfloat16 copies of the weights under autocast
    among them, and a compiled backward is one XLA program that frees its saved inputs only when it returns,
    while it allocates the gradients: GPT-2 124M's compiled step (bf16 autocast, 4 x 128) saved 0.89 GB,
    now 0.59 GB (benchmarks/step_memory.py --compiled). Not bit-identical: XLA fuses the recomputed ops
    afresh (losses moved by ~3e-4 of ~9.4 on a 2-layer GPT-2; distance from CPU's losses and gradients
    unchanged, 0.0016 and 0.9% either way). HF_TPU_PARTITIONER=default keeps PyTorch's default partitioner."""
    import os

    from torch._functorch import partitioners

    if os.environ.get("HF_TPU_PARTITIONER") == "default":
        return partitioners.default_partition
    return partitioners.min_cut_rematerialization_partition
