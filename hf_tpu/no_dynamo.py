"""Keeping TorchDynamo out of hf_tpu's Python kernels (the device's, autocast's, sdpa's)."""

from __future__ import annotations

from typing import Any

import torch


def never_traced_by_dynamo(fn: Any) -> Any:
    """Keep TorchDynamo out of our kernels and everything they call.

    After a graph break, Dynamo evaluates the frames that run eagerly, and our Python kernels are frames:
    without this it would try to trace hf_tpu's dispatch and JAX itself (and fail). (SKIP, SKIP) skips the
    frame and all frames it calls; set through torch._C so that `import torch` does not import Dynamo."""
    ev = torch._C._dynamo.eval_frame
    ev.set_code_exec_strategy(fn.__code__, ev._FrameExecStrategy(ev._FrameAction.SKIP, ev._FrameAction.SKIP))
    return fn
