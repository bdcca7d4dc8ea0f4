"""How a `tpu` tensor holds its data: plain PrivateUse1 tensors with a JAX array behind them.

A tpu tensor is an ordinary `torch.Tensor` (PyTorch's documented pure-Python backend pattern), so
TorchDynamo captures it like any device tensor; its numbers live in a JAX array.

Aliasing is PyTorch's: views share a `Buffer` (one JAX array, the "storage") and address it through
their geometry (views.py: size/stride/offset steps, read and written on the device with regular XLA
ops, composed as views of views are taken; no per-element index). The payload hangs off the tensor's
storage, not the tensor, because PyTorch makes some aliases in C++ without dispatching to us
(`detach`, `squeeze`, `.data`): those share the StorageImpl, so they find the same payload. With the C++
hooks it is the storage's data pointer's context (hooks.cpp: so the storage keeps one owner, see
_mark_shared), else an attribute of the storage's Python object.

PyTorch sees every tpu tensor as contiguous with storage offset 0; view ops therefore arrive expressed in
the source tensor's logical (row-major) frame, which is the frame `views.compose` interprets them in.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import devices, dtypes, float8, fused, memory, views

_hold, _release = memory.hold, memory.release  # device memory accounting (memory.py)


class Buffer:
    """Device memory shared by a tensor and its views; `version` moves on every write.

    The array may come later: a Buffer made with a `loader` calls it on first use, as a CPU tensor over a
    memory-mapped checkpoint reads its pages on first use (see patches/checkpoint_reader.py), and as `empty` on a
    CUDA device costs nothing until written (a `to("tpu")` is `empty` then `copy_`: the copy replaces the
    array without the zeros ever being made). `shape` is known without loading."""

    __slots__ = ("_array", "_loader", "version", "shape", "ptr", "__weakref__")

    def __init__(self, array: Any = None, loader: Callable[[], Any] | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self._array = array
        self._loader = loader
        self.version = 0
        self.ptr = next(_pointers)
        if array is not None:
            shape = self.shape = tuple(array.shape)
            _hold(array, shape)
        else:
            self.shape = tuple(shape)  # type: ignore[arg-type]

    @property
    def array(self) -> Any:
        a = self._array
        if a is None:
            with _load_lock:  # two threads' first uses must not read (and allocate) twice
                if self._array is None:
                    value = self._loader()  # type: ignore[misc]
                    if self._array is None:  # a fused graph's loader may have set it (through the setter)
                        self._array = value
                        _hold(value, self.shape)
                    self._loader = None
            a = self._array
        return a

    @array.setter
    def array(self, value: Any) -> None:
        old = self._array
        self._array, self._loader = value, None
        shape = self.shape = tuple(value.shape)
        _hold(value, shape)
        if old is not None:
            _release(old)

    def replace_donated(self, value: Any) -> None:
        """Take `value`, made by a program the old array was donated to (its memory is the new one's): the old
        array is counted out before the new one is counted in, so device memory figures see one array."""
        old = self._array
        if old is not None:
            self._array = None
            _release(old)
        self.array = value
        self.version += 1

    def __del__(self, _release: Callable[[Any], None] = memory.release) -> None:
        # the bound default keeps the function reachable while modules are torn down at exit
        if self._array is not None:
            _release(self._array)

    def defer(self, loader: Callable[[], Any], shape: tuple[int, ...]) -> None:
        """Drop the array: `loader` makes the buffer's next one, of `shape` (a tpu storage resized with
        untyped_storage().resize_, storage_ops.resize_storage). A pending fused value no longer lands here."""
        old, pending = self._array, self._loader
        if type(pending) is fused.Node and pending.buf_ref is not None and pending.buf_ref() is self:
            pending.buf_ref = None
        self._array, self._loader, self.shape = None, loader, tuple(shape)
        self.version += 1
        if old is not None:
            _release(old)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


_load_lock = threading.Lock()
# What `data_ptr()` reports for a buffer's tensors (its views and aliases too, as a CUDA allocation's): unique
# per buffer, as libraries identify memory by it. Accelerate's offload hooks keep tied weights already moved
# to a device in a dict keyed by data_ptr(); when every tpu tensor reported 0 (a tpu storage holds no
# bytes) any weight onloaded to tpu was taken for the tied one already there (T5 under device_map="auto"
# with CPU offload got its embedding in place of a layer norm's weight). Addresses from 2**62 up are never
# real user-space memory on a 64-bit host (and never dereferenced: the storage holds 0 bytes).
_pointers = itertools.count(1 << 62, 64)


class Payload:
    """What a tensor sees of a Buffer: all of it (view None) or the geometry in `view` (views.View)."""

    __slots__ = ("buf", "view", "_cache_version", "_cache")

    def __init__(self, buf: Buffer, view: views.View | None = None) -> None:
        self.buf = buf
        self.view = view
        self._cache_version = -1
        self._cache = None


def _create(shape: tuple[int, ...] | list[int], dtype: torch.dtype, index: int, p: Payload) -> torch.Tensor:
    """A data-less tensor of tpu:`index` whose data_ptr() is its buffer's, with payload `p` (the C++ hooks set
    all three on its storage; without them there is one device, data_ptr() is 0, and the payload is an
    attribute of the storage's Python object, where autograd no longer sums gradients in place: see
    hooks.cpp's release_payload)."""
    t = torch._C._acc.create_empty_tensor(list(shape), dtype)  # always on tpu:0 (PyTorch's Python backend)
    set_device = devices.set_tensor_device
    if set_device is not None:
        set_device(t, index, p.buf.ptr, p)
    else:
        t.untyped_storage()._hf_tpu = p
    return t


