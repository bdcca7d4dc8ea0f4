"""Float32 weights of compiled inference graphs packed once in MKL's GEMM format, their arrays dropped.

Why (issue 31): a compiled GPT-2 forward on XLA:CPU is ~95% float32 dots, and XLA's dot (YNNPACK) re-packs its
weight operand on every call, ~38% of its dot time; PyTorch's oracle runs the same GEMMs through MKL. Packing a
weight once (MKL's cblas_sgemm_pack) and computing every later product from the packed copy
(cblas_sgemm_compute, an XLA FFI handler in native/packed_dot.cpp writing straight into XLA's result buffer)
took the forward from 0.98x to 0.82-0.85x of CPU eager's time, paired in one process on a quiet host (on a host
running at half speed: no measurable gain, docs/device.md's figures). To keep memory where
it was, the weight's array is dropped once its packed copy exists, and rebuilt from the copy when anything else
reads it (Buffer.defer: the rebuilt array holds the weight's bits, see _exact below).

Which weights (decided from the FX graph alone, so that a graph-cache hit, which traces nothing, decides the
same): a 2-D float32 graph input whose every use is the second operand of a 2-D mm/addmm, directly (a Conv1D
weight) or through one transpose (nn.Linear's `t(weight)`), with a 1-D bias and unit beta/alpha, and in one
graph compiled for inference (AOTAutograd's inference compiler: no backward reads it). A weight also read
otherwise (a tied embedding's gather) keeps its array and XLA's dot. Only at matmul precision "highest" (the
packed product is float32 at IEEE precision; "high"/"medium" round the operands first, and a rounded packed
copy could not rebuild the weight), on XLA:CPU, and where the process's PyTorch exports MKL (x86 builds).

Per call (graph_compiler's `call`), each such input that is a whole float32 tpu tensor is handed to the program
as an int64 key naming its packed copy, packed now if it is new or was written since (Buffer.version); the
program is traced once per set of keyed inputs. HF_TPU_PACKED_WEIGHTS=0 turns it off, as does
HF_TPU_TORCH_DOTS=all (float32 dots by PyTorch's matmul, for its bits: torch_dot_ffi.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import memory, precision, runtime, torch_dot_ffi
from hf_tpu import tensor as T

ENV = "HF_TPU_PACKED_WEIGHTS"
ENABLED = os.environ.get(ENV, "1") != "0"
# Smaller weights are left to XLA's dot: packing saves per call about what re-packing costs, which is little for
# a small weight, and every packed input is one more traced variant of the program.
MIN_ELEMENTS = int(os.environ.get("HF_TPU_PACKED_MIN_ELEMENTS", str(1 << 16)))
_aten = torch.ops.aten
_TRANSPOSES = (_aten.t.default, _aten.permute.default, _aten.transpose.int)
_UNPACK_CHECK_ROWS = 64  # rows of the packed copy read back and compared when it is made


@dataclasses.dataclass(frozen=True)
class Use:
    transposed: bool  # read as weight.t() (an nn.Linear weight, stored out x in)
    rows: int  # rows of the products (MKL packs for a row count: the first graph's)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_transpose(node: torch.fx.Node) -> bool:
    if node.target is _aten.t.default:
        return True
    if node.target is _aten.permute.default:
        return [d % 2 for d in node.args[1]] == [1, 0]
    if node.target is _aten.transpose.int:
        return {node.args[1] % 2, node.args[2] % 2} == {0, 1}
    return False


def _dot_rows(node: torch.fx.Node, weight: torch.fx.Node, n: int) -> int | None:
    """The row count of `node` when it is a float32 mm/addmm taking `weight` as its second operand only
    (result columns n), else None."""
    if node.target is _aten.mm.default and len(node.args) == 2 and not node.kwargs:
        x, w, bias = node.args[0], node.args[1], None
    elif node.target is _aten.addmm.default and len(node.args) == 3 and all(
            node.kwargs.get(k, 1) == 1 for k in ("beta", "alpha")) and set(node.kwargs) <= {"beta", "alpha"}:
        bias, x, w = node.args
        bv = _val(bias)
        if not (isinstance(bv, torch.Tensor) and bv.dtype == torch.float32 and tuple(bv.shape) == (n,)):
            return None
    else:
        return None
    xv = _val(x)
    if w is not weight or x is weight or bias is weight or not isinstance(xv, torch.Tensor) \
            or xv.dtype != torch.float32 or xv.ndim != 2 or not isinstance(xv.shape[0], int):
        return None
    return int(xv.shape[0])


def graph_uses(gm: torch.fx.GraphModule) -> tuple[dict[int, Use], set[torch.fx.Node], set[torch.fx.Node]]:
    """{placeholder position: Use} for the inputs that may be packed, and the transpose and dot nodes reading
    them."""
    uses: dict[int, Use] = {}
    transposes: set[torch.fx.Node] = set()
    dots: set[torch.fx.Node] = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, p in enumerate(placeholders):
        v = _val(p)
        # (the device is checked per call: a graph loaded from the graph cache has meta tensors here)
        if not (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.ndim == 2
                and all(isinstance(d, int) for d in v.shape) and v.numel() >= MIN_ELEMENTS) or not p.users:
            continue
        forms, rows, ts, ds = set(), set(), set(), set()
        for u in p.users:
            if _is_transpose(u) and u.users:
                forms.add(True)
                ts.add(u)
                for d in u.users:
                    rows.add(_dot_rows(d, u, int(v.shape[0])))
                    ds.add(d)
            else:
                forms.add(False)
                rows.add(_dot_rows(u, p, int(v.shape[1])))
                ds.add(u)
        if len(forms) == 1 and len(rows) == 1 and None not in rows:
            uses[i] = Use(forms.pop(), rows.pop())
            transposes |= ts
            dots |= ds
    return uses, transposes, dots


class _Keyed:
    """A packed weight's key seen through a transpose inside the traced graph (no dtype or shape: the graph
    runner leaves it as it is)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def _key_of(w: Any) -> Any:
    if isinstance(w, _Keyed):
        return w.key
    if getattr(w, "ndim", None) == 0 and str(getattr(w, "dtype", "")) == "int64":
        return w  # a placeholder handed a key (a float32 2-D weight otherwise)
    return None


