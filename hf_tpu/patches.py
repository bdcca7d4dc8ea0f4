"""Every patch hf_tpu applies to Transformers, Accelerate, Diffusers (and torch), in one place.

Upstream already treats `tpu` right almost everywhere: `from_pretrained(device_map="tpu")`, `{"": "tpu:0"}`,
`dtype=`, sharded and `.bin` checkpoints, `pipe.to("tpu")`, and `generate`'s own compile (Transformers
picks `CompileConfig(backend="tpu", dynamic=False)` for a `tpu` model). A patch exists only where a test
in tests/hf_tpu/integration/test_patches.py fails without it; each names the upstream behaviour it fixes.

How they get applied without `import hf_tpu`: `import torch` autoloads hf_tpu (the `torch.backends` entry
point imports this package, whose __init__ calls `install()`). `install()` must stay cheap, so it imports
neither transformers nor accelerate: it puts an import hook on `sys.meta_path` that patches a target module
right after the module's own code has run (or at once, if it is already imported).

  accelerate.utils.modeling      get_max_memory                      (patch "auto_device_map")
  transformers.modeling_utils    check_and_set_device_map            (patch "tpu_unavailable_error")
  transformers.modeling_utils    caching_allocator_warmup            (patch "tpu_skip_allocator_warmup")
  transformers.modeling_utils    safe_open, load_state_dict          (patch "checkpoint_file_errors")
  transformers.core_model_loading  _materialize_copy                 (patch "tpu_direct_materialize")
  transformers.pytorch_utils     id_tensor_storage                   (patch "tpu_storage_identity")
  transformers.utils.output_capturing  _CanRecordRegistry.get        (patch "tpu_output_capture_guards")
  accelerate.state               PartialState.default_device         (patch "accelerate_tpu_device")
  safetensors.torch              load_file                           (patch "safetensors_tpu_load_file")
  torch                          Tensor.__deepcopy__                 (patch "tpu_deepcopy")
  torch                          _TorchCompileInductorWrapper        (patch "tpu_default_compile")

`applied()` lists the patches applied in this process; HF_TPU_NO_PATCHES=1 turns them all off (the tests
use it to show each patch is needed).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

_applied: list[str] = []
_installed = False
_busy: set[str] = set()


def applied() -> list[str]:
    """Names of the patches applied so far in this process."""
    _apply_pending()
    return list(_applied)


def _disabled() -> bool:
    return os.environ.get("HF_TPU_NO_PATCHES") == "1"


def _tpu_served_by_hf_tpu() -> bool:
    from hf_tpu import device

    return device.is_registered()


def _mark(name: str) -> None:
    if name not in _applied:
        _applied.append(name)


# ------------------------------------------------------------------------------------------------ patch 1
def _patch_accelerate_max_memory(mod: Any) -> None:
    """Upstream: accelerate's `get_max_memory()` (behind `device_map="auto"`, "balanced", "sequential")
    counts only CUDA, NPU, MLU, SDAA, MUSA, XPU and HPU devices, so with `tpu` as the accelerator it
    returns {"cpu": ...} and "auto" silently loads the whole model on CPU. Fix: when hf_tpu serves `tpu`
    and the caller gave no `max_memory`, add the tpu devices as integer ids, as accelerate does for CUDA
    (an integer device id is `torch.device(i)`, which is `tpu:i` with `tpu` as the current accelerator)."""
    orig = mod.get_max_memory
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def get_max_memory(max_memory: Any = None) -> Any:
        if not _tpu_served_by_hf_tpu():
            return orig(max_memory)
        if max_memory is None:
            result = orig(None)
            if any(isinstance(k, int) for k in result):
                return result  # another accelerator answered
            import torch

            return {**{i: _tpu_free_memory(i) for i in range(torch.tpu.device_count())}, **result}
        # An explicit budget (the user's, or the one Transformers computed from ours): upstream would warn
        # "Device 0 is not available" for the tpu ids, so it sees only the host entries.
        ints = {k: v for k, v in max_memory.items() if isinstance(k, int)}
        rest = orig({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        ints = {k: mod.convert_file_size_to_int(v) if isinstance(v, str) else v for k, v in sorted(ints.items())}
        return {**ints, **rest}

    get_max_memory._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.get_max_memory = get_max_memory
    # modules that bound the name before we got here
    for name in ("accelerate.utils", "transformers.integrations.accelerate"):
        other = sys.modules.get(name)
        for attr in ("get_max_memory", "accelerate_max_memory"):
            if other is not None and getattr(other, attr, None) is orig:
                setattr(other, attr, get_max_memory)
    _mark("auto_device_map")


def _tpu_free_memory(index: int) -> int:
    """Free bytes on tpu:index: JAX's memory stats where the platform has them, else (XLA:CPU, whose
    device memory is host memory) the host's available memory."""
    import psutil

    from hf_tpu import runtime

    try:
        stats = runtime.jax().devices()[index].memory_stats() or {}
    except Exception:
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return int(psutil.virtual_memory().available)


