"""Transformers' loading, saving and output capture, made right for `tpu` (each factory's docstring names
the upstream behaviour it fixes)."""

from __future__ import annotations

import functools
import os
from typing import Any

from hf_tpu.patches.checkpoint_reader import cpu_to_tpu
from hf_tpu.patches.registry import is_hf_tpu_device, patch, tpu_served_by_hf_tpu


# ------------------------------------------------------------------------------------ tpu_unavailable_error
def _unavailable_reason() -> tuple[str, str]:
    import torch

    from hf_tpu import device

    name = torch._C._get_privateuse1_backend_name()
    if os.environ.get("HF_TPU_DISABLE") == "1":
        return ("hf_tpu's stand-in `tpu` backend is disabled by the environment variable HF_TPU_DISABLE=1",
                "unset HF_TPU_DISABLE (or set it to 0)")
    if device.real_torch_tpu_present():
        return ("torch_tpu is installed and TPU chips are attached, so hf_tpu stepped aside, but torch_tpu has "
                "not registered the `tpu` device", "check the torch_tpu installation (`import torch_tpu`)")
    if name not in ("privateuseone", "tpu"):
        return (f"PyTorch's PrivateUse1 device slot is already taken by another backend ({name!r}), so hf_tpu "
                "could not register `tpu`", f"do not load the {name!r} backend in this process")
    return ("no backend has registered the `tpu` device in this process",
            "install hf-tpu (`pip install -e .` in the hf-tpu checkout) so that `import torch` registers it")


def _mentions_tpu(device_map: Any) -> bool:
    def is_tpu(v: Any) -> bool:
        return isinstance(v, str) and (v == "tpu" or v.startswith("tpu:"))

    if is_tpu(device_map):
        return True
    return isinstance(device_map, dict) and any(is_tpu(v) for v in device_map.values())


@patch("transformers.modeling_utils", "check_and_set_device_map", "tpu_unavailable_error")
def _device_map_check(orig: Any, mod: Any) -> Any:
    """Upstream: with no backend serving `tpu`, `device_map="tpu"` fails inside `torch.device("tpu")` and
    Transformers re-raises "the value needs to be a device name (e.g. cpu, cuda:0) or 'auto', ...", which
    names neither the reason nor the fix. Fix: say why `tpu` is missing and how to get it."""

    @functools.wraps(orig)
    def check_and_set_device_map(device_map: Any) -> Any:
        if _mentions_tpu(device_map):
            import torch

            if torch._C._get_privateuse1_backend_name() != "tpu":
                reason, fix = _unavailable_reason()
                raise RuntimeError(
                    f"device_map={device_map!r}: no backend can serve the `tpu` device: {reason}. To fix it, "
                    f"{fix}; or load on CPU with device_map='cpu'."
                )
        return orig(device_map)

    return check_and_set_device_map


# -------------------------------------------------------------------------------- tpu_skip_allocator_warmup
def _device_map_targets_tpu(device_map: Any) -> bool:
    if not isinstance(device_map, dict):
        return False
    for v in device_map.values():
        kind = v.split(":")[0] if isinstance(v, str) else getattr(v, "type", None)
        if isinstance(v, int) and not isinstance(v, bool):
            kind = "tpu"  # an integer id is torch.device(i): tpu when hf_tpu serves the accelerator
        if kind == "tpu":
            return True
    return False


@patch("transformers.modeling_utils", "caching_allocator_warmup", "tpu_skip_allocator_warmup")
def _allocator_warmup(orig: Any, mod: Any) -> Any:
    """Upstream: `caching_allocator_warmup` allocates one model-sized `torch.empty` on each accelerator before
    loading, to pre-fill PyTorch's CUDA/XPU caching allocator (it already skips MPS and Neuron). hf_tpu has no
    caching allocator: JAX allocates and zero-fills that buffer and frees it again, which costs a
    model-sized transient (host memory on XLA:CPU) and the time to fill it. Fix: skip tpu, as for Neuron."""

    @functools.wraps(orig)
    def caching_allocator_warmup(model: Any, expanded_device_map: Any, *args: Any, **kwargs: Any) -> Any:
        if tpu_served_by_hf_tpu() and isinstance(expanded_device_map, dict):
            expanded_device_map = {k: v for k, v in expanded_device_map.items()
                                   if not _device_map_targets_tpu({k: v})}
        return orig(model, expanded_device_map, *args, **kwargs)

    return caching_allocator_warmup