def _packed_dot(x: Any, key: Any, bias: Any, n: int) -> Any:
    jax = runtime.jax()
    out = jax.ShapeDtypeStruct((x.shape[0], n), x.dtype)
    if bias is None:
        return jax.ffi.ffi_call("hf_tpu_packed_mm", out)(x, key)
    return jax.ffi.ffi_call("hf_tpu_packed_addmm", out)(bias, x, key)


class GraphPacking:
    """The packable inputs of one compiled inference graph: the node wrapper its lowering takes
    (graph_compiler.to_jax_function's wrap_node) and, per call, the keys of the inputs handed over packed."""

    def __init__(self, uses: dict[int, Use], transposes: set[torch.fx.Node], dots: set[torch.fx.Node]) -> None:
        self.uses, self.transposes, self.dots = uses, transposes, dots

    def wrap_node(self, node: torch.fx.Node, fn: Callable[..., Any]) -> Callable[..., Any]:
        if node in self.transposes:
            def transpose(a: Any, *rest: Any, **kw: Any) -> Any:
                key = _key_of(a)
                return _Keyed(key) if key is not None else fn(a, *rest, **kw)

            return transpose
        if node in self.dots:
            n = int(_val(node).shape[1])
            if node.target is _aten.mm.default:
                def mm(x: Any, w: Any) -> Any:
                    key = _key_of(w)
                    return fn(x, w) if key is None else _packed_dot(x, key, None, n)

                return mm

            def addmm(bias: Any, x: Any, w: Any, **kw: Any) -> Any:
                key = _key_of(w)
                return fn(bias, x, w, **kw) if key is None else _packed_dot(x, key, bias, n)

            return addmm
        return fn

    def keys(self, args: list[Any]) -> dict[int, Any]:
        """{argument position: key array} for the packable arguments handed over packed on this call (packing
        the new and the written ones now, dropping their arrays); {} when none is."""
        if precision.current() != "highest":
            return {}
        out = {}
        for i, use in self.uses.items():
            t = args[i] if i < len(args) else None
            if not (T.is_tpu(t) and t.dtype == torch.float32) or t.requires_grad and torch.is_grad_enabled():
                continue
            got = _key(t, use)
            if got is not None:
                out[i] = got[0]
                if got[1]:  # after each drop: the next copy must not be made beside every freed array
                    _trim()
        return out