# ------------------------------------------------------------------------------ several devices
# With HF_TPU_NUM_DEVICES=N > 1 (devices.py), tpu:i's arrays live on JAX device i. A tensor made from an
# array takes the array's device; one made before its array exists (empty, a pending fused value, a view)
# takes the device of the op making it, which dispatch sets per op (set_op_index) on the running thread.
_MULTI = devices.MULTI
_op = threading.local()


def op_index() -> int:
    """The tpu device index tensors made now belong to: the running op's, else the thread's current one."""
    i = getattr(_op, "index", None)
    return devices.current_device() if i is None else i


def set_op_index(index: int | None) -> int | None:
    """Make `index` the running op's device on this thread; returns the one it replaces (to restore)."""
    before = getattr(_op, "index", None)
    _op.index = index
    return before


@functools.cache
def jax_devices() -> tuple[Any, ...]:
    """The JAX devices behind tpu:0..N-1 (JAX's first N devices of its default platform)."""
    from hf_tpu import runtime

    jax = runtime.jax()
    found = tuple(jax.devices())
    if len(found) < devices.COUNT:
        raise RuntimeError(
            f"{devices.source_text()} asks for {devices.COUNT} tpu devices, but JAX has {len(found)} "
            f"({runtime.platform()}): JAX's backend started before hf-tpu could ask for more (import torch, or "
            f"hf_tpu, before anything uses JAX), or XLA_FLAGS sets {devices.XLA_COUNT_FLAG} lower.")
    return found[:devices.COUNT]


def jax_device(index: int) -> Any:
    return jax_devices()[index]


@functools.cache
def _index_by_id() -> dict[int, int]:
    return {d.id: i for i, d in enumerate(jax_devices())}


def index_of_array(array: Any) -> int:
    """The tpu device index an array lives on; a tracer (inside a traced program) belongs to the op's."""
    try:
        return _index_by_id()[array.sharding._device.id]  # SingleDeviceSharding's device: ~0.1 us
    except Exception:  # a tracer, or an array of another kind of sharding
        return op_index()


_view_replay_on = torch._C._is_view_replay_enabled


def _replay_views() -> None:
    """Make autograd replay view ops rather than call as_strided with a view's sizes, strides and offset,
    which on tpu (every tensor reports itself contiguous at offset 0) are not where the view sits in its
    base: `t[:, 2:].copy_(src)` gave src the gradient of `t[:, :3]` (CopySlices), and MLA attention
    (`key_states[..., :n].copy_(k_nope)`) trained on wrong gradients in eager. The flag
    (`_force_original_view_tracking`'s) is thread-local and changes how autograd regenerates views, not
    values; AOTAutograd's runtime wrapper may reset it, and the next tpu view sets it again."""
    torch._C._set_view_replay_enabled(True)