# ------------------------------------------------------------------------------------------------ patch 2
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


def _patch_device_map_check(mod: Any) -> None:
    """Upstream: with no backend serving `tpu`, `device_map="tpu"` fails inside `torch.device("tpu")` and
    Transformers re-raises "the value needs to be a device name (e.g. cpu, cuda:0) or 'auto', ...", which
    names neither the reason nor the fix. Fix: say why `tpu` is missing and how to get it."""
    orig = mod.check_and_set_device_map
    if getattr(orig, "_hf_tpu_patched", False):
        return

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

    check_and_set_device_map._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.check_and_set_device_map = check_and_set_device_map
    _mark("tpu_unavailable_error")


# ------------------------------------------------------------------------------------------------ patch 3
class CheckpointFileError(OSError):
    """A checkpoint file could not be read; `.path` names it."""

    def __init__(self, path: Any, exc: BaseException) -> None:
        self.path = str(path)
        super().__init__(
            f"Unable to load weights from checkpoint file {self.path!r}: {type(exc).__name__}: {exc}. The file "
            "is missing, truncated or corrupt: re-download it or save the model again."
        )


def _patch_allocator_warmup(mod: Any) -> None:
    """Upstream: `caching_allocator_warmup` allocates one model-sized `torch.empty` on each accelerator before
    loading, to pre-fill PyTorch's CUDA/XPU caching allocator (it already skips MPS and Neuron). hf_tpu has no
    caching allocator: JAX allocates and zero-fills that buffer and frees it again, which costs a
    model-sized transient (host memory on XLA:CPU) and the time to fill it. Fix: skip tpu, as for Neuron."""
    orig = mod.caching_allocator_warmup
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def caching_allocator_warmup(model: Any, expanded_device_map: Any, *args: Any, **kwargs: Any) -> Any:
        if _tpu_served_by_hf_tpu() and isinstance(expanded_device_map, dict):
            expanded_device_map = {k: v for k, v in expanded_device_map.items()
                                   if not _device_map_targets_tpu({k: v})}
        return orig(model, expanded_device_map, *args, **kwargs)

    caching_allocator_warmup._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.caching_allocator_warmup = caching_allocator_warmup
    _mark("tpu_skip_allocator_warmup")


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


def _patch_materialize_to_tpu(mod: Any) -> None:
    """Upstream: `core_model_loading._materialize_copy` moves each checkpoint tensor with
    `tensor.to(device)`. On hf_tpu that is PyTorch's generic path: `empty_strided` on tpu (a zero-filled
    device buffer) and then `copy_` (another buffer converted through `jnp.asarray`), so each tensor in
    flight costs about three times its size on the host, with two loader threads. Fix: for a tpu target,
    read the tensor on CPU (cast there if a dtype is asked for) and hand it to JAX, wrapped as the tpu
    tensor directly. A tensor read from a safetensors slice is a view of the memory-mapped checkpoint that
    nothing else references (or, cast on CPU, a fresh buffer), so on XLA:CPU the device array adopts that
    memory (`may_alias`) instead of copying it: as with `device_map="cpu"`, the weights stay in the page
    cache and come in on first use, with no host copy at all. A torch.Tensor handed in by the caller (a
    `state_dict=` argument, a legacy .bin) may be used again, so it is copied. Measured by
    benchmarks/load_bench.py."""
    orig = mod._materialize_copy
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def _materialize_copy(tensor: Any, device: Any = None, dtype: Any = None) -> Any:
        if device is not None and _is_hf_tpu_device(device):
            import torch

            fresh = not isinstance(tensor, torch.Tensor)  # a safetensors slice: `[...]` reads a new buffer
            cpu = tensor[...]
            if getattr(cpu, "device", None) is not None and cpu.device.type == "cpu":
                if dtype is not None and cpu.dtype != dtype:
                    cpu, fresh = cpu.to(dtype), True
                return _cpu_to_tpu(cpu, adopt=fresh)
        return orig(tensor, device, dtype)

    _materialize_copy._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod._materialize_copy = _materialize_copy
    _mark("tpu_direct_materialize")