def for_graph(gm: torch.fx.GraphModule) -> GraphPacking | None:
    """The graph's packing, or None when no input of it may be packed (or packing is off or unavailable)."""
    if not ENABLED or "float32" in torch_dot_ffi.DTYPES:  # HF_TPU_TORCH_DOTS=all asked for PyTorch's own bits
        return None
    uses, transposes, dots = graph_uses(gm)
    if not uses or not available():
        return None
    return GraphPacking(uses, transposes, dots)


@functools.cache
def _lib() -> Any:
    """The handler library's packing entry points with their C signatures, or None."""
    lib = torch_dot_ffi.library()
    if lib is None:
        return None
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for name, res, args in (("hf_tpu_packed_available", c_int, ()),
                            ("hf_tpu_packed_pack", i64, (i64, ptr, c_int, c_int, c_int, c_int)),
                            ("hf_tpu_packed_unpack", c_int, (i64, ptr, c_int, c_int)),
                            ("hf_tpu_packed_free", None, (i64,)), ("hf_tpu_packed_dot_calls", i64, ())):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@functools.cache
def available() -> bool:
    """Whether weights can be packed here: XLA:CPU, the handler library loaded, MKL in this PyTorch."""
    if runtime.platform() != "cpu":
        return False
    lib = _lib()
    return lib is not None and bool(lib.hf_tpu_packed_available())


def calls() -> int:
    """Products the packed-dot handler computed in this process (0 before the library is loaded)."""
    lib = _lib() if torch_dot_ffi.status().get("registered") else None
    return 0 if lib is None else int(lib.hf_tpu_packed_dot_calls())


# ------------------------------------------------------------------------------------------ the packed copies
@dataclasses.dataclass
class _Entry:
    key: int | None  # None: this version of the weight is not packed (not exactly recoverable, shared)
    version: int  # the Buffer's version this entry describes
    use: Use | None = None
    n: int = 0
    k: int = 0
    nbytes: int = 0
    device: Any = None
    key_array: Any = None  # the key as a 0-d JAX array on the weight's device (what the program takes)
    freed: bool = False
    finalizer: Any = None  # weakref.finalize freeing the copy with its buffer

    def free(self) -> None:
        if self.key is None or self.freed:
            return
        for wait in before_free:  # programs still queued may read the copy
            wait()
        self.freed = True
        lib = _lib()
        if lib is not None:
            lib.hf_tpu_packed_free(self.key)
        memory.release_bytes(self.nbytes)


_entries: weakref.WeakKeyDictionary[Any, _Entry] = weakref.WeakKeyDictionary()  # Buffer -> its packed copy
_read_elsewhere: weakref.WeakSet[Any] = weakref.WeakSet()  # Buffers whose dropped array something read back
_keys = itertools.count(1)
_lock = threading.Lock()
_warned = False  # _unpacked's warning given in this process
# Called before a packed copy is freed, to wait for the programs that may still read it: eager's packed dots
# run asynchronously (packed_eager.py); a compiled graph's call waits for its program itself.
before_free: list[Callable[[], None]] = []


