"""Eager `scaled_dot_product_attention` on tpu as one op, hence one XLA program.

SDPA is CompositeImplicitAutograd: it decomposes above autograd into its math path, about thirty ATen ops
per call, each a dispatch and an XLA call in eager mode. The per-device choice of a fused kernel is a C++
DispatchStub (`_fused_sdp_choice_stub`), which a Python backend cannot register. So a kernel at
AutogradPrivateUse1 takes the op whole when autograd has nothing to record, and dispatch runs PyTorch's
own math decomposition traced as one program (decomposed.py): the same arithmetic, one call.

Everything else keeps the composite path, exactly as before: a call autograd must record (grad mode on
and an input that requires grad), dropout (random numbers: never a cached program), and tensors that are
not plain tpu tensors (FakeTensor or FunctionalTensor while torch.compile traces).
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import dispatch  # sdpa is imported only once dispatch is loaded (device._register_direct_kernels)
from hf_tpu.op_registry import lowers

OP = torch.ops.aten.scaled_dot_product_attention.default


def _plain(x: Any) -> bool:
    return x is None or type(x) is torch.Tensor or type(x) is torch.nn.Parameter


@lowers(OP, kind="autograd")
def kernel(*args: Any, **kwargs: Any) -> Any:
    """The AutogradPrivateUse1 kernel of aten::scaled_dot_product_attention."""
    tensors = [a for a in args[:4] if isinstance(a, torch.Tensor)]
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    if dropout == 0.0 and all(_plain(t) for t in tensors) and not (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return dispatch.dispatch(OP, args, kwargs)
    return OP.decompose(*args, **kwargs)