def _cpu_to_tpu(t: Any, adopt: bool) -> Any:
    """`t` as a tpu tensor; with `adopt`, the device array may share `t`'s memory (t must not be used again)."""
    from hf_tpu import tensor as T

    if adopt and t.data_ptr() % T.XLA_ALIGN:
        # A checkpoint's tensors sit wherever its header ends (safetensors aligns to 8 bytes), so XLA would
        # copy this one out of the mapping now, pulling the file's pages into this process's RSS beside
        # the copy. Instead the tensor reads its bytes from the file (pread, into an aligned buffer XLA
        # adopts) on first use: loading costs nothing, as it does for a CPU tensor over the mapping.
        where = _mapped_range(t)
        if where is not None:
            return T.wrap_lazy(tuple(t.shape), t.dtype, functools.partial(_read_range, *where, t.dtype,
                                                                           tuple(t.shape)))
    return T.wrap(T.from_cpu(t, adopt=adopt), t.dtype)


class _OpenFile:
    """A checkpoint file held open (its inode stays readable even if the path is replaced) while any
    lazily read tensor still needs it."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


_open_files: weakref.WeakValueDictionary[tuple[int, int], _OpenFile] = weakref.WeakValueDictionary()


def _open_file(path: str) -> _OpenFile:
    """One open file per (device, inode), shared by the lazy tensors that read it; closed after the last."""
    st = os.stat(path)
    f = _open_files.get((st.st_dev, st.st_ino))
    if f is None:
        f = _open_files[(st.st_dev, st.st_ino)] = _OpenFile(path)
    return f


def _mapped_range(t: Any) -> tuple[_OpenFile, int, int] | None:
    """(open file, offset, nbytes) of a contiguous CPU tensor that is a view of a memory-mapped file; None
    if `t` is not such a view. Hand-written because neither safetensors nor torch says which file and
    offset a tensor maps (/proc/self/maps does, on Linux)."""
    nbytes = t.numel() * t.element_size()
    if not t.is_contiguous() or nbytes == 0 or not sys.platform.startswith("linux"):
        return None
    addr = t.data_ptr()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, _, offset, _, inode, *path = line.split()
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr and addr + nbytes <= hi:
                    break
            else:
                return None
        if inode == "0" or not path or not path[0].startswith("/"):
            return None  # anonymous memory: nothing to read again
        return _open_file(path[0]), addr - lo + int(offset, 16), nbytes
    except (OSError, ValueError):  # only memory is at stake: XLA copies instead
        return None


def _read_range(f: _OpenFile, pos: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """The bytes [pos, pos + nbytes) of `f` as a device array of `dtype` and `shape`, read with pread into
    a 64-byte-aligned host buffer that XLA:CPU adopts (one copy of the data, outside the page cache)."""
    import torch

    from hf_tpu import tensor as T

    buf = T.aligned_empty(nbytes)
    view = memoryview(buf)
    while view.nbytes:
        n = os.preadv(f.fd, [view], pos)
        if n <= 0:
            raise OSError(f"hf_tpu: checkpoint file ended early while reading {nbytes} bytes at offset {pos}")
        view, pos = view[n:], pos + n
    return T.from_cpu(torch.from_numpy(buf).view(dtype).reshape(shape), adopt=True)


def _patch_checkpoint_errors(mod: Any) -> None:
    """Upstream: a corrupt or truncated checkpoint fails in `from_pretrained` with the reader's own error:
    safetensors' "Error while deserializing header: ...", torch.load's "[Errno 22] Invalid argument" or
    "Weights only load failed", none naming the file (and in a sharded checkpoint the user cannot tell
    which shard). Fix: re-raise as `CheckpointFileError` (an OSError) naming the file, the original chained."""
    if getattr(mod.safe_open, "_hf_tpu_patched", False):
        return
    orig_open = mod.safe_open
    orig_load = mod.load_state_dict

    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig_open(filename, *args, **kwargs)
        except Exception as exc:
            raise CheckpointFileError(filename, exc) from exc

    @functools.wraps(orig_load)
    def load_state_dict(checkpoint_file: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig_load(checkpoint_file, *args, **kwargs)
        except CheckpointFileError:
            raise
        except Exception as exc:
            raise CheckpointFileError(checkpoint_file, exc) from exc

    safe_open._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.safe_open = safe_open
    mod.load_state_dict = load_state_dict
    _mark("checkpoint_file_errors")


def _is_hf_tpu_device(device: Any) -> bool:
    if isinstance(device, str):
        kind = device.split(":")[0]
    else:
        kind = getattr(device, "type", None)
    return kind == "tpu" and _tpu_served_by_hf_tpu()


def _patch_storage_identity(mod: Any) -> None:
    """Upstream: `pytorch_utils.id_tensor_storage` tells tensors that share memory apart by their storage's
    data pointer (torch_xla's tensors, which have none, get a special case). A tpu tensor's PyTorch storage
    has no data pointer either (its data is a JAX array), so every tpu tensor looked like one shared
    storage and `save_pretrained` of a tpu model failed with "The weights trying to be saved contained
    shared tensors". Fix: for hf_tpu's tensors, the identity of the device buffer they read (shared by
    views and tied weights, as a data pointer is)."""
    orig = mod.id_tensor_storage
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def id_tensor_storage(tensor: Any) -> Any:
        if getattr(tensor, "device", None) is not None and tensor.device.type == "tpu" \
                and _tpu_served_by_hf_tpu():
            from hf_tpu import tensor as T

            # (the size slot: 0, as the buffer identity alone is unique and reading a lazy buffer's
            # size would load it)
            return (tensor.device, T.storage_identity(tensor), 0)
        return orig(tensor)

    id_tensor_storage._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.id_tensor_storage = id_tensor_storage
    _mark("tpu_storage_identity")


# ------------------------------------------------------------------------------------------------ patch 5
def _patch_tensor_deepcopy() -> None:
    """Upstream (PyTorch): `Tensor.__deepcopy__` copies a PrivateUse1 tensor that has a storage through
    `UntypedStorage.clone()`, which allocates a tpu storage with PyTorch's allocator; a Python backend has
    none, so the process died with SIGSEGV (trainers, EMA models, Accelerate and Transformers' tests
    deep-copy tensors). Fix: a tpu tensor is copied at the level hf_tpu keeps its data: the new tensor
    reads a new device buffer holding the same JAX array (JAX arrays are immutable: a write replaces the
    buffer's array, so the copy never sees the original's writes). Buffers are memoised in `memo`, so
    tensors that share memory (a base and its views) still share it after one deepcopy, as on CPU.
    `UntypedStorage.clone()` of a tpu storage raises a clear error instead of crashing."""
    import torch

    orig = torch.Tensor.__deepcopy__
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def __deepcopy__(self: Any, memo: dict) -> Any:
        if (self.device.type != "tpu" or not _tpu_served_by_hf_tpu() or self.is_sparse or not self.is_leaf
                or torch.overrides.has_torch_function_unary(self)):
            return orig(self, memo)  # upstream's path (and its error for non-leaf tensors)
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = _tpu_tensor_copy(self, memo.setdefault("hf_tpu_buffers", {}))
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

    __deepcopy__._hf_tpu_patched = True  # type: ignore[attr-defined]
    torch.Tensor.__deepcopy__ = __deepcopy__

    orig_clone = torch.UntypedStorage.clone

    @functools.wraps(orig_clone)
    def clone(self: Any) -> Any:
        if self.device.type == "tpu" and _tpu_served_by_hf_tpu():
            raise RuntimeError(
                "UntypedStorage.clone() is not supported for hf_tpu's `tpu` storages (a Python backend has no "
                "PyTorch allocator): copy the tensor instead, with tensor.clone() or copy.deepcopy(tensor)."
            )
        return orig_clone(self)

    torch.UntypedStorage.clone = clone
    _mark("tpu_deepcopy")


def _tpu_tensor_copy(t: Any, buffers: dict[int, tuple[Any, Any]]) -> Any:
    """A new tpu tensor with t's shape, dtype and view of a copy of t's buffer; `buffers` maps an original
    buffer's id to (original, copy), so views of one buffer copied together share one copy.
    Written against hf_tpu.tensor's Buffer/Payload: the only place outside tensor.py that knows them."""
    from hf_tpu import tensor as T

    p = T.payload(t)
    hit = buffers.get(id(p.buf))
    if hit is None:
        # the original is kept in the entry so that its id cannot be reused by another buffer meanwhile
        hit = buffers[id(p.buf)] = (p.buf, T.Buffer(p.buf.array))
    new = T._create(tuple(t.shape), t.dtype)
    new.untyped_storage()._hf_tpu = T.Payload(hit[1], p.view)
    return new