def _key(t: torch.Tensor, use: Use) -> tuple[Any, bool] | None:
    """(key array, whether an array was dropped now) for tensor t's packed copy, made now if needed; None when t
    is not handed over packed."""
    p = T.payload(t)
    buf = p.buf
    if p.view is not None or buf.shape != tuple(t.shape):
        return None
    with _lock:
        e = _entries.get(buf)
        if buf in _read_elsewhere:  # see _unpacked
            if e is not None and e.finalizer is not None:
                e.finalizer()
                del _entries[buf]
            return None
        if e is None or e.version != buf.version:  # new, or written since it was packed
            if e is not None and e.finalizer is not None:
                e.finalizer()  # frees the stale copy now, once (and no longer when the buffer dies)
            e = _entries[buf] = _pack(buf, use)
            if e.key is not None:
                e.finalizer = weakref.finalize(buf, e.free)
        if e.key is None or e.use.transposed != use.transposed:
            return None  # not packable at this version, or packed for the other form
        # (another row count takes the same copy: a generate() loop's prefill and decode graphs share it. MKL
        # packs B for a row count, but cblas_sgemm_compute reads the layout the copy records: products of 1,
        # 3, 100 and 200 rows from a copy packed for 64 matched a fresh copy's or were within float32's error,
        # tests/hf_tpu/test_packed_weights.py)
        dropped = False
        if buf._array is not None and memory.holders(buf._array) == 1:  # packed now, or read back since
            _drop(buf, e)
            dropped = True
        return e.key_array, dropped


def dropped_key(buf: Any, transposed: bool) -> Any | None:
    """The key array of buf's packed copy when its array is dropped (nothing read it back since), the copy is of
    buf's version and was packed in this form (whole or transposed); else None. For packed_eager.py."""
    e = _entries.get(buf)
    if e is None or e.key is None or e.version != buf.version or buf._array is not None \
            or e.use.transposed != transposed:
        return None
    return e.key_array


def may_pack(buf: Any) -> bool:
    """Whether buf's weight may still be packed: it was not read back from a copy (_unpacked), and not found
    unpackable at its present version. For packed_eager.py."""
    if buf in _read_elsewhere:
        return False
    e = _entries.get(buf)
    return e is None or e.key is not None or e.version != buf.version


def forget(buf: Any) -> None:
    """Free buf's packed copy, its array rebuilt first if it is still dropped. For packed_eager.py."""
    with _lock:
        e = _entries.pop(buf, None)
    if e is None:
        return
    if e.key is not None and e.version == buf.version and buf._array is None:
        buf.array  # noqa: B018 - runs the loader: the array back from the copy before the copy goes
    if e.finalizer is not None:
        e.finalizer()


def pack_now(buf: Any, use: Use) -> Any | None:
    """Pack buf's weight now and drop its array (packed_eager.py, once a weight proved to be read by dots
    alone): the copy's key array, or None when the weight cannot be packed (remembered for this version)."""
    with _lock:
        e = _entries.get(buf)
        if e is not None and e.finalizer is not None:
            e.finalizer()
        e = _entries[buf] = _pack(buf, use)
        if e.key is None:
            return None
        e.finalizer = weakref.finalize(buf, e.free)
        _drop(buf, e)
    _trim()
    return e.key_array


def _exact(w: Any) -> bool:
    """Whether the identity product rebuilds w bit for bit: each element comes back as 1 * w plus exact zeros,
    which is w for every finite value but -0.0 (+0.0 then) and, should MKL flush them, subnormals."""
    import numpy as np

    a = np.abs(w)
    if not np.isfinite(a).all():
        return False
    return not ((a < np.finfo(np.float32).tiny) & ((w != 0) | np.signbit(w))).any()