# ------------------------------------------------------------------------------------ checkpoint_file_errors
class CheckpointFileError(OSError):
    """A checkpoint file could not be read; `.path` names it."""

    def __init__(self, path: Any, exc: BaseException) -> None:
        self.path = str(path)
        super().__init__(
            f"Unable to load weights from checkpoint file {self.path!r}: {type(exc).__name__}: {exc}. The file "
            "is missing, truncated or corrupt: re-download it or save the model again."
        )


# Upstream: a corrupt or truncated checkpoint fails in `from_pretrained` with the reader's own error:
# safetensors' "Error while deserializing header: ...", torch.load's "[Errno 22] Invalid argument" or
# "Weights only load failed", none naming the file (and in a sharded checkpoint the user cannot tell which
# shard). Fix: re-raise as `CheckpointFileError` (an OSError) naming the file, the original chained.
@patch("transformers.modeling_utils", "safe_open", "checkpoint_file_errors")
def _safe_open_errors(orig: Any, mod: Any) -> Any:
    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(filename, *args, **kwargs)
        except Exception as exc:
            raise CheckpointFileError(filename, exc) from exc

    return safe_open


@patch("transformers.modeling_utils", "load_state_dict", "checkpoint_file_errors")
def _load_state_dict_errors(orig: Any, mod: Any) -> Any:
    @functools.wraps(orig)
    def load_state_dict(checkpoint_file: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(checkpoint_file, *args, **kwargs)
        except CheckpointFileError:
            raise
        except Exception as exc:
            raise CheckpointFileError(checkpoint_file, exc) from exc

    return load_state_dict


# ------------------------------------------------------------------------------------ tpu_direct_materialize
@patch("transformers.core_model_loading", "_materialize_copy", "tpu_direct_materialize")
def _materialize_to_tpu(orig: Any, mod: Any) -> Any:
    """Upstream: `core_model_loading._materialize_copy` moves each checkpoint tensor with
    `tensor.to(device)`. On hf_tpu that is PyTorch's generic path: `empty_strided` on tpu (a zero-filled
    device buffer) and then `copy_` (another buffer converted through `jnp.asarray`), so each tensor in
    flight costs about three times its size on the host, with two loader threads. Fix: for a tpu target,
    read the tensor on CPU (cast there if a dtype is asked for) and hand it to JAX, wrapped as the tpu
    tensor directly. A tensor read from a safetensors slice is a view of the memory-mapped checkpoint that
    nothing else references (or, cast on CPU, a fresh buffer), so on XLA:CPU the device array adopts that
    memory (`may_alias`) instead of copying it: as with `device_map="cpu"`, the weights stay in the page
    cache and come in on first use, with no host copy at all (checkpoint_reader.py). A torch.Tensor handed
    in by the caller (a `state_dict=` argument, a legacy .bin) may be used again, so it is copied.
    Measured by benchmarks/load_bench.py."""

    @functools.wraps(orig)
    def _materialize_copy(tensor: Any, device: Any = None, dtype: Any = None) -> Any:
        import torch

        if isinstance(device, int):  # an accelerator index (device_map="auto" over tpu:0..N-1): tpu:i
            device = torch.device(device)
        if device is not None and is_hf_tpu_device(device):
            index = torch.device(device).index

            fresh = not isinstance(tensor, torch.Tensor)  # a safetensors slice: `[...]` reads a new buffer
            cpu = tensor[...]
            if getattr(cpu, "device", None) is not None and cpu.device.type == "cpu":
                if dtype is not None and cpu.dtype != dtype:
                    cpu, fresh = cpu.to(dtype), True
                return cpu_to_tpu(cpu, adopt=fresh, index=index)
        return orig(tensor, device, dtype)

    return _materialize_copy


# --------------------------------------------------------------------------------- tpu_output_capture_guards
@patch("transformers.utils.output_capturing", "_CanRecordRegistry.get", "tpu_output_capture_guards", optional=True)
def _output_capture_registry(orig: Any, mod: Any) -> Any:
    """Upstream: `output_capturing._CAN_RECORD_REGISTRY` is one process-wide dict (a dict subclass) of the
    `_can_record_outputs` of every model class built so far, and a compiled forward looks its own class up
    in it. Dynamo guards that dict's whole key order, so a graph saved by the compile cache only loads in a
    process that built the same model classes in the same order: in a sweep worker (many models per
    process) two saved graphs in five failed to load with "IndexError: list index out of range" and were
    compiled again. The registry's value for a model is its class's `_can_record_outputs` (set in
    `PreTrainedModel.__init__`), so under compile it is read from the class, which the graph already
    depends on; eager keeps upstream's lookup."""

    @functools.wraps(orig)
    def get(self: Any, model: Any) -> dict:
        import torch

        if torch.compiler.is_compiling():
            return getattr(type(model), "_can_record_outputs", None) or {}
        return orig(self, model)

    return get


# ------------------------------------------------------------------------------------------ doge_block_mask
@patch("transformers.models.doge.modeling_doge", "DogeAttention.prepare_dynamic_mask", "doge_block_mask",
       optional=True)
def _doge_block_mask(orig: Any, mod: Any) -> Any:
    """Upstream: modeling_doge imports flex attention's `BlockMask` only `if is_torch_flex_attn_available()`,
    which Transformers answers False whenever the current accelerator is `tpu` (its flex attention refuses
    TPU tensors), yet `DogeAttention.prepare_dynamic_mask` tests `isinstance(attention_mask, BlockMask)` on
    every call with a mask. So with hf_tpu installed (or torch_tpu), every Doge forward fails with
    "NameError: name 'BlockMask' is not defined", on CPU as well as on `tpu`, eager or compiled. Fix: give
    the module torch's own `BlockMask` class, the name its code expects; with flex attention off no mask is
    a BlockMask, so the test is False and the float/bool mask is applied as upstream means. (Not
    masking_utils' fallback `BlockMask = torch.Tensor`: that would make every mask a "BlockMask" and Doge
    would drop it.) The method itself is unchanged."""
    if "BlockMask" not in vars(mod):
        from torch.nn.attention.flex_attention import BlockMask

        mod.BlockMask = BlockMask
    return orig


# ------------------------------------------------------------------------------- kernels_integer_device_ids
@patch("transformers.integrations.hub_kernels", "kernelize", "kernels_integer_device_ids",
       also_in=("transformers.modeling_utils",))
def _kernelize_integer_ids(orig: Any, mod: Any) -> Any:
    """Upstream (Transformers 5.25, where `kernels` is a dependency and on by default): `kernelize` takes the
    first non-cpu value of the `device_map` as the model's device and asks `get_device_type` for its type.
    Accelerate's planners ("auto", "balanced", a `max_memory` per device) write integer device ids, and
    Diffusers passes such a map on to each Transformers component, so `get_device_type(0)` raised
    "AttributeError: 'int' object has no attribute 'type'" and the load failed whenever that id was not 0
    (0 is falsy, and upstream then asks the model instead): any model split over two devices, tpu or GPU. Fix: an integer id is `torch.device(i)` (device i of the current accelerator), as
    accelerate itself reads it."""
    import inspect

    if "device_map" not in inspect.signature(orig).parameters:
        return None  # Transformers < 5.25: kernelize takes no device_map

    @functools.wraps(orig)
    def kernelize(model: Any, *args: Any, device_map: Any = None, **kwargs: Any) -> Any:
        import torch

        if isinstance(device_map, dict):
            device_map = {k: torch.device(v) if isinstance(v, int) and not isinstance(v, bool) else v
                          for k, v in device_map.items()}
        return orig(model, *args, device_map=device_map, **kwargs)

    return kernelize
