"""PyTorch's own behaviour for a Python backend, made right for `tpu`: applied by install() when hf_tpu
serves `tpu` (each factory's docstring names the upstream behaviour it fixes)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from hf_tpu.patches.registry import patch, tpu_served_by_hf_tpu


# Upstream (PyTorch): `Tensor.__deepcopy__` copies a PrivateUse1 tensor that has a storage through
# `UntypedStorage.clone()`, which allocates a tpu storage with PyTorch's allocator; a Python backend has
# none, so the process died with SIGSEGV (trainers, EMA models, Accelerate and Transformers' tests
# deep-copy tensors). Fix: a tpu tensor is copied at the level hf_tpu keeps its data (tensor.copy_sharing):
# the new tensor reads a new device buffer holding the same JAX array. Buffers are memoised in `memo`, so
# tensors that share memory (a base and its views) still share it after one deepcopy, as on CPU.
# `UntypedStorage.clone()` of a tpu storage raises a clear error instead of crashing.
@patch("torch", "Tensor.__deepcopy__", "tpu_deepcopy", at_install=True)
def _tensor_deepcopy(orig: Any, torch: Any) -> Any:
    @functools.wraps(orig)
    def __deepcopy__(self: Any, memo: dict) -> Any:
        if (self.device.type != "tpu" or not tpu_served_by_hf_tpu() or self.is_sparse or not self.is_leaf
                or torch.overrides.has_torch_function_unary(self)):
            return orig(self, memo)  # upstream's path (and its error for non-leaf tensors)
        if id(self) in memo:
            return memo[id(self)]
        from hf_tpu import tensor as T

        with torch.no_grad():
            new = T.copy_sharing(self, memo.setdefault("hf_tpu_buffers", {}))
            if type(self) is not torch.Tensor:
                new = new.as_subclass(type(self))
                import copyreg

                for slot in copyreg._slotnames(type(self)):  # type: ignore[attr-defined]
                    if hasattr(self, slot):
                        setattr(new, slot, copy.deepcopy(getattr(self, slot), memo))
            if self.requires_grad:
                new.requires_grad_()
            if self.grad is not None:
                new.grad = self.grad.__deepcopy__(memo)
            self._clear_non_serializable_cached_data()
            new.__dict__ = copy.deepcopy(self.__dict__, memo)
        memo[id(self)] = new
        return new

    return __deepcopy__


@patch("torch", "UntypedStorage.clone", "tpu_deepcopy", at_install=True)
def _storage_clone(orig: Any, torch: Any) -> Any:
    @functools.wraps(orig)
    def clone(self: Any) -> Any:
        if self.device.type == "tpu" and tpu_served_by_hf_tpu():
            raise RuntimeError(
                "UntypedStorage.clone() is not supported for hf_tpu's `tpu` storages (a Python backend has no "
                "PyTorch allocator): copy the tensor instead, with tensor.clone() or copy.deepcopy(tensor)."
            )
        return orig(self)

    return clone


@patch("torch", "_TorchCompileInductorWrapper.__call__", "tpu_default_compile", at_install=True, optional=True)
def _default_compile(orig: Any, torch: Any) -> Any:
    """Upstream (PyTorch): `torch.compile(model)` with no backend is Inductor, and Inductor's `tpu` device
    generates Pallas kernels that import torch_tpu, so a tpu model failed with "No module named
    'torch_tpu'" (Transformers' tests and most users compile without naming a backend). PyTorch's only
    hook for a default is the process-wide `set_default_backend`, which would also take CPU and CUDA
    models away from Inductor. Fix: Inductor's entry (`_TorchCompileInductorWrapper.__call__`, what the
    default and `backend="inductor"` call) hands a graph over tpu tensors to the "tpu" backend, which is
    what `backend="tpu"` runs; every other graph goes to Inductor as before."""

    @functools.wraps(orig)
    def __call__(self: Any, model_: Any, inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        if tpu_served_by_hf_tpu() and _graph_on_tpu(model_, inputs_):
            if self.config and not _warned_inductor_config:
                _warn_inductor_config(self.config)
            from hf_tpu.compile import tpu_backend

            return tpu_backend(model_, inputs_)
        return orig(self, model_, inputs_, *args, **kwargs)

    return __call__


_warned_inductor_config = False


def _warn_inductor_config(config: dict[str, Any]) -> None:
    import warnings

    global _warned_inductor_config
    _warned_inductor_config = True
    warnings.warn(f"hf_tpu: torch.compile of a tpu model runs the \"tpu\" backend, which ignores Inductor's "
                  f"mode/options ({sorted(config)}); pass backend=\"tpu\" to say so explicitly.", stacklevel=3)


def _graph_on_tpu(gm: Any, example_inputs: Any) -> bool:
    import torch

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if hasattr(gm, "parameters"):
        tensors += [*gm.parameters(), *gm.buffers()]
    return any(t.device.type == "tpu" for t in tensors)


@patch("torch._tensor_str", "_tensor_str", "tpu_tensor_printing", at_install=True)
def _tensor_printing(orig: Any, ts: Any) -> Any:
    """Upstream (PyTorch): printing a tensor indexes it element by element (the formatter calls `.item()` on
    each element's view). PyTorch copies xla/lazy/ipu/mtia tensors to CPU first for that reason (each indexing
    op compiles there), but not tpu: every printed element was a separately compiled read. Transformers'
    test_model_outputs_equivalence formats whole output tensors into an assertion message (60k `.item()`
    calls: 24x slower than on CPU, and the test that timed out on a loaded machine). Fix: `_tensor_str`, which
    formats the values, formats a tpu tensor's CPU copy; the caller still adds `device='tpu:0'`."""

    @functools.wraps(orig)
    def _tensor_str(self: Any, indent: int) -> str:
        if self.device.type == "tpu":
            self = self.detach().cpu()
        return orig(self, indent)

    return _tensor_str