def _pack(buf: Any, use: Use) -> _Entry:
    import numpy as np

    version = buf.version
    arr = buf.array
    if memory.holders(arr) > 1:  # another tensor holds the same array: dropping ours would free nothing
        return _Entry(None, version)
    w = np.asarray(arr)
    if w.dtype != np.float32 or w.ndim != 2 or not _exact(w):
        return _Entry(None, version)
    w = np.ascontiguousarray(w)
    n, k = (w.shape[0], w.shape[1]) if use.transposed else (w.shape[1], w.shape[0])
    lib = _lib()
    key = next(_keys)
    if not lib.hf_tpu_packed_pack(key, w.ctypes.data, n, k, int(use.transposed), max(use.rows, 1)):
        return _Entry(None, version)
    device = _device(arr)
    # a JAX array, made once: executable_cache.Program serves saved executables to calls of JAX arrays only
    key_array = runtime.jax().device_put(np.int64(key), device)
    e = _Entry(key, version, use, n, k, w.nbytes, device, key_array)
    memory.hold_bytes(w.nbytes)
    rows = min(_UNPACK_CHECK_ROWS, k)
    back = np.empty((rows, n), np.float32)
    lib.hf_tpu_packed_unpack(key, back.ctypes.data, 0, rows)
    want = np.ascontiguousarray((w.T if use.transposed else w)[:rows])
    if not np.array_equal(back.view(np.uint32), want.view(np.uint32)):  # never seen; then keep XLA's dot
        e.free()
        return _Entry(None, version)
    return e


def _device(arr: Any) -> Any:
    try:
        return next(iter(arr.devices()))
    except (AttributeError, StopIteration):
        return None


def _drop(buf: Any, e: _Entry) -> None:
    """Let the weight's array go; the next reader rebuilds it from the packed copy."""
    buf.defer(functools.partial(_unpacked, e, tuple(buf.shape), weakref.ref(buf)), buf.shape)
    e.version = buf.version  # defer moved it; the values did not change


def _unpacked(e: _Entry, shape: tuple[int, ...], buf_ref: Callable[[], Any]) -> Any:
    """The weight's array, rebuilt from its packed copy (Buffer loader). The weight is then never dropped again:
    something besides the inference graphs reads it (eager ops of the same model, a graph break's eager code,
    a training step, a save), and each rebuild costs identity GEMMs over the whole weight (GPT-2's layers
    ~1.2 s), which a model used both ways would pay on every alternation. Its copy is freed at the next
    inference call, which takes XLA's dot for it from then on."""
    import numpy as np

    global _warned
    buf = buf_ref()
    if buf is not None:
        _read_elsewhere.add(buf)
    if not _warned:
        _warned = True
        import warnings

        # the cost grows with the weights' size times their input width: seconds for GPT-2's layers, minutes
        # for a 7B model's: say once what is happening and how to avoid it
        warnings.warn("hf_tpu: a weight packed for inference is read again (state_dict, .cpu(), eager ops, a "
                      "training step): its array is rebuilt from the packed copy by identity products (~1.2 s "
                      "for GPT-2 124M's layers, longer for wider models), and such weights keep their arrays "
                      "from now on. Set HF_TPU_PACKED_WEIGHTS=0 to never pack.", RuntimeWarning, stacklevel=2)
    if e.freed:
        raise RuntimeError("hf_tpu: a packed weight's copy was freed before its array was rebuilt")
    kn = np.empty((e.k, e.n), np.float32)
    if _lib().hf_tpu_packed_unpack(e.key, kn.ctypes.data, 0, e.k):
        raise RuntimeError("hf_tpu: could not rebuild a packed weight's array")
    w = np.ascontiguousarray(kn.T) if e.use.transposed else kn
    assert w.shape == shape
    jax = runtime.jax()
    return jax.device_put(w, e.device) if e.device is not None else jax.numpy.asarray(w)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _trim() -> None:
    """Return the dropped arrays' memory to the system: XLA:CPU's freed buffers of a few MB stay in glibc's heap
    otherwise (its mmap threshold rises to the size of a freed mapped block), and the process's RSS with them."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
