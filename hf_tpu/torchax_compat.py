"""The one place that knows torchax 0.0.13 predates torch 2.13.

Two things break when torchax is imported as is:
- torch 2.13 dropped named-tensor overloads that torchax's op tables name at import time
  (e.g. `aten.prod.dim_Dimname`), so `torch.ops.aten.<op>.<overload>` raises AttributeError;
- `import torchax` renames PrivateUse1 to "jax" and registers a `torch.jax` device module, which would
  clash with our `tpu` device (a PrivateUse1 backend can be renamed only once).

`load_op_table()` imports torchax with both neutralised, then restores torch exactly as it was.
We only use torchax's op registry (its ATen -> JAX lowerings), not its tensor or environment.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch._ops as _ops


class MissingOverload:
    """Stands in for an overload torch no longer has, so torchax's `@op(...)` decorators still run.

    Registrations keyed by a MissingOverload are unreachable (torch never dispatches that overload) and
    are dropped from the table `load_op_table()` returns."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} missing in torch {torch.__version__}>"

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MissingOverload) and other.name == self.name


@contextlib.contextmanager
def _tolerant_torch() -> Iterator[None]:
    orig_getattr = _ops.OpOverloadPacket.__getattr__
    orig_rename = torch.utils.rename_privateuse1_backend
    orig_register = torch._register_device_module

    def getattr_(self: Any, key: str) -> Any:
        try:
            return orig_getattr(self, key)
        except AttributeError:
            if key.startswith("__"):
                raise
            return MissingOverload(f"{self._qualified_op_name}.{key}")

    def register(name: str, module: Any) -> None:
        if name != "jax":  # torchax's own device module: not ours to register
            orig_register(name, module)

    _ops.OpOverloadPacket.__getattr__ = getattr_
    torch.utils.rename_privateuse1_backend = lambda name: None
    torch._register_device_module = register
    try:
        yield
    finally:
        _ops.OpOverloadPacket.__getattr__ = orig_getattr
        torch.utils.rename_privateuse1_backend = orig_rename
        torch._register_device_module = orig_register


@functools.cache
def load_op_table() -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Return torchax's (jax_lowerings, torch_decompositions).

    jax_lowerings maps OpOverload/OpOverloadPacket -> torchax Operator whose `func` works on jax arrays;
    torch_decompositions maps ops to pure-torch decompositions (they re-dispatch on our tensors)."""
    with _tolerant_torch():
        from hf_tpu import runtime

        runtime.add_fast_compile_flags()  # before torchax imports JAX
        # torchax turns off MHA's fast path on import (it uses sparse helpers torchax lacks); we do the same
        # for the same reason, so that is not undone.
        import torchax  # noqa: F401
        from torchax.decompositions import DECOMPOSITIONS
        from torchax.ops import jaten, jtorch, ops_registry  # noqa: F401

    _complete_dtype_maps()
    lowerings = {
        k: v
        for k, v in ops_registry.all_aten_ops.items()
        if not isinstance(k, MissingOverload) and v.is_jax_function
    }
    decomps = {k: v for k, v in DECOMPOSITIONS.items() if not isinstance(k, MissingOverload)}
    return lowerings, decomps


def _complete_dtype_maps() -> None:
    """torchax 0.0.13 maps only two of torch's five float8 dtypes; its factory lowerings (empty_like,
    full, ...) raised "unknown type" for the fnuz types and float8_e8m0fnu on tpu."""
    from torchax.ops import mappings

    from hf_tpu import dtypes

    for t, j in dtypes.float8_jax_dtypes().items():
        mappings.TORCH_DTYPE_TO_JAX.setdefault(t, j)
        mappings.JAX_DTYPE_TO_TORCH.setdefault(j, t)