def _create_view(shape: Any, dtype: torch.dtype, base: torch.Tensor | None, p: Payload) -> torch.Tensor:
    """An empty tensor to hold a view of `base`. Under inference_mode a tensor created here is an inference
    tensor, but a view of a normal tensor must be normal: autograd's view tracking then gives it base's
    version counter, which an inference tensor refuses ("Cannot set version_counter for inference tensor",
    e.g. `weight.t()` in nn.Linear). CPU's views are normal because they copy base's dispatch keys.

    It also turns on autograd's view replay for this thread (see _replay_views): every eager tpu view passes
    here before autograd records it, so the recording replays the view op.

    And it marks the view's storage and base's as shared (_mark_shared)."""
    if not _view_replay_on():
        _replay_views()
    index = (base.device.index if base is not None else op_index()) if _MULTI else 0
    if base is not None and torch.is_inference_mode_enabled() and not base.is_inference():
        with torch.inference_mode(False):
            out = _create(shape, dtype, index, p)
    else:
        out = _create(shape, dtype, index, p)
    _mark_shared(out)
    if base is not None:
        _mark_shared(base)
    return out


def _mark_shared(t: torch.Tensor) -> None:
    """Make t's StorageImpl count two owners, as a CPU view's storage (shared with its base) does.

    A tpu view has a StorageImpl of its own (its payload holds its geometry) over its base's Buffer, so
    PyTorch would see one owner where the numbers have two readers. Autograd sums gradients in place into a
    gradient whose storage has one owner (InputBuffer::accumulate: `old.add_(new)`), and a gradient that is
    a view (a custom Function's backward returning a view of a tensor it keeps) would then be written through
    into the tensor it views (test_gradient_sums_in_place.py). In the PyTorch hf-tpu requires (2.13+) a
    storage whose Python object was ever made counts that object among its owners for the rest of its life:
    so making it marks the storage (the test fails should that change). A tensor made from a fresh array
    (wrap) is not marked, and autograd may sum into it in place, as on CPU."""
    t.untyped_storage()


