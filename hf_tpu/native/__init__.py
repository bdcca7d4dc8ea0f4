"""hf-tpu's C++ hooks (hooks.cpp): built once per machine, loaded when `tpu` is registered.

PyTorch takes some of a device's hooks only from C++ (pinned memory, torch.Generator("tpu"), events and
synchronisation through the device guard, the allocator behind torch.accelerator.memory_*, storage
resizing). hooks.cpp provides them and asks Python (`_Callbacks` below) whatever depends on hf-tpu's JAX
arrays. It also holds each tpu storage's payload (hf_tpu.tensor.Payload) as its data pointer's context, and
`payload(tensor)` reads it.

How it is built: `torch.utils.cpp_extension.load` compiles hooks.cpp with the torch already installed
(g++ and ninja, no pip, no second torch) into a cache directory keyed by the source, torch and Python
versions: `$TORCH_EXTENSIONS_DIR`, else ~/.cache/hf_tpu/native. The first `import torch` on a machine
builds it (15-20 s on two busy cores, see docs/device.md); later imports load the cached library in
milliseconds without importing the build machinery. Processes starting together wait for one build.
Without a compiler (or with HF_TPU_NATIVE=0), `tpu` is registered with PyTorch's Python hooks and the
features above raise PyTorch's own errors; `status()` says which happened."""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ENV = "HF_TPU_NATIVE"
SOURCE = Path(__file__).with_name("hooks.cpp")

_status: dict[str, Any] = {"loaded": False, "reason": "not loaded yet"}
_lib: ctypes.PyDLL | None = None
_set_device: Any = None
payload: Any = None  # payload(tensor): the payload on a tpu tensor's storage, or None (a builtin of hooks.cpp)
_storage_payload: Any = None


class _Callbacks:
    """What hooks.cpp asks Python (method names are its C++ calls; `index` is a tpu device's, resolved)."""

    def synchronize(self) -> None:
        from hf_tpu.tpu_api import device_api

        device_api.synchronize()

    def memory_stats(self, index: int) -> tuple[int, ...]:
        from hf_tpu import memory

        return memory.stats(index)

    def reset_peak_memory_stats(self, index: int) -> None:
        from hf_tpu import memory

        memory.reset_peak(index)

    def reset_accumulated_memory_stats(self, index: int) -> None:
        from hf_tpu import memory

        memory.reset_accumulated(index)

    def empty_cache(self) -> None:
        pass  # hf-tpu caches no device memory: JAX frees an array when its last tensor dies

    def resize_storage(self, storage: Any, nbytes: int) -> None:
        from hf_tpu import storage_ops

        storage_ops.resize_storage(storage, nbytes)

    def memory_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device `index`: the stand-in's devices share the host's memory, so each
        has all of it (as the figure a process sharing a GPU sees)."""
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)


_CALLBACKS = _Callbacks()


def _module_name() -> str:
    import torch

    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{sys.version}|{sys.platform}".encode())
    return f"hf_tpu_hooks_{h.hexdigest()[:12]}"


def _build(name: str, directory: Path) -> Path:
    """Compile hooks.cpp into directory/name.so (torch.utils.cpp_extension: ninja, with a lock that makes
    processes starting together wait for one build)."""
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    print(f"hf_tpu: building the tpu device's C++ hooks once for this machine into {directory} ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(directory),
                       extra_cflags=["-O2"], is_python_module=False, verbose=False)
    _status["build_seconds"] = round(time.perf_counter() - start, 1)
    print(f"hf_tpu: built in {_status['build_seconds']} s", file=sys.stderr, flush=True)
    return directory / f"{name}.so"


def load() -> ctypes.PyDLL | None:
    """The hooks library, built if this machine has none yet; None (with a warning) when it cannot be."""
    global _lib
    if _lib is not None:
        return _lib
    if os.environ.get(ENV) == "0":
        _status.update(loaded=False, reason=f"{ENV}=0")
        return None
    try:
        name = _module_name()
        from hf_tpu import runtime

        directory = runtime.native_build_dir() / name
        path = directory / f"{name}.so"
        done = directory / "built"  # written after a build loaded: a half-linked library is never used
        if not done.exists():
            path = _build(name, directory)
            done.write_text(f"{_status.get('build_seconds')}\n")
        _lib = ctypes.PyDLL(str(path))  # PyDLL: the install call takes Python objects with the GIL held
        _lib.hf_tpu_native_install.argtypes = [ctypes.py_object, ctypes.c_int, ctypes.c_char_p]
        _lib.hf_tpu_native_install.restype = ctypes.c_int
        _lib.hf_tpu_native_set_device.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.py_object]
        _lib.hf_tpu_native_set_device.restype = None
        _lib.hf_tpu_native_storage_payload.argtypes = [ctypes.c_void_p]
        _lib.hf_tpu_native_storage_payload.restype = ctypes.py_object  # a new reference, which ctypes takes
        _lib.hf_tpu_native_payload_function.argtypes = []
        _lib.hf_tpu_native_payload_function.restype = ctypes.py_object
        global _set_device, payload, _storage_payload
        # bound once: called for every tpu tensor made, and for every op's operands
        _set_device = _lib.hf_tpu_native_set_device
        payload = _lib.hf_tpu_native_payload_function()
        _storage_payload = _lib.hf_tpu_native_storage_payload
        _lib.hf_tpu_native_current_device.argtypes = []
        _lib.hf_tpu_native_current_device.restype = ctypes.c_int
        _status.update(path=str(path))
    except Exception as exc:  # no compiler, no ninja, an unwritable cache: Python hooks instead
        _status.update(loaded=False, reason=f"{type(exc).__name__}: {exc}")
        warnings.warn(
            "hf_tpu: could not build or load the tpu device's C++ hooks (" + _status["reason"].splitlines()[0]
            + "); tensor.pin_memory(), DataLoader(pin_memory=True), torch.Generator('tpu'), torch.Event('tpu') "
            "and torch.accelerator's synchronize/memory functions will fail. Install g++ and ninja, then "
            "restart Python.", RuntimeWarning, stacklevel=2)
        return None
    return _lib


def install() -> bool:
    """Register the C++ hooks, device guard and allocator for PrivateUse1 (before the Python ones, which
    PyTorch then declines: it takes a device's hooks once). False when they could not be loaded."""
    from hf_tpu import devices

    lib = load()
    if lib is None:
        return False
    if not lib.hf_tpu_native_install(_CALLBACKS, devices.COUNT, devices.source_text().encode()):
        _status.update(loaded=False, reason="another backend registered PrivateUse1 hooks first")
        return False
    _status.update(loaded=True, reason="")
    return True


def status() -> dict[str, Any]:
    """Whether the C++ hooks serve `tpu`, from where, or why not."""
    return dict(_status)


def set_tensor_device(t: Any, index: int, ptr: int, payload: Any) -> None:
    """Put `t`, a data-less tpu tensor just made (on tpu:0), on tpu:`index`, its data_ptr() reporting `ptr`,
    with `payload` (hf_tpu.tensor.Payload) on its storage (hooks.cpp says how)."""
    _set_device(t._cdata, index, ptr, payload)


def storage_payload(storage: Any) -> Any:
    """The payload on a tpu UntypedStorage, or None."""
    return _storage_payload(storage._cdata)


def current_device() -> int:
    """This thread's current tpu device (the C++ guard's, which PyTorch's device guards move too); 0
    without the C++ hooks, which then serve one device only."""
    return _lib.hf_tpu_native_current_device() if _status["loaded"] else 0  # type: ignore[union-attr]
