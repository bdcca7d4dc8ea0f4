"""TorchTPU's `torch.compile(..., backend="tpu", options={...})` options, checked as torch_tpu checks them.

async_compile: accepted (JAX compiles at the first call either way; the results are the same).
num_dynamic_buckets (1-8), bucket_size (> 0): the buckets of bounded dynamic shapes.
serializable (default True): False asks for freshly compiled programs, so the graph cache is skipped.
debug_callback: a callable; the graph cache is skipped so that there is a compile to report.
Other keys (e.g. custom_module_name, name) are accepted, as torch_tpu does."""

from __future__ import annotations

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
