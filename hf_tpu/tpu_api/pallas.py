"""torch.tpu.pallas.jax_op: a JAX function as a PyTorch custom op (torch.library.custom_op) taking and
returning torch tensors. On the stand-in, a tpu tensor's JAX array is handed over as is; CPU tensors are
copied in and the results copied back. As under torch_tpu, the op has no autograd until the caller
registers one (`op.register_autograd(backward, setup_context=...)`)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hf_tpu import dtypes, host_copy, tensor as T


def _is_array_annotation(ann: Any) -> bool:
    if ann is inspect.Parameter.empty:
        return True  # unannotated parameters are arrays, the common case for a JAX function
    name = getattr(ann, "__name__", str(ann))
    return name in ("Array", "ndarray", "ArrayLike") or "Array" in str(ann)


_SCALARS = {int: "SymInt", float: "float", bool: "bool", str: "str"}


def _arg_type(p: inspect.Parameter) -> str:
    if p.annotation in _SCALARS:
        return _SCALARS[p.annotation]
    if _is_array_annotation(p.annotation):
        return "Tensor"
    raise TypeError(f"jax_op: parameter {p.name!r} has annotation {p.annotation!r}; use jax.Array, int, float, "
                    "bool or str")


def _return_type(ann: Any) -> tuple[str, int | None]:
    """The schema's return type and the number of outputs (None: one tensor; -1: a list)."""
    if ann is inspect.Signature.empty or _is_array_annotation(ann) and typing.get_origin(ann) is not tuple:
        return "Tensor", None
    if typing.get_origin(ann) in (tuple, list):
        args = typing.get_args(ann)
        if len(args) == 2 and args[1] is Ellipsis or typing.get_origin(ann) is list:
            return "Tensor[]", -1
        return "(" + ", ".join("Tensor" for _ in args) + ")", len(args)
    raise TypeError(f"jax_op: return annotation {ann!r}; use jax.Array or a tuple of them")


def _to_jax(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    return T.value(x) if x.device.type == "tpu" else host_copy.from_cpu(x)


def _to_torch(a: Any, device: torch.device) -> torch.Tensor:
    dt = dtypes.to_torch(a.dtype)
    return T.wrap(a, dt) if device.type == "tpu" else host_copy.to_cpu(a, dt)


def jax_op(name: str, fn: Callable[..., Any] | None = None, /, *, donate_argnums: Sequence[int] | None = None,
           mesh: Any = None, input_partition_specs: Any = None, output_partition_specs: Any = None) -> Any:
    """Register JAX function `fn` as the custom op `name` ("namespace::op"); a decorator when `fn` is None.
    Returns the torch.library CustomOpDef: call it with torch tensors."""
    if "::" not in name:
        raise ValueError(f"Op name {name} does not contain a namespace.")
    if len(name.split("::")) != 2:
        raise ValueError(f"Op name {name} must have exactly one '::' separator.")
    if mesh is not None or input_partition_specs is not None or output_partition_specs is not None:
        from hf_tpu.tpu_api.errors import needs_hardware

        needs_hardware("torch.tpu.pallas.jax_op(mesh=...)")()

    def dec(f: Callable[..., Any]) -> Any:
        from hf_tpu import runtime

        sig = inspect.signature(inspect.unwrap(f), eval_str=True)
        params = list(sig.parameters.values())
        ret, n_out = _return_type(sig.return_annotation)
        schema = "(" + ", ".join(f"{_arg_type(p)} {p.name}" for p in params) + ") -> " + ret
        jax = runtime.jax()

        def kernel(*args: Any) -> Any:
            # donate_argnums is an XLA memory hint; JAX arrays are immutable, so the values are the same.
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            out = f(*[_to_jax(a) for a in args])
            if n_out is None:
                return _to_torch(out, device)
            return type(out)(_to_torch(o, device) for o in out) if n_out == -1 else tuple(
                _to_torch(o, device) for o in out)

        def fake(*args: Any) -> Any:
            # Output shapes from JAX's abstract evaluation of the function.
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            specs = [jax.ShapeDtypeStruct(tuple(a.shape), dtypes.to_jax(a.dtype)) if isinstance(a, torch.Tensor)
                     else a for a in args]
            outs = jax.eval_shape(f, *specs)
            one = n_out is None
            made = [torch.empty(o.shape, dtype=dtypes.to_torch(o.dtype), device=device)
                    for o in ([outs] if one else outs)]
            return made[0] if one else (made if n_out == -1 else tuple(made))

        kernel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [p.replace(annotation=inspect.Parameter.empty) for p in params])
        op = torch.library.custom_op(name, kernel, mutates_args=(), schema=schema)
        op.register_fake(fake)
        return op

    return dec if fn is None else dec(fn)