def wrap(array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tpu tensor owning `array` (a jax.Array, possibly a tracer)."""
    if dtype is None:
        dtype = dtypes.to_torch(array.dtype)
    buf = Buffer(array)
    return _create(array.shape, dtype, index_of_array(array) if _MULTI else 0, Payload(buf))


def wrap_pending(node: Any, dtype: torch.dtype) -> torch.Tensor:
    """A new tpu tensor whose array a pending fused.Node makes when something reads it."""
    shape = node.aval[0]
    buf = Buffer(loader=node, shape=shape)
    t = _create(shape, dtype, op_index() if _MULTI else 0, Payload(buf))
    fused.attach(node, buf)
    return t


def wrap_lazy(shape: tuple[int, ...], dtype: torch.dtype, loader: Callable[[], Any],
              index: int | None = None) -> torch.Tensor:
    """A new tpu tensor whose array `loader()` makes on first use (it must return that shape and dtype), on
    tpu:`index`, else the running op's device (the array is moved there when the loader made it elsewhere)."""
    index = (op_index() if index is None else index) if _MULTI else 0
    buf = Buffer(loader=_placed(loader, index), shape=tuple(shape))
    return _create(shape, dtype, index, Payload(buf))


def zero_lazily(t: torch.Tensor) -> bool:
    """`t.zero_()` for a tensor that is its whole buffer: the array is dropped now and the zeros are made on
    first read, as `empty` makes them (False, and nothing done, for a view). Run as a program, zero_ filled a
    second buffer beside the old one; every optimizer's state starts as zeros_like (empty_like, then zero_):
    AdamW's first step on a 151,936 x 1,024 embedding peaked 0.6 GB higher than CPU's."""
    p = payload(t)
    buf = p.buf
    if p.view is not None or buf.numel != t.numel() or type(buf._loader) is fused.Node:
        return False
    shape, jdt = buf.shape, dtypes.to_jax(t.dtype)
    buf.defer(_placed(functools.partial(float8.zeros, shape, jdt), (t.device.index or 0) if _MULTI else 0), shape)
    return True


def _placed(loader: Callable[[], Any], index: int) -> Callable[[], Any]:
    """`loader` making its array on tpu:`index` (device 0, JAX's default, as it is)."""
    return functools.partial(_loaded_on, loader, index) if index else loader


def _loaded_on(loader: Callable[[], Any], index: int) -> Any:
    from hf_tpu import runtime

    return runtime.jax().device_put(loader(), jax_device(index))


def payload(t: torch.Tensor) -> Payload:
    get = devices.get_payload
    p = get(t) if get is not None else storage_payload(t.untyped_storage())
    if p is None:
        raise RuntimeError(
            f"hf_tpu: this {t.device} tensor has no data attached (shape {tuple(t.shape)}); it was made by "
            "a path that bypassed the tpu backend. Please report it with the code that made the tensor."
        )
    return p


def storage_payload(storage: Any) -> Payload | None:
    """The payload of a tpu tensor's UntypedStorage (the C++ hooks hand Python storages), or None."""
    get = devices.get_storage_payload
    return get(storage) if get is not None else getattr(storage, "_hf_tpu", None)


def copy_sharing(t: torch.Tensor, copies: dict[int, tuple[Buffer, Buffer]]) -> torch.Tensor:
    """A new tpu tensor with t's shape, dtype and view of a copy of t's buffer (copy.deepcopy of tpu tensors,
    patches/torch_patches.py). `copies` maps an original buffer's id to (original, copy): views of one buffer
    copied together share one copy, as on CPU. The array is shared, not copied: JAX arrays are immutable and
    a write replaces the buffer's array, so the copy never sees the original's writes."""
    p = payload(t)
    hit = copies.get(id(p.buf))
    if hit is None:
        # the original is kept in the entry so that its id cannot be reused by another buffer meanwhile
        hit = copies[id(p.buf)] = (p.buf, Buffer(p.buf.array))
    return _create(tuple(t.shape), t.dtype, t.device.index if _MULTI else 0, Payload(hit[1], p.view))


def is_tpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def value(t: torch.Tensor) -> Any:
    """The tensor's logical value as a JAX array of its shape."""
    p = payload(t)
    shape = tuple(t.shape)
    if p.view is None:
        a = p.buf.array
        return a if a.shape == shape else fit(a, shape)
    if p._cache_version != p.buf.version:
        p._cache = views.read_program(p.view)(p.buf.array)
        p._cache_version = p.buf.version
    c = p._cache
    return c.reshape(shape) if c.shape != shape else c


def row_major(t: torch.Tensor) -> Any:
    """t's values in row-major order, as a JAX array of t's shape or, for a whole buffer held in another shape of
    the same size (an `mm` result read as `(1, seq, vocab)` logits), the buffer's array as it is: for readers
    that give the numbers their shape on their own side (a copy to host memory reshapes a numpy view for free),
    which skips value()'s reshape program (on XLA:CPU a copy: ~5 ms of GPT-2's 12.9 MB logits per `.cpu()`)."""
    p = payload(t)
    if p.view is None:
        a = p.buf.array
        if a.size == t.numel():
            return a
    return value(t)


class Operand:
    """A tensor handed to a jitted op program as its buffer plus geometry, so that the program reads the
    view itself (fused into its consumer by XLA) instead of receiving a materialised copy."""

    __slots__ = ("tensor", "array", "key")

    def __init__(self, tensor: torch.Tensor, array: Any, key: tuple) -> None:
        self.tensor, self.array, self.key = tensor, array, key

    def materialise(self) -> Any:
        return value(self.tensor)


def operand(t: torch.Tensor, pending_ok: bool = False) -> Any:
    """What an op program gets for `t`: its array when it is a whole buffer of its shape, else an Operand
    (a regular view, or a reshape of a buffer) whose `key` is static and whose array is the buffer.
    A gather view already read since its last write is handed over as that value. With `pending_ok`
    (fused mode), a buffer whose op is still pending is handed over as its fused.Node, unrun."""
    p = payload(t)
    buf = p.buf
    shape = t.shape  # a torch.Size, equal to the tuple of the same sizes
    view = p.view
    a = buf._array
    if a is None:
        a = buf._loader if pending_ok and type(buf._loader) is fused.Node else buf.array
    if view is None:
        return a if buf.shape == shape else Operand(t, a, (None, tuple(shape)))
    if p._cache_version == buf.version or not views.fusable(view):
        return value(t)
    return Operand(t, a, (view, tuple(shape)))


def apply_operand(array: Any, key: tuple) -> Any:
    """Inside a program: an Operand's value from its buffer array (traceable)."""
    view, shape = key
    x = array if view is None else views.read(array, view)
    return x if x.shape == shape else fit(x, shape)


def fit(a: Any, shape: tuple[int, ...]) -> Any:
    """A whole buffer's array read as a tensor of `shape`: a reshape, or its first elements when its storage
    was grown past the tensor (`untyped_storage().resize_`, as CPU's tensor keeps reading the storage's
    first bytes). Traceable."""
    n = math.prod(shape)
    if a.size == n:
        return a.reshape(shape)
    if a.size < n:
        raise RuntimeError(f"hf_tpu: this tpu tensor of shape {list(shape)} needs {n} elements, but its "
                           f"storage holds {a.size} (it was resized smaller with untyped_storage().resize_)")
    return a.reshape(-1)[:n].reshape(shape)


def assign(t: torch.Tensor, new: Any) -> None:
    """Write `new` (broadcast and cast to t's shape and dtype) into t, and so into every alias of it."""
    shape = tuple(t.shape)
    want = dtypes.to_jax(t.dtype)
    if not is_jax_array(new):  # a Python scalar, a numpy array
        new = _jnp().asarray(new)
    p = payload(t)
    buf = p.buf
    # the value as the write needs it: t's dtype, broadcast to t's shape, in the frame the write takes
    frame = buf.shape if p.view is None and buf.numel == math.prod(shape) else (
        views.sizes(p.view) if p.view is not None else shape)
    if p.view is None and new.shape == shape and new.dtype == want and buf.numel == new.size:
        # t is the whole buffer in another shape (a gradient made by reshaping a whole result: 24 of a GPT-2's
        # 76): the buffer takes t's shape rather than a reshape program per write; an alias of the old shape
        # reads it through `fit` (views read the buffer flat, whatever its shape)
        frame = shape
    if new.dtype != want or new.shape != frame:
        new = _conform(new, shape, want, frame)
    if p.view is None and buf.numel == new.size:
        buf.array = new
    elif p.view is None:  # a C++ alias of another size over the whole buffer (rare): write its prefix
        flat = buf.array.reshape(-1)
        buf.array = flat.at[: new.size].set(new.reshape(-1)).reshape(buf.shape)
    else:
        buf.array = views.write_program(p.view)(buf.array, new)
    buf.version += 1


def is_jax_array(x: Any) -> bool:
    return hasattr(x, "aval") and hasattr(x, "dtype")  # a jax.Array or a tracer (ABC isinstance is slower)


_conform_program: Any = None


def _conform(new: Any, shape: tuple[int, ...], dtype: Any, frame: tuple[int, ...]) -> Any:
    """new cast to dtype, broadcast to shape, reshaped to frame: one XLA call (three eager jnp ops were three)."""
    global _conform_program
    if _conform_program is None:
        from hf_tpu import xla_options

        _conform_program = xla_options.jit(_conformed, static_argnums=(1, 2, 3))
    return _conform_program(new, shape, dtype, frame)


def _conformed(x: Any, shape: tuple[int, ...], dtype: Any, frame: tuple[int, ...]) -> Any:
    """x cast to dtype, broadcast to shape, reshaped to the frame a write takes; traceable."""
    return _jnp().broadcast_to(float8.cast(x, dtype), shape).reshape(frame)


def adopt_pending(t: torch.Tensor, res: torch.Tensor) -> bool:
    """Fused mode: make t's whole buffer the still-pending result `res` (an in-place or out= op's value),
    without running it; into a view of a buffer, a pending write (defer_write). False when `res` is not
    pending, or shapes or dtypes differ (then `assign` it)."""
    p, r = payload(t), payload(res)
    node = r.buf._loader
    if r.view is not None or r.buf._array is not None or type(node) is not fused.Node:
        return False
    if p.view is not None:
        return t.dtype == res.dtype and tuple(t.shape) == tuple(res.shape) and defer_write(t, res)
    if t.dtype != res.dtype or tuple(t.shape) != tuple(res.shape) or p.buf.numel != res.numel():
        return False
    _pend(p.buf, node)
    return True


def _pend(buf: Buffer, node: Any) -> None:
    """buf's contents become the pending `node`'s value; a pending node that held it before is no longer an
    output of its graph (nothing reads it through this buffer again)."""
    old = buf._loader
    if type(old) is fused.Node and old.buf_ref is not None and old.buf_ref() is buf:
        old.buf_ref = None
    if buf._array is not None:
        _release(buf._array)
    buf._array, buf._loader, buf.shape = None, node, node.aval[0]
    fused.attach(node, buf)
    buf.version += 1


def defer_write(t: torch.Tensor, src: torch.Tensor) -> bool:
    """Fused mode: write tpu tensor `src` (cast and broadcast to t's dtype and shape) into t, a whole buffer
    or a view of one, as a pending node, so that the write ends no graph: the buffer's new array is that
    node's value (every alias reads it through the buffer). `copy_` into a slice, an in-place op on a view,
    a KV-cache update. False (write now, with `assign`) when neither side is pending, when src is another
    view that needs a gather, or for the rare alias of another size over a whole buffer."""
    p = payload(t)
    buf = p.buf
    shape = tuple(t.shape)
    whole = p.view is None
    if whole and buf.numel != math.prod(shape):
        return False
    s = operand(src, pending_ok=True)
    skey = None
    if type(s) is Operand:
        s, skey = s.array, s.key
    base = None if whole else (buf._array if buf._array is not None else buf._loader)
    if base is not None and type(base) is not fused.Node:
        base = buf.array  # another lazy loader (an `empty`'s zeros, a checkpoint): load it now
    if type(s) is not fused.Node and type(base) is not fused.Node:
        return False
    frame = buf.shape if whole else views.sizes(p.view)
    fn = _write_fn(p.view, skey, shape, dtypes.to_jax(t.dtype), frame)
    node = fused.defer(fn, [s] if whole else [base, s], fused.current_op)
    _pend(buf, node)
    return True


@functools.lru_cache(maxsize=4096)
def _write_fn(view: views.View | None, src_key: tuple | None, shape: tuple[int, ...], dtype: Any,
              frame: tuple[int, ...]) -> Callable[[list[Any]], Any]:
    """The node function of a deferred write: one per geometry, so graphs that repeat share programs."""
    def write(inputs: list[Any]) -> Any:
        new = inputs[-1] if src_key is None else apply_operand(inputs[-1], src_key)
        new = _conformed(new, shape, dtype, frame)
        return new if view is None else views.write(inputs[0], view, new)

    return write


def replace(t: torch.Tensor, new: Any) -> None:
    """Give t new contents of a possibly different shape (resize_, out= of the wrong size)."""
    fresh = wrap(new, t.dtype)
    t.data = fresh  # shallow-copies size and StorageImpl in C++, so the payload follows


def make_view(src: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """A new tensor that aliases src's buffer as `src.as_strided(size, stride, offset)` in src's logical
    (row-major) frame."""
    return view_of(payload(src).buf, size, src.dtype, compose_view(src, size, stride, offset), src)


def compose_view(src: torch.Tensor, size: Any, stride: Any, offset: int) -> views.View | None:
    """The geometry, over src's buffer, of `src.as_strided(size, stride, offset)` (see make_view)."""
    p = payload(src)
    return views.compose(p.view, src.numel(), p.buf.numel, size, stride, offset)


def view_of(buf: Buffer, size: Any, dtype: torch.dtype, view: views.View | None,
            base: torch.Tensor | None = None) -> torch.Tensor:
    """A new tensor of `size` reading `view` of `buf` (a geometry from compose_view, or None: all of it);
    `base` is the tensor it is a view of (see _create_view)."""
    return _create_view(size, dtype, base, Payload(buf, view))


def view_reshape(src: torch.Tensor, size: list[int]) -> torch.Tensor:
    p = payload(src)
    if p.view is None:  # a reshape of the whole buffer: no geometry at all
        return _create_view(size, src.dtype, src, Payload(p.buf, None))
    return make_view(src, size, list(views._contiguous_strides(size)), 0)


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy
