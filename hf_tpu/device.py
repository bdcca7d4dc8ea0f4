"""Registering the `tpu` device with PyTorch: the PrivateUse1 backend, `torch.tpu`, hooks and the
fallback kernel. Nothing here imports JAX; the first op on a tpu tensor does."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import torch

from hf_tpu import foreach_ops, op_registry
from hf_tpu.no_dynamo import never_traced_by_dynamo as _never_traced_by_dynamo

_aten = torch.ops.aten

NAME = "tpu"
_registered = False
_lib: torch.library.Library | None = None


def _jax_started() -> bool:
    import sys

    return "jax" in sys.modules


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


_direct_done = False
_first_op_callbacks: list[Any] = []
_ready = False  # registration finished: other threads may dispatch
_first_op_lock = threading.RLock()  # reentrant: the callbacks may run tpu ops themselves


def on_first_op(fn: Any) -> None:
    """Call `fn()` when the first op reaches a tpu tensor (the patches' hook finishes a library imported
    before torch had finished importing: by then it has). Layers above the device register here, so the
    device imports none of them."""
    _first_op_callbacks.append(fn)


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    global _direct_done, _ready
    if not _ready:
        from hf_tpu import devices

        devices.check_config()  # a bad HF_TPU_NUM_DEVICES fails the first tpu op, not `import torch`
        # Under a lock: Transformers' loader moves weights in several threads, and a second thread's first
        # op found the flag set before `_dispatch` was bound ("'NoneType' object is not callable"). The
        # lock is reentrant and the flag set first: the first thread's registration may run tpu ops.
        with _first_op_lock:
            if not _direct_done:
                _direct_done = True
                _register_direct_kernels()
                for fn in _first_op_callbacks:
                    fn()
                _ready = True
    return _dispatch(op, args, kwargs)


# Ops whose composite kernels must keep running for tpu: they move data between devices. (`_to_copy` has a
# kernel of its own, storage_ops.to_copy, which runs a cast on one device itself and calls the composite for
# the rest.)
_KEEP_COMPOSITE = {p.__name__ for p in op_registry.mark("keep_composite", (
    _aten.copy_, _aten.to, _aten.lift_fresh, _aten.lift_fresh_copy, _aten.detach, _aten.alias,
    _aten.clone, _aten.contiguous, _aten._local_scalar_dense))}


def _register_direct_kernels() -> None:
    """Give every op we lower or decompose a PrivateUse1 kernel of its own (and its in-place and out= forms).

    Without one, composite kernels (CompositeExplicitAutograd, structured ops) run first and reach us as
    `empty` + `op.out`: two Python round trips per op instead of one. Done at first use, not at import,
    because it reads torchax's table (which imports JAX)."""
    from hf_tpu import decomposed, dispatch
    from hf_tpu.torchax_compat import load_op_table

    global _dispatch
    _dispatch = dispatch.dispatch
    from torch._decomp import decomposition_table

    lowerings, decomps = load_op_table()
    # ops with a decomposition too: eager runs it as one traced program (decomposed.py), so a kernel of their
    # own saves the composite's `empty` + `op.out` round trips there as well
    def names_of(table: Any) -> set[str]:
        packets = {getattr(k, "overloadpacket", k) for k in table
                   if isinstance(k, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))}
        names = {p.__name__ for p in packets}
        return names | {n + "_" for n in names}

    lowered = names_of(lowerings)
    decomposed_only = names_of([*decomps, *decomposition_table]) - lowered
    names = lowered | decomposed_only
    seen: set[str] = set()
    for name in sorted(names):
        if name in _KEEP_COMPOSITE or name.rstrip("_") in _KEEP_COMPOSITE:
            continue
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            qual = f"aten::{name}" + (f".{ov}" if ov != "default" else "")
            if qual in seen or op in PER_OP_KERNELS:
                continue
            seen.add(qual)
            if name in decomposed_only and not decomposed.traceable(op):
                continue  # keeps its composite path, as before
            try:
                if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeImplicitAutograd"):
                    continue  # decomposes above autograd: a backend kernel would never run
                if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "PrivateUse1"):
                    continue
                kernel = _direct_inplace_view if torch.Tag.inplace_view in op.tags else _direct
                _aten_lib.impl(op, functools.partial(kernel, op), "PrivateUse1")
            except RuntimeError:
                continue  # a Python-only overload (e.g. aten::__and__.bool): nothing to dispatch
    from hf_tpu import cross_entropy, sdpa  # noqa: F401 - register their "autograd" kernels

    for op, kernel in op_registry.table("autograd").items():
        _never_traced_by_dynamo(kernel)
        _aten_lib.impl(op, kernel, "AutogradPrivateUse1")


# dispatch.dispatch, bound when the direct kernels are registered; hf_tpu.hooks.observe_ops rebinds it (and
# dispatch.dispatch) while an observer runs, so the kernels below look up nothing else per op.
_dispatch: Any = None


def _direct(op: Any, *args: Any, **kwargs: Any) -> Any:
    # No import statement here: this runs on every op, and an import costs microseconds even when cached.
    return _dispatch(op, args, kwargs)


_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _direct_inplace_view(op: Any, *args: Any, **kwargs: Any) -> Any:
    # FunctionalTensorMode (AOTAutograd) calls in-place view ops (as_strided_, e.g. adaptive_avg_pool2d's
    # channels-last output) on its data-less wrapper to update sizes and strides only; the kernel CPU and
    # every backend without its own use (the composite one) does exactly that.
    if type(args[0]) is not torch.Tensor and not isinstance(args[0], torch.nn.Parameter):
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    return _dispatch(op, args, kwargs)


