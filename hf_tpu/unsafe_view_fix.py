"""While hf_tpu's AOTAutograd traces a graph (compile.py's tpu backend, compile_cache/serializable.py's graph
cache backend), `_unsafe_view` on a functional tensor is functionalized as `view`.

An output that aliases another (a view of an intermediate the graph also returns) is rebuilt at run time by
AOTAutograd, by replaying the ViewMeta sequence functionalization recorded while tracing. PyTorch 2.13's
hand-written functionalization kernel of `_unsafe_view` (FunctionalizeFallbackKernel.cpp; a 3-d matmul ends in
one) records a ViewMeta whose sizes refer to a freed list: the replay reads whatever the allocator put there
since (its as_tuple() shows the garbage on CPU too; CPU kernels happen to run before the memory is reused, tpu's
Python kernels allocate first). Step3p7Model's compiled training step failed with "shape '[94059980854764,
7647175993348940116, 64]' is invalid". `view` records an owning ViewMeta; to functionalization both are views
of the same storage, and autograd, the only one that tells them apart, has run above it. PyTorch's kernel is
back once the trace is done: nothing changes outside hf_tpu's compiles.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """The block in which AOTAutograd traces: `_unsafe_view` functionalized as `view`."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # the override is the point: PyTorch warns on any re-registration of an aten kernel
            warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel",
                                    category=UserWarning)
            lib.impl("_unsafe_view", _as_view, "Functionalize")
        yield
    finally:
        lib._destroy()


def _as_view(self: torch.Tensor, size: Any) -> torch.Tensor:
    return torch.ops.aten.view.default(self, size)
