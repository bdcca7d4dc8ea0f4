"""A disk tier for the XLA executables of eager per-op programs, so a warm new process skips JAX's tracing
and lowering of them too, not only XLA's compile.

JAX's persistent cache (hf_tpu/runtime.py) is keyed by the lowered program, so a new process must trace
and lower every op's program again before it can look the executable up: about 15 ms per program here
(an MLIR context, the lowering, the key), 90% of a warm sweep entry's first eager forward (measured on
Funnel: 192 programs, 3.3 s, of which loading the executables was 0.4 s). This tier keys the executable
by what the program is traced from instead, and loads it with JAX's own serializer
(`jax.experimental.serialize_executable`), ~1 ms each.

The key (`describe` + `env_digest`): the op; the lowering's module, qualified name and bytecode digest
(a lowering replaced at run time, a fault injection, gets its own entries); the static skeleton of the
call (Python scalars, dims, dtypes, view geometry); the arrays' shapes, dtypes and weak types; the matmul
precision and torch's default dtype; a digest of every hf_tpu source file (any change in hf_tpu, lowering
helpers included, invalidates the tier); the versions of torch, JAX, jaxlib and torchax; the platform,
device kind, XLA_FLAGS, and the host CPU's model and feature flags (an XLA:CPU executable is built for the
CPU it was compiled on, and a shared tier may be read by other machines). A call whose skeleton holds
anything without a stable description (an object shown by address) skips the tier and runs as before.

Entries live in `programs/` beside the graph cache's host and shared tiers (store.py: atomic writes,
checksums; a corrupt or unreadable entry is ignored with a warning and compiled again).
HF_TPU_PROGRAM_CACHE=0, or HF_TPU_COMPILE_CACHE=0, turns the tier off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import sys
import threading
import types
from pathlib import Path
from typing import Any

import torch

from hf_tpu.compile_cache import store

FORMAT = 1
_STABLE_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), slice)
_lock = threading.Lock()
_counts = {"hits": 0, "misses": 0, "saved": 0, "corrupt": 0, "unkeyed": 0}


class Unkeyable(Exception):
    """Part of a call has no description that is the same in another process."""


def enabled() -> bool:
    return (os.environ.get("HF_TPU_PROGRAM_CACHE", "1") != "0"
            and os.environ.get("HF_TPU_COMPILE_CACHE", "1") != "0"
            and os.environ.get("HF_TPU_DISABLE_DISK_CACHE") != "1")


def stats() -> dict[str, int]:
    with _lock:
        return dict(_counts)


def reset_stats() -> None:
    with _lock:
        for k in _counts:
            _counts[k] = 0


def _bump(what: str) -> None:
    with _lock:
        _counts[what] += 1


def tiers() -> list[Path]:
    """Host first, then the shared tier (a hit there is copied to the host)."""
    from hf_tpu import runtime

    out = [runtime.program_cache_dir()]
    shared = runtime.shared_cache_dir()
    if shared is not None:
        out.append(shared / "programs")
    return out


def describe(x: Any) -> str:
    """A description of a static argument or lowering that is the same in every process, or Unkeyable."""
    if isinstance(x, _STABLE_SCALARS):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, tuple | list):
        return f"{type(x).__name__}(" + ",".join(describe(v) for v in x) + ")"
    if isinstance(x, dict):
        return "dict(" + ",".join(f"{describe(k)}={describe(v)}" for k, v in sorted(x.items(), key=repr)) + ")"
    if isinstance(x, type):
        return f"type:{x.__module__}.{x.__qualname__}"
    if isinstance(x, torch._C.Argument):  # an op's schema, in lowering adapters (its str is its address)
        return f"arg:{x.name}:{x.type}:{x.default_value!r}:{x.kwarg_only}"
    if isinstance(x, torch._C.FunctionSchema):
        return f"schema:{x}"
    if hasattr(x, "__array__") or hasattr(x, "block_until_ready"):  # a tensor or array constant: by value only
        raise Unkeyable(type(x).__qualname__)
    if isinstance(x, types.FunctionType | types.MethodType | functools.partial):
        return _function(x)
    text = repr(x)
    mod = type(x).__module__ or ""
    if " at 0x" in text or " object at " in text or not mod.startswith(("torch", "jax", "numpy", "ml_dtypes")):
        raise Unkeyable(type(x).__qualname__)
    return f"{mod}.{type(x).__qualname__}:{text}"  # torch.dtype, OpOverload, memory_format, numpy dtypes


def _function(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({_function(fn.func)},{describe(fn.args)},{describe(fn.keywords)})"
    if isinstance(fn, types.MethodType):
        return f"method({_function(fn.__func__)},{describe(fn.__self__)})"
    from hf_tpu.compile_cache import keys

    code = fn.__code__
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _has_contents(c)]
    return (f"fn:{fn.__module__}.{fn.__qualname__}:{keys.code_digest(code)}"
            f"[{describe(tuple(cells))}|{describe(fn.__defaults__ or ())}|{describe(fn.__kwdefaults__ or {})}]")


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell (a name not yet bound) raises
    except ValueError:
        return False
    return True


@functools.cache
def env_digest() -> str:
    """What every key shares: hf_tpu's sources, the versions, the platform and the CPU."""
    from importlib import metadata

    from hf_tpu import runtime

    h = hashlib.sha256(f"format={FORMAT};python={sys.version.split()[0]}".encode())
    for pkg in ("torch", "jax", "jaxlib", "torchax"):
        try:
            h.update(f"{pkg}={metadata.version(pkg)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{pkg}=none;".encode())
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    jax = runtime.jax()
    dev = jax.devices()[0]
    h.update(f"{dev.platform};{getattr(dev, 'device_kind', '')};{os.environ.get('XLA_FLAGS', '')};".encode())
    h.update(f"x64={jax.config.jax_enable_x64};{platform.machine()};{_cpu_flags()}".encode())
    return h.hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return hashlib.sha256("".join(sorted(set(lines))).encode()).hexdigest()[:16]
    except OSError:
        return platform.processor()