def _patch_tensor_printing() -> None:
    """Upstream (PyTorch): printing a tensor indexes it element by element (the formatter calls `.item()` on
    each element's view). PyTorch copies xla/lazy/ipu/mtia tensors to CPU first for that reason (each indexing
    op compiles there), but not tpu: every printed element was a separately compiled read. Transformers'
    test_model_outputs_equivalence formats whole output tensors into an assertion message (60k `.item()`
    calls: 24x slower than on CPU, and the test that timed out on a loaded machine). Fix: `_tensor_str`, which
    formats the values, formats a tpu tensor's CPU copy; the caller still adds `device='tpu:0'`."""
    import torch._tensor_str as ts

    orig = ts._tensor_str
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def _tensor_str(self: Any, indent: int) -> str:
        if self.device.type == "tpu":
            self = self.detach().cpu()
        return orig(self, indent)

    _tensor_str._hf_tpu_patched = True  # type: ignore[attr-defined]
    ts._tensor_str = _tensor_str
    _mark("tpu_tensor_printing")


# ------------------------------------------------------------------------------------------------ patch 6
def _patch_default_compile() -> None:
    """Upstream (PyTorch): `torch.compile(model)` with no backend is Inductor, and Inductor's `tpu` device
    generates Pallas kernels that import torch_tpu, so a tpu model failed with "No module named
    'torch_tpu'" (Transformers' tests and most users compile without naming a backend). PyTorch's only
    hook for a default is the process-wide `set_default_backend`, which would also take CPU and CUDA
    models away from Inductor. Fix: Inductor's entry (`_TorchCompileInductorWrapper.__call__`, what the
    default and `backend="inductor"` call) hands a graph over tpu tensors to the "tpu" backend, which is
    what `backend="tpu"` runs; every other graph goes to Inductor as before."""
    import torch

    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_hf_tpu_patched", False):
        return
    orig = wrapper.__call__

    @functools.wraps(orig)
    def __call__(self: Any, model_: Any, inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        if _tpu_served_by_hf_tpu() and _graph_on_tpu(model_, inputs_):
            if self.config and not _warned_inductor_config:
                _warn_inductor_config(self.config)
            from hf_tpu.compile import tpu_backend

            return tpu_backend(model_, inputs_)
        return orig(self, model_, inputs_, *args, **kwargs)

    __call__._hf_tpu_patched = True  # type: ignore[attr-defined]
    wrapper.__call__ = __call__
    _mark("tpu_default_compile")


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


def _patch_output_capture_registry(mod: Any) -> None:
    """Upstream: `output_capturing._CAN_RECORD_REGISTRY` is one process-wide dict (a dict subclass) of the
    `_can_record_outputs` of every model class built so far, and a compiled forward looks its own class up
    in it. Dynamo guards that dict's whole key order, so a graph saved by the compile cache only loads in a
    process that built the same model classes in the same order: in a sweep worker (many models per
    process) two saved graphs in five failed to load with "IndexError: list index out of range" and were
    compiled again. The registry's value for a model is its class's `_can_record_outputs` (set in
    `PreTrainedModel.__init__`), so under compile it is read from the class, which the graph already
    depends on; eager keeps upstream's lookup."""
    registry = getattr(mod, "_CanRecordRegistry", None)
    if registry is None or getattr(registry.get, "_hf_tpu_patched", False):
        return
    orig = registry.get

    @functools.wraps(orig)
    def get(self: Any, model: Any) -> dict:
        import torch

        if torch.compiler.is_compiling():
            return getattr(type(model), "_can_record_outputs", None) or {}
        return orig(self, model)

    get._hf_tpu_patched = True  # type: ignore[attr-defined]
    registry.get = get
    _mark("tpu_output_capture_guards")


# ------------------------------------------------------------------------------------------------ patch 7
def _patch_accelerate_default_device(mod: Any) -> None:
    """Upstream: accelerate's `PartialState.default_device` tries MPS, MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU
    and Neuron by name and otherwise returns `cpu`: a PrivateUse1 accelerator is never chosen, so
    `Accelerator().device` was `cpu` with `tpu` present and Accelerate-based training silently ran on CPU.
    Fix: where upstream falls back to CPU and hf_tpu serves `tpu`, the device is `tpu:<current>` (what
    Transformers' TrainingArguments picks through `torch.accelerator`)."""
    import torch

    prop = mod.PartialState.default_device
    if getattr(prop.fget, "_hf_tpu_patched", False):
        return

    @functools.wraps(prop.fget)
    def default_device(self: Any) -> Any:
        dev = prop.fget(self)
        if dev.type == "cpu" and _tpu_served_by_hf_tpu():
            return torch.device("tpu", torch.tpu.current_device())
        return dev

    default_device._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.PartialState.default_device = property(default_device)
    _mark("accelerate_tpu_device")


# ------------------------------------------------------------------------------------------------ patch 8
def _patch_safetensors_load_file(mod: Any) -> None:
    """Upstream: safetensors' `load_file(path, device="tpu")` fails in its Rust reader ("device tpu is
    invalid"): it knows only the devices it can write to itself. Fix: read on CPU (memory-mapped), then move
    each tensor with `.to(device)`, as a user would."""
    orig = mod.load_file
    if getattr(orig, "_hf_tpu_patched", False):
        return

    @functools.wraps(orig)
    def load_file(filename: Any, device: Any = "cpu") -> dict[str, Any]:
        import torch

        if _is_hf_tpu_device(device):
            return {k: v.to(torch.device(device)) for k, v in orig(filename, device="cpu").items()}
        return orig(filename, device=device)

    load_file._hf_tpu_patched = True  # type: ignore[attr-defined]
    mod.load_file = load_file
    _mark("safetensors_tpu_load_file")


# ------------------------------------------------------------------------------------------ the import hook
_TARGETS: dict[str, list[Callable[[Any], None]]] = {
    "accelerate.utils.modeling": [_patch_accelerate_max_memory],
    "accelerate.state": [_patch_accelerate_default_device],
    "safetensors.torch": [_patch_safetensors_load_file],
    "transformers.modeling_utils": [_patch_device_map_check, _patch_allocator_warmup, _patch_checkpoint_errors],
    "transformers.core_model_loading": [_patch_materialize_to_tpu],
    "transformers.pytorch_utils": [_patch_storage_identity],
    "transformers.utils.output_capturing": [_patch_output_capture_registry],
}


_pending: dict[str, Any] = {}  # target modules that were still running their own code when we met them


def _initializing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _apply(name: str, module: Any, ran: bool = False) -> None:
    """Patch `module` (`ran`: its code has just run, from the finder's exec_module) now, or, if its own code is still running (it imported torch, whose autoload imported
    us), remember it: a half-run module lacks the names we patch, and patching it raised inside
    `import torch`. `_apply_pending()` finishes the job once the module has finished importing."""
    if sys.modules.get(name) is not module:
        _pending.pop(name, None)  # its import failed: nothing to patch
        return
    if not ran and _initializing(module):
        _pending[name] = module
        return
    _pending.pop(name, None)
    before = dict(vars(module))
    for patch in _TARGETS[name]:
        try:
            patch(module)
        except Exception as exc:  # a patch must never break an import; upstream's behaviour stays
            import warnings

            warnings.warn(f"hf_tpu: could not apply {patch.__name__} to {name}: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
    changed = {k: (old, vars(module)[k]) for k, old in before.items() if vars(module).get(k, old) is not old}
    if changed:
        _rebind(changed)


def _rebind(changed: dict[str, tuple[Any, Any]]) -> None:
    """Modules that copied a patched name (`from x import f`) before the patch was applied get the patched
    one too. Only a late patch (see `_apply`) can find such copies; scanning sys.modules costs ~1 ms."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, (old, new) in changed.items():
            if d.get(k) is old:
                d[k] = new


def _apply_pending() -> None:
    """Patch the target modules that have finished importing since we first met them half-run. Called
    on every later import (the finder below), on the first tpu op, and by `applied()`."""
    for name, module in list(_pending.items()):
        if not _initializing(module):
            _apply(name, module)


class _PatchingFinder:  # a meta path finder (duck-typed: importlib.abc costs ~15 ms at import torch)
    """Finds a target module with the other finders, and wraps its loader's `exec_module` so that the
    module is patched as soon as its code has run (before `from x import name` elsewhere copies names)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if _pending:
            _apply_pending()
        if fullname not in _TARGETS or fullname in _busy:
            return None
        _busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            _busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        orig_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            _apply(fullname, module, ran=True)

        loader.exec_module = exec_module  # this loader instance serves this one module
        return spec


def install() -> None:
    """Apply the patches (called when hf_tpu is imported, which `import torch` does). Cheap and idempotent."""
    global _installed
    if _installed or _disabled():
        return
    _installed = True
    sys.meta_path.insert(0, _PatchingFinder())
    for name in _TARGETS:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    if _tpu_served_by_hf_tpu():
        _patch_tensor_deepcopy()
        _patch_default_compile()
        _patch_tensor_printing()
