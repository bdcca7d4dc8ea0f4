"""`torch.compile(model, backend="tpu")`: TorchDynamo captures the graph, AOTAutograd turns it into
functional ATen (forward and backward), and each graph runs as ONE jitted XLA program through JAX.

Shapes are static: JAX compiles again for each new input shape, and the first use of this backend
turns off Dynamo's automatic dynamic shapes, so `dynamic=None` behaves as `dynamic=False` (pass
`dynamic=True` to get symbolic shapes; their values then become static arguments of the XLA program),
except in frames whose inputs carry mark_dynamic bounds (bounded_frames.py).
A dimension marked with `torch._dynamo.mark_dynamic` (with TorchTPU's bounds and bucket options) gets one
program per bucket instead: bounded.py.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hf_tpu import counters, graph_compiler
# re-exported: the graph compiler lived here
from hf_tpu.graph_compiler import COMPILED_GRAPH, to_jax_function  # noqa: F401


def stats() -> dict[str, Any]:
    """Graphs captured, XLA compilations (jit traces), persistent-cache hits and misses, Dynamo graph
    breaks, and seconds spent in AOTAutograd (`aot_s`) and in tracing plus XLA compilation (`xla_s`).
    `tiers`: hits and misses of the graph cache per tier (memory, host, shared; compile_cache/) and of
    JAX's persistent XLA cache (`xla`, eager per-op programs included), and `aot`: AOTAutograd's cache
    behind Dynamo for graphs with breaks (compile_cache/aot_cache.py)."""
    from torch._dynamo.utils import counters as dynamo_counters

    from hf_tpu import compile_cache
    from hf_tpu.compile_cache import aot_cache

    out = counters.snapshot()
    out["graph_breaks"] = sum(dynamo_counters["graph_break"].values())
    out["tiers"] = {**compile_cache.stats(), "xla": {"hits": out["cache_hits"], "misses": out["cache_misses"]},
                    "aot": aot_cache.stats()}
    return out


def reset_stats() -> None:
    from torch._dynamo.utils import counters as dynamo_counters

    from hf_tpu import compile_cache
    from hf_tpu.compile_cache import aot_cache

    counters.reset()
    dynamo_counters["graph_break"].clear()
    compile_cache.reset_stats()
    aot_cache.reset_stats()


@contextlib.contextmanager
def _memory_format_without_guards() -> Iterator[None]:
    """AOTAutograd records each traced tensor's memory format (proxy_tensor.set_meta ->
    shape_prop._extract_tensor_metadata), and that query guards on backed sizes: a contiguous (2, s) input
    sliced by a constant, x[:, -2:], is contiguous only when s == 2, so the metadata alone pins a dimension the
    user marked dynamic and Dynamo raises ConstraintViolationError. XLM hit it: its length crosses a graph
    break (`.item()`) as a constant, and the resumed frame slices the marked ids by it (CPU with
    backend="aot_eager" raises the same; backend="eager" does not trace with AOTAutograd). Nothing downstream
    reads the recorded format (the graph compiler lowers by shapes), so it is asked size-obliviously: recorded
    when it holds for every size, never guarded."""
    from torch.fx.experimental import _config
    from torch.fx.passes import shape_prop

    query = shape_prop.is_contiguous_for_memory_format_or_false

    def oblivious(a: Any, *, memory_format: Any) -> bool:
        with _config.patch(backed_size_oblivious=True):
            return query(a, memory_format=memory_format)

    shape_prop.is_contiguous_for_memory_format_or_false = oblivious
    try:
        yield
    finally:
        shape_prop.is_contiguous_for_memory_format_or_false = query


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The Dynamo backend registered as "tpu" (entry point `torch_dynamo_backends`)."""
    from functorch.compile import make_boxed_func  # noqa: F401 - ensures functorch is initialised

    from hf_tpu import bounded_frames, compile_options

    bounded_frames.static_shapes_by_default()  # static shapes, but in frames that asked for bounds (XLM)

    # torch.compile(options=...) arrives here: TorchTPU's options are checked and used, not passed on to
    # AOTAutograd (which would drop them with a warning)
    options = compile_options.check(kwargs.pop("options", None))
    if options.get("debug_callback") is not None:
        # TorchTPU hands the callback a TpuCompileDebug; the FX code of the graph is what both have
        import types

        options["debug_callback"](types.SimpleNamespace(
            pre_autograd_fx_code=[gm.code], pre_autograd_fx_readable=[gm.print_readable(print_output=False)]))
    counters.bump("graphs")
    start = time.perf_counter()
    try:
        return _aot(gm, example_inputs, options, **kwargs)
    finally:
        counters.bump_time("aot_s", time.perf_counter() - start)


def _aot(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict, **kwargs: Any) -> Callable[..., Any]:
    """AOTAutograd with hf_tpu's graph compiler for the forward and backward: through AOTAutograd's own cache
    where it applies."""
    from torch._dynamo.backends.common import aot_autograd

    from hf_tpu import backward_pieces, compile_options, unsafe_view_fix
    from hf_tpu.compile_cache import aot_cache

    dynamic = any(isinstance(ex, torch.SymInt) or (isinstance(ex, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in ex.shape)) for ex in example_inputs)
    if aot_cache.enabled() and options["serializable"] and not dynamic:
        # a graph the graph cache could not save (a graph break): AOTAutograd's own cache, which needs
        # the serializable compiler (compile_cache/aot_cache.py); a hit is lowered by today's backend
        from hf_tpu.compile_cache.serializable import serializable_aot_autograd

        with aot_cache.active():
            return serializable_aot_autograd(gm, example_inputs, **kwargs)
    # TorchTPU's bucket options reach the graph compiler (bounded dynamism: bounded.py); as there, graphs
    # with dynamic sizes skip AOTAutograd's cache
    compiler = functools.partial(graph_compiler.compile_graph, options=options)
    with _memory_format_without_guards() if dynamic else contextlib.nullcontext(), unsafe_view_fix.tracing():
        return aot_autograd(fw_compiler=compiler, inference_compiler=functools.partial(compiler, inference=True),
                            bw_compiler=functools.partial(backward_pieces.compile_backward, options=options),
                            decompositions=graph_compiler.decompositions(),
                            partition_fn=compile_options.partition_fn())(
            gm, example_inputs, **kwargs
        )
