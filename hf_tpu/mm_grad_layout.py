"""The weight gradient of a `Linear` on tpu in the weight's own layout, as PyTorch's CPU backward makes it.

`F.linear(x, W)` is `mm(x, W.t())` (or `addmm`), and the weight's gradient is `mm_mat2_backward`: PyTorch
computes `grad.t().mm(x).t()` when the forward's mat2 was column-major (a transposed weight), so that the
gradient comes out in W's (out, in) layout, and `mat1.t().mm(grad)` otherwise. It reads the layout from the
strides mat2 had in the forward; every tpu tensor reports contiguous strides (its view geometry is its own:
tensor.py), so on tpu it always took the second form: a buffer in (in, out) layout, which the transpose in
the autograd graph (`TBackward`) then views as (out, in). Every reader of that gradient read it transposed:
under autocast its cast to float32 (Qwen3's tied 151,936 x 1,024 LM head: 172 ms against 115 for the plain
cast), then the optimizer. Here, in an mm run by the backward of `mm`/`addmm` whose saved mat2 is the transpose
of a whole 2-D buffer, the product is computed as PyTorch does for a column-major mat2: `grad.t().mm(mat1)` into
a buffer of W's layout, returned as its transposed view, so that `TBackward`'s transpose gives W's layout back.
Same products and sums (the bits are those of the plain form on this host's kernels: the test checks); anything
else runs as before.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import tensor as T
from hf_tpu.eager_functional import run_functional

aten = torch.ops.aten
# the backward nodes whose mm is mm_mat2_backward's, and the name their saved mat1 has
_MAT1 = {"MmBackward0": "_saved_self", "AddmmBackward0": "_saved_mat1"}


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten.mm on tpu in eager mode (the module's docstring; packed_eager.mm, registered for aten.mm, calls it)."""
    node = torch._C._current_autograd_node()
    if node is not None and _weight_gradient(node, a, b):
        return run_functional(aten.mm.default, (b.t(), a.t()), {}).t()
    return run_functional(aten.mm.default, (a, b), {})


def _weight_gradient(node: Any, a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a.mm(b)` is mm_mat2_backward's `mat1.t().mm(grad)` for a mat2 that was a transposed whole buffer."""
    saved = _MAT1.get(node.name())
    if saved is None or a.dim() != 2 or b.dim() != 2:
        return False
    try:
        mat1, mat2 = getattr(node, saved), node._saved_mat2
    except RuntimeError:  # freed (retain_graph=False after use) or never saved (its input needs no gradient)
        return False
    if not (isinstance(mat1, torch.Tensor) and isinstance(mat2, torch.Tensor)) or mat2.dim() != 2:
        return False
    if mat1.device.type != "tpu" or mat2.device.type != "tpu" or tuple(a.shape) != tuple(mat1.shape)[::-1]:
        return False
    return is_transposed_whole(a, T.payload(mat1).buf) and is_transposed_whole(mat2, None)


def is_transposed_whole(t: torch.Tensor, buf: Any) -> bool:
    """t (2-D) is the transpose of its whole buffer read as a matrix (of `buf`, when given): one view step
    (sizes (c, r), strides (1, c), offset 0) over r * c elements, whatever the buffer's own shape (a 3-D
    activation flattened to rows)."""
    p = T.payload(t)
    if buf is not None and p.buf is not buf:
        return False
    if p.view is None or len(p.view) != 1:
        return False
    (c, r), strides, offset = p.view[0]
    return strides == (1, c) and offset == 0 and r * c == p.buf.numel