@patch("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable._get_handlers", "tpu_addcdiv_whole",
       optional=True)
def _addcdiv_whole(orig: Any, mod: Any) -> Any:
    """Upstream (PyTorch): Dynamo traces `torch.addcdiv(x, t1, t2, value=v)` as x + (t1 / t2) * v (its
    handle_addcdiv, so that a symbolic `v` needs no graph break), which in float16/bfloat16 rounds three times
    where CPU's kernel, and tpu's lowering, compute in float32 and round once. graph_parity.refuse_dynamos_addcdiv
    puts the three nodes back only when their source line names addcdiv, so a call through a wrapper (OpInfo's
    `op(...)`, any helper) stayed three roundings (addcdiv float16 compiled: values differ). Fix: for tpu tensors
    with a constant `value`, Dynamo keeps addcdiv whole (no decomposition is needed: a constant is no graph
    break); other devices, and a symbolic value, take upstream's handler."""
    import torch

    @functools.cache
    def _get_handlers() -> dict:
        handlers = dict(orig())
        upstream = handlers.get(torch.addcdiv)
        if upstream is None:
            return handlers

        def handle_addcdiv(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
            value = kwargs.get("value")
            device = getattr(args[0], "device", None) if args else None
            if (value is not None and value.is_python_constant() and isinstance(device, torch.device)
                    and device.type == "tpu" and tpu_served_by_hf_tpu()):
                return None  # traced whole, as any in-graph function
            return upstream(self, tx, *args, **kwargs)

        handlers[torch.addcdiv] = handle_addcdiv
        return handlers

    _get_handlers._hf_tpu_patched = True  # type: ignore[attr-defined] # the class attribute reads the function
    return staticmethod(_get_handlers)


@patch("torch.nn.modules.linear_cross_entropy_options", "LinearCrossEntropyOptions._adjust", "tpu_lce_options",
       optional=True)
def _linear_cross_entropy_options(orig: Any, mod: Any) -> Any:
    """Upstream (PyTorch): F.linear_cross_entropy's chunked path resolves acc_policy/chunking "auto" per (device
    type, dtype) from a table of CUDA and CPU entries, and accumulates half inputs in float32 only on CUDA and
    CPU (_resolve_auto_acc_dtype: "hardware with a working mixed-precision mm path"); any other device falls
    back to the "compact" policy accumulating in the half type, so a bfloat16 loss on tpu was 1 ulp off CPU's
    and a float16 gradient 0.5% off (OpInfo's linear_cross_entropy.chunked pairs). A TPU multiplies half
    matrices into float32 (its MXU; the stand-in's dots take out_dtype too). Fix: for tpu the options resolve
    as CPU's ("accurate", float32 accumulation), what the results are compared against."""
    import torch

    def _adjust(self: Any, num_batches: Any, in_features: Any, num_classes: Any, dtype: Any, device: Any = None) -> Any:
        if device is not None and torch.device(device).type == "tpu" and tpu_served_by_hf_tpu():
            device = torch.device("cpu")
        return orig(self, num_batches, in_features, num_classes, dtype, device)

    return _adjust
