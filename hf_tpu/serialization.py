"""torch.save / torch.load of tpu tensors.

PyTorch checkpoints store storages as bytes. hf_tpu's tensors keep their data as JAX arrays attached to a
data-less PyTorch storage, so a tpu storage has no bytes to write and `UntypedStorage(n, device="tpu")`
has no allocator. What is done instead, each through PyTorch's own machinery:

- saving: a tpu tensor pickles as PyTorch pickles tensors of backends without storage (XLA, MTIA, a
  PrivateUse1 backend whose tensors lack one): a CPU copy rebuilt by
  `torch._utils._rebuild_device_tensor_from_cpu_tensor`, which the `weights_only` unpickler allows and which
  applies `map_location` to the saved device. (Views of one tensor are saved as separate copies, as there.)
- loading to tpu (`map_location="tpu"`, a dict or callable naming tpu): a deserializer registered with
  `torch.serialization.register_package` turns the CPU storage read from the file into a tpu storage holding
  its bytes as a uint8 array, and `set_(storage, offset, size, stride)` (how PyTorch rebuilds a tensor on a
  storage) reads the typed elements out of those bytes.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from hf_tpu import tensor as T
from hf_tpu.op_registry import lowers

aten = torch.ops.aten

_TPU_LOCATION = re.compile(r"^tpu(:\d+)?$")


def storage_to_tpu(storage: Any, device: Any = "tpu") -> torch.UntypedStorage:
    """A tpu storage holding a CPU storage's bytes (as a uint8 array)."""
    untyped = storage.untyped() if hasattr(storage, "untyped") else storage
    if untyped.device.type == "tpu":
        return untyped
    host = torch.empty(0, dtype=torch.uint8).set_(untyped)
    return host.to(device).untyped_storage()


def _elements(storage: Any, dtype: torch.dtype) -> T.Buffer:
    """The storage's bytes as a flat buffer of `dtype`, made once per (storage, dtype), so tensors rebuilt
    on one storage (tied weights) share one buffer."""
    cache = getattr(storage, "_hf_tpu_typed", None)
    if cache is None:
        cache = {}
        storage._hf_tpu_typed = cache
    buf = cache.get(dtype)
    if buf is None:
        from hf_tpu import dtypes, runtime

        p = T.storage_payload(storage)
        if p is None:
            raise RuntimeError("hf_tpu: set_() on a tpu storage that holds no data (it was not made from a "
                               "tensor or a checkpoint); build the tensor with torch.empty/tensor.to('tpu').")
        jax = runtime.jax()
        if p.view is not None:
            raise RuntimeError("hf_tpu: set_() on the storage of a tpu view is not supported; use the "
                               "tensor itself (or tensor.clone()) instead of its storage")
        raw = p.buf.array.reshape(-1)
        if raw.dtype != jax.numpy.uint8:
            raw = jax.lax.bitcast_convert_type(raw, jax.numpy.uint8).reshape(-1)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        n = raw.shape[0] // itemsize
        target = dtypes.to_jax(dtype)
        raw = raw[: n * itemsize]
        elems = raw if itemsize == 1 and target == raw.dtype else jax.lax.bitcast_convert_type(
            raw.reshape(n, itemsize) if itemsize > 1 else raw, target)
        buf = cache[dtype] = T.Buffer(elems.reshape(-1))
    return buf


@lowers(aten.set_.source_Storage, aten.set_.source_Storage_storage_offset, kind="eager")
def set_source_storage(t: torch.Tensor, source: Any, storage_offset: int = 0, size: Any = None,
                       stride: Any = None) -> torch.Tensor:
    """`t.set_(storage, offset, size, stride)` for a tpu storage: t becomes a view of the storage's elements
    (a copy of them when its dtype differs from what the storage holds)."""
    untyped = source.untyped() if hasattr(source, "untyped") else source
    buf = _elements(untyped, t.dtype)
    if size is None:
        size = [buf.shape[0] - int(storage_offset)]
        stride = [1]
    if stride is None:
        stride = list(torch.empty(list(size), device="meta").stride())
    whole = T.view_of(buf, list(buf.shape), t.dtype, None)
    view = T.make_view(whole, [int(s) for s in size], [int(s) for s in stride], int(storage_offset))
    t.data = view  # shallow-copies sizes and StorageImpl in C++: the payload follows
    return t


def _tag(obj: Any) -> None:
    return None  # PyTorch's own privateuse1 tagger names tpu storages; only restoring needs us


def _restore(obj: Any, location: str) -> Any:
    if _TPU_LOCATION.match(location) and obj.device.type == "cpu":
        return storage_to_tpu(obj, location)
    return None


def _reduce_ex_internal(orig: Any) -> Any:
    def reduce(self: torch.Tensor, proto: int) -> Any:
        plain = type(self) is torch.Tensor or isinstance(self, torch.nn.Parameter)
        if self.device.type != "tpu" or not plain:  # subclasses (wrappers) keep their own path
            return orig(self, proto)
        if torch.serialization._serialization_tls.skip_data:
            raise RuntimeError("hf_tpu: tpu tensors cannot be saved under torch.serialization.skip_data (like "
                               "XLA's, their data lives outside PyTorch's storage); move them to CPU first")
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))

    reduce._hf_tpu_patched = True  # type: ignore[attr-defined]
    return reduce


def _rebuild_from_cpu(orig: Any) -> Any:
    """PyTorch's `_rebuild_device_tensor_from_cpu_tensor` refuses a callable `map_location` ("Callable
    map_location not supported"), which every storage-backed device accepts: the callable is given the
    tensor's CPU storage and its saved location, as torch.load gives it a storage and its tag, and the tensor
    goes to the device of the storage it returns (to the saved device when it returns None)."""

    @functools.wraps(orig)
    def rebuild(data: torch.Tensor, dtype: torch.dtype, device: str, requires_grad: bool) -> torch.Tensor:
        ml = torch.serialization._serialization_tls.map_location
        if ml is None or isinstance(ml, (dict, str, bytes, torch.device)) or not callable(ml):
            return orig(data, dtype, device, requires_grad)
        if data.device.type != "cpu":  # the callable already moved the CPU copy's storage: it stays there
            target: Any = data.device
        else:
            moved = ml(data.untyped_storage(), device)
            target = device if moved is None else moved.device
        tensor = data.to(dtype=dtype, device=target)
        tensor.requires_grad = requires_grad
        return tensor

    rebuild._hf_tpu_patched = True  # type: ignore[attr-defined]
    return rebuild


def install() -> None:
    """Route tpu tensors through PyTorch's storage-less save path and teach torch.load to restore to tpu."""
    orig = torch.Tensor._reduce_ex_internal
    if getattr(orig, "_hf_tpu_patched", False):
        return
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal(orig)  # type: ignore[method-assign]
    torch._utils._rebuild_device_tensor_from_cpu_tensor = _rebuild_from_cpu(
        torch._utils._rebuild_device_tensor_from_cpu_tensor)
    # before PyTorch's privateuse1 deserializer (priority 23), which allocates a tpu storage: none exists
    torch.serialization.register_package(15, _tag, _restore)