PER_OP_KERNELS = op_registry.mark("per_op_kernel", (
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten._copy_from.default,
    _aten._copy_from_and_resize.default,
    _aten.convolution_backward_overrideable.default,  # its composite kernel only raises (backward_lowerings.py)
    _aten._neg_view.default,  # composite: it would set the negative bit (dispatch._conj says why not)
    # composite outside CPU/CUDA: op by op, each rounded to a half input's type, where CPU's kernel computes in
    # float32 and rounds once (lowering_parity's OPMATH); as one op it gets that lowering
    _aten.mish_backward.default,
    # composite: a loop of single-tensor ops, one program per tensor; ours defers the step counters' add
    # (foreach_add.py) and runs torch.optim's other foreach ops as one program per call (foreach_ops.py)
    _aten._foreach_add_.Scalar,
    *foreach_ops.OPS,
))
_aten_lib: torch.library.Library | None = None


def guard() -> Any:
    """The start-up guard module (_hf_tpu_guard.py, standard library only, run before torch by
    hf_tpu_guard.pth), which also holds chip detection, so that the two can never disagree. It sits beside
    the hf_tpu package in every layout (a work tree, a wheel's site-packages, an editable install's source
    tree); it is loaded from there when its name is not importable (an editable install made before the
    module existed maps only hf_tpu and harness)."""
    try:
        import _hf_tpu_guard
    except ModuleNotFoundError:
        import importlib.util
        import sys

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_hf_tpu_guard.py")
        spec = importlib.util.spec_from_file_location("_hf_tpu_guard", path)
        _hf_tpu_guard = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(_hf_tpu_guard)  # type: ignore[union-attr]
        sys.modules["_hf_tpu_guard"] = _hf_tpu_guard
    return _hf_tpu_guard


GOOGLE_PCI_VENDOR: str = guard().GOOGLE_PCI_VENDOR


def tpu_chips_present(sys_pci: str = "/sys/bus/pci/devices", dev: str = "/dev") -> bool:
    """Whether a TPU chip is attached, detected as torch_tpu detects it (_hf_tpu_guard.tpu_chips_present)."""
    return guard().tpu_chips_present(sys_pci, dev)


def real_torch_tpu_present() -> bool:
    """torch_tpu is installed and TPU chips are attached: then it serves `tpu`, not us."""
    import importlib.util

    if os.environ.get("HF_TPU_FORCE_STANDIN") == "1":
        return False
    if importlib.util.find_spec("torch_tpu") is None:
        return False
    return tpu_chips_present()


def register() -> bool:
    """Make `tpu` a PyTorch device backed by JAX. Returns False if another backend already serves it."""
    global _registered, _lib
    if _registered:
        return True
    current = torch._C._get_privateuse1_backend_name()
    if current != "privateuseone":
        return False  # torch_tpu (or another backend) took PrivateUse1 first
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from hf_tpu import autocast, module_moves, native, precision, serialization, tpu_api

    for fn in (_fallback, _direct, _direct_inplace_view):
        _never_traced_by_dynamo(fn)
    # The C++ hooks first (pinned memory, generators, events, synchronize, memory statistics): PyTorch takes
    # a device's hooks and guard once, so the Python ones below are then declined; they serve when the C++
    # part cannot be built (hf_tpu/native).
    _install_native()
    _setup_privateuseone_for_python_backend(NAME, backend_module=tpu_api.build(), hook=_Hooks(), device_guard=_Guard())
    _lib = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a backend fallback, held for the process
    _lib.fallback(_fallback, "PrivateUse1")
    # A sparse CPU tensor moves to tpu (PyTorch builds the sparse tensor from moved dense parts without a
    # PrivateUse1 op), and then every op on it failed with "Could not run ... from the 'SparseCsrtpu'
    # backend". These raise the declared-unsupported error instead (docs/device.md).
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        _lib.fallback(_sparse_fallback, key)
    # PyTorch's Python dispatcher (used while Dynamo traces with fake tensors) cannot reach a Python
    # *fallback* ("func != nullptr" assert): ops it may send to PrivateUse1 get a per-op kernel too.
    global _aten_lib
    _aten_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    for op in PER_OP_KERNELS:
        _aten_lib.impl(op, functools.partial(_fallback, op), "PrivateUse1")
    precision.install()
    module_moves.install()
    serialization.install()
    autocast.install()
    if torch.distributed.is_available() and torch.distributed.is_gloo_available():
        from hf_tpu import process_group

        process_group.register()  # torch.distributed's `tpu_dist` for tpu tensors (gloo on CPU copies)
    _registered = True
    return True


def _sparse_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    from hf_tpu.errors import Unsupported

    raise Unsupported(op, "sparse layouts have no XLA representation (tpu tensors are dense, strided)",
                      "Keep the tensor dense on tpu (x.to_dense() before the move), or run the sparse op on CPU.")


def _install_native() -> None:
    """The C++ hooks, and the device call-backs tensors take from them; several devices need them (a
    tensor's device index is set in C++, and PyTorch asks the hooks how many devices there are)."""
    from hf_tpu import devices, native

    if native.install():
        devices.set_tensor_device = native.set_tensor_device
        devices.get_payload = native.payload
        devices.get_storage_payload = native.storage_payload
        devices.current_device = native.current_device
    elif devices.MULTI and devices.ERROR is None:
        # raised on the first tpu op (devices.check_config), not here: `import torch` registers `tpu`
        devices.ERROR = (
            f"{devices.source_text()}: several tpu devices need hf-tpu's C++ hooks, which could not be loaded "
            f"({native.status()['reason'].splitlines()[0]}). Install g++ and ninja, or unset {devices.ENV}.")


def is_registered() -> bool:
    return _registered
