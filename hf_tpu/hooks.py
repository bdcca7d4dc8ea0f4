"""What a harness or a test may change in a running tpu device, through one door: observe every dispatched
op and every graph torch.compile lowers, override lowerings (cached plans and programs follow), switch launch blocking. Each is a context manager
that restores what it changed; they nest. Nothing here costs an op anything while it is not in use: the
device's kernels call the dispatch function bound at registration, which observe_ops rebinds."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

Dispatch = Callable[[Any, tuple, dict], Any]

# What override_lowerings' `replace` returns for an op that is to have no lowering within the block.
NO_LOWERING: Any = object()


def _bind_dispatch(fn: Dispatch) -> None:
    from hf_tpu import device, dispatch

    dispatch.dispatch = fn  # dispatch's own re-dispatches (in-place views) and sdpa read the module's name
    if device._dispatch is not None:
        device._dispatch = fn


@contextlib.contextmanager
def observe_ops(wrapper: Callable[[Dispatch, Any, tuple, dict], Any]) -> Iterator[None]:
    """Within the block, every op dispatched on tpu runs as `wrapper(dispatch, op, args, kwargs)`: the
    wrapper calls `dispatch(op, args, kwargs)` itself and returns its result (or lets its error through),
    and may record the op, its inputs, its result or its error around that call."""
    from hf_tpu import dispatch

    inner = dispatch.dispatch

    def observed(op: Any, args: tuple, kwargs: dict) -> Any:
        return wrapper(inner, op, args, kwargs)

    _bind_dispatch(observed)
    try:
        yield
    finally:
        _bind_dispatch(inner)


@contextlib.contextmanager
def observe_graphs(wrapper: Callable[..., Any]) -> Iterator[None]:
    """Within the block, each graph the `tpu` backend compiles (torch.compile, the graph cache, AOTAutograd's
    cache) is compiled as `wrapper(compile_graph, gm, example_inputs)`: the wrapper calls
    `compile_graph(gm, example_inputs)` and returns the boxed function it gives (or a wrapper of it)."""
    from hf_tpu import graph_compiler

    inner = graph_compiler.compile_graph

    def observed(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
        # the backend's own options (compile_options.py) go to the real compiler, not to the wrapper
        return wrapper(functools.partial(inner, **options) if options else inner, gm, example_inputs)

    graph_compiler.compile_graph = observed  # read by the backends at each compile
    try:
        yield
    finally:
        graph_compiler.compile_graph = inner


def _forget_compiled_lowerings() -> None:
    """Plans and per-op programs traced from the lowerings in force until now."""
    from hf_tpu import plans

    plans.table.clear()


@contextlib.contextmanager
def override_lowerings(replace: Callable[[Any, Callable[..., Any]], Callable[..., Any] | None]) -> Iterator[None]:
    """Within the block, `op`'s JAX lowering (eager and compiled) is `replace(op, lowering)` where that is not
    None (NO_LOWERING: the op has none, as if torchax lacked it). `replace` is called once per op (its answer
    is kept), so the lowering it returns is one object and programs traced from it are reused. Plans made
    before the block, and the ones made inside it, are forgotten on entry and on exit, so neither side runs
    the other's lowerings (eager mode's fast path does not look the lowering up again: this is the only
    way to change one at run time); compile a model inside the block for its graphs to use the override."""
    from hf_tpu import lowering

    original = lowering.find

    @functools.cache
    def find(op: Any) -> Callable[..., Any] | None:
        fn = original(op)
        if fn is None:
            return None
        new = replace(op, fn)
        if new is NO_LOWERING:
            return None
        return fn if new is None else new

    lowering.find = find
    _forget_compiled_lowerings()
    try:
        yield
    finally:
        lowering.find = original
        _forget_compiled_lowerings()


@contextlib.contextmanager
def launch_blocking(on: bool = True) -> Iterator[None]:
    """Within the block, each op runs to completion as it is issued, so an error raises at the op that caused
    it (TORCH_TPU_LAUNCH_BLOCKING=1 for a whole process; this works after ops have run too). Fused eager mode
    is off while it is on."""
    from hf_tpu import fused

    before = (fused.LAUNCH_BLOCKING, fused.ACTIVE)
    fused.set_launch_blocking(on)
    try:
        yield
    finally:
        fused.LAUNCH_BLOCKING, fused.ACTIVE = before