def base_key(*parts: Any) -> str | None:
    """The key of a program, before its argument shapes; None when it cannot be described stably."""
    try:
        text = describe(parts)
        if " at 0x" in text:  # a description that names an address (a repr we did not expect) is not stable
            raise Unkeyable("an address")
    except (Unkeyable, RecursionError):
        _bump("unkeyed")
        return None
    return hashlib.sha256((env_digest() + text).encode()).hexdigest()


class DiskProgram:
    """`jax.jit(program)` with the disk tier in front: one loaded (or compiled and saved) executable per
    argument signature. Called with tracers (inside another trace, fused mode), it is the jitted function."""

    __slots__ = ("jitted", "base", "compiled")

    def __init__(self, jitted: Any, base: str) -> None:
        self.jitted = jitted
        self.base = base
        self.compiled: dict[tuple[Any, ...], Any] = {}

    def __call__(self, *arrays: Any) -> Any:
        try:
            exe = self.compiled[tuple([x.aval for x in arrays])]
        except (KeyError, AttributeError):
            exe = self._first(arrays)
            if exe is None:
                return self.jitted(*arrays)
        try:
            return exe(*arrays)
        except TypeError:  # tracers with an aval seen before: a compiled executable cannot be traced
            return self.jitted(*arrays)
        except Exception as exc:  # noqa: BLE001 - see _unusable
            if type(exc).__name__ != "JaxRuntimeError" or not _unusable(self, exe, exc):
                raise
            return self.jitted(*arrays)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, **kwargs)

    def _first(self, arrays: tuple[Any, ...]) -> Any:
        from hf_tpu import runtime

        jax = runtime.jax()
        if any(isinstance(x, jax.core.Tracer) or not hasattr(x, "aval") for x in arrays):
            return None
        avals = tuple(x.aval for x in arrays)
        key = hashlib.sha256((self.base + repr([(a.shape, str(a.dtype), a.weak_type) for a in avals])).encode()
                             ).hexdigest()[:32]
        exe = _load(key)
        if exe is None:
            exe = self.jitted.lower(*arrays).compile()
            _save(key, exe)
        else:
            _loaded[id(exe)] = key
        self.compiled[avals] = exe
        return exe


_loaded: dict[int, str] = {}  # id() of an executable read from disk -> its key, until it has run once


def _unusable(prog: DiskProgram, exe: Any, exc: BaseException) -> bool:
    """A loaded XLA:CPU executable can fail when called, before computing anything ("NOT_FOUND: Function
    concatenate_bitcast_fusion not found", seen with whole-graph programs): the call is served by the jitted
    function instead, and a marker keeps later processes from loading that entry again. Only for an
    executable read from disk; any other error is the op's own."""
    key = _loaded.pop(id(exe), None)
    if key is None:
        return False
    store.warn_once(f"program:{key}", f"a saved program failed to run ({exc}); compiling it instead")
    _bump("corrupt")
    for root in tiers():
        store.mark_unsaveable(root, key, str(exc)[:500])
    for sig, e in list(prog.compiled.items()):
        if e is exe:
            del prog.compiled[sig]
    return True


def _load(key: str) -> Any:
    from jax.experimental import serialize_executable

    roots = tiers()
    for i, root in enumerate(roots):
        if store.is_unsaveable(root, key):  # an executable that loaded but could not run (below)
            break
        payload = store.read(root, key)
        if payload is None:
            continue
        try:
            state = pickle.loads(payload)
            exe = serialize_executable.deserialize_and_load(state["exe"], state["in_tree"], state["out_tree"])
        except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss, never an error
            store.warn_once(f"program:{key}", f"ignoring unreadable program {key} in {root} "
                                              f"({type(exc).__name__}: {exc}); compiling instead")
            _bump("corrupt")
            continue
        if i > 0:
            store.write(roots[0], key, payload)  # a shared-tier hit is kept on the host
        _bump("hits")
        return exe
    _bump("misses")
    return None


def _save(key: str, exe: Any) -> None:
    from jax.experimental import serialize_executable

    try:
        data, in_tree, out_tree = serialize_executable.serialize(exe)
        payload = pickle.dumps({"exe": data, "in_tree": in_tree, "out_tree": out_tree})
    except Exception:  # noqa: BLE001 - not serializable here: used in this process, just not saved
        return
    saved = False
    for root in tiers():
        saved = store.write(root, key, payload) or saved
    if saved:
        _bump("saved")
