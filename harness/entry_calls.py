"""Calling a built zoo entry, shared by the sweep (harness/sweep/runner.py) and diagnose (harness/diagnose):
fresh copies of its model and inputs on a device, its outputs as named tensors on CPU, compiling its call for
the compiled mode, and whether an error came from compiling. Kept apart so that the sweep calls diagnose
and diagnose needs nothing of the sweep's runner."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from harness.core import errors, model_dtype


def output_tensors(output: Any) -> dict:
    """The floating (and complex) tensors of a model output, by name (harness.zoo's rule when available)."""
    try:
        from harness.zoo import output_tensors as zoo_output_tensors
    except ImportError:
        zoo_output_tensors = None
    if zoo_output_tensors is not None:
        return dict(zoo_output_tensors(output))
    return _flatten(output)


def _flatten(output: Any, prefix: str = "out") -> dict:
    import torch

    out: dict = {}
    if isinstance(output, torch.Tensor):
        if output.is_floating_point() or output.is_complex():
            out[prefix] = output
    elif isinstance(output, dict) or hasattr(output, "items"):
        for k, v in output.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix != "out" else str(k)))
    elif isinstance(output, (list, tuple)):
        for i, v in enumerate(output):
            out.update(_flatten(v, f"{prefix}.{i}"))
    return out


def _map_tensors(obj: Any, fn: Callable) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, torch.Generator):  # generators stay on CPU; a fresh copy each call
        g = torch.Generator(device=obj.device)
        g.set_state(obj.get_state())
        return g
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def prepare_inputs(inputs: dict, device: str | None = None, dtype: Any = None) -> dict:
    """A fresh copy of the inputs on `device`, floating tensors cast to `dtype` (generators re-seeded)."""

    dtype = model_dtype.input_dtype(dtype)

    def fn(t):
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.to(device) if device is not None else t.clone()

    return _map_tensors(inputs, fn)


def prepare_model(model: Any, device: str | None = None, dtype: Any = None, rebuild: Callable | None = None) -> Any:
    """A copy of the model (the built one stays untouched on CPU), cast (`dtype`: a torch.dtype or a
    harness.core.model_dtype.LayerwiseCast) and moved. Where a model cannot be
    deep-copied, `rebuild()` builds it again (entries are deterministic for a seed)."""
    try:
        m = copy.deepcopy(model)
    except Exception:  # noqa: BLE001
        if rebuild is None:
            raise
        m = rebuild()
    if dtype is not None:
        m = model_dtype.cast_model(m, dtype)  # a torch.dtype, or float8 storage (harness.core.model_dtype)
    if device is not None:
        m = m.to(device)
    return m


def to_cpu(tensors: dict) -> dict:
    return {k: v.detach().to("cpu") for k, v in tensors.items()}


# A Diffusers pipeline is compiled the way Diffusers documents it (`pipe.unet = torch.compile(pipe.unet)`):
# its denoiser, not the Python `__call__` with its scheduler loop, CPU generator and numpy post-processing,
# which users do not compile and Dynamo does not trace as one graph (it failed on the CPU timestep reaching
# UNet2D's time embedding: "Tensor device mismatch").
DENOISERS = model_dtype.DENOISERS  # one list: float8 storage casts the same components


def compile_call(call: Callable, model: Any, backend: Any) -> Callable:
    """`call` compiled for the compiled mode: the whole call, or for a pipeline (`model` is the entry's own
    copy, so it may be changed) its denoiser modules, with `call` itself left eager."""
    import torch

    components = getattr(model, "components", None)
    if isinstance(components, dict):
        denoisers = [n for n in DENOISERS if isinstance(components.get(n), torch.nn.Module)]
        for name in denoisers:
            setattr(model, name, torch.compile(components[name], backend=backend, dynamic=False))
        if denoisers:
            return call
    return torch.compile(call, backend=backend, dynamic=False)


_COMPILE_FRAMES = {"traced", "run", "to_jax_function", "compile_graph", "tpu_backend", "with_precision"}


def during_compile(exc: BaseException) -> bool:
    """A compiled first call failed while the backend was building its program: a frame of hf_tpu's
    compiler (tracing the graph into JAX) is on the traceback, not only the call of a finished program."""
    for e in errors.chain(exc):
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if "hf_tpu" in code.co_filename and "compile" in code.co_filename and code.co_name in _COMPILE_FRAMES:
                return True
            tb = tb.tb_next
    return False


def failure_status(exc: BaseException, mode: str, first_call: bool) -> str:
    """The status of a run that raised: oom, compile_fail (compiled mode, while compiling) or fail_to_run."""
    if errors.is_oom(exc):
        return "oom"
    if mode == "compiled" and (errors.is_compile_error(exc) or first_call and during_compile(exc)):
        return "compile_fail"
    return "fail_to_run"
