"""What names an executable in the executable cache (executable_cache.py): two keys.

The ident key names a program before it is traced: the caller's ident (a text that determines the traced
function), the compile variant and options, the call's abstract arguments, and environment(): the versions,
backend, JAX configuration and variables that can change a program, and a digest of every hf_tpu source
file, since an ident does not say which helpers in the package its lowering calls. So any commit to hf_tpu
(a docstring) makes every ident key a miss.

The lowered key is the second lookup, on an ident miss, after the program is traced and lowered (as it is on
a miss anyway) and before XLA compiles it. Why the sources need not be in it: the lowered program determines
its executable given the compiler (versions, compile options and flags, backend and devices:
compiler_environment(), which is environment() without the source digest), so which Python produced the
program no longer matters; an entry survives every commit that leaves the program's lowering unchanged, and
a commit that changes it changes the key. hf_tpu's own custom-call handlers (native/torch_dot.cpp) are not in
an executable: it calls whatever the process registered under the target's name, as a freshly compiled one
would. The lowered key digests:

- the StableHLO module, canonicalised as JAX's own persistent cache does it (jax._src.cache_key: debug
  locations stripped, MLIR bytecode), so that moved source lines do not count;
- what JAX keeps beside the module in the executable it builds (pxla.UnloadedMeshExecutable.from_hlo's
  arguments, from the lowering's compile_args) and serialize_executable saves with it: argument and result
  avals with their weak types, shardings, layouts, effects, which arguments jit kept (it drops unused ones:
  `lambda x, y: 2 * x` and `lambda x, y: 2 * y` lower to the same module and are different executables),
  and the input and output pytrees (the module has leaves only).

JAX's own cache keys on the module alone because it stores the bare XLA executable and rebuilds the rest from
the current lowering; the executable cache stores the whole jax.stages.Compiled, so the rest is keyed here.
Anything this cannot name alike in another process (a text with an object address, a shape-polymorphic
program, host callbacks, a lowering field of a JAX version this was not written against) gives None: no
second lookup for that program, which then costs what it did before.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from hf_tpu import runtime

FORMAT = 1  # bump when the entry layout or the key's meaning changes


class Unstable(Exception):
    """A value whose text would not name the same thing in another process."""


def stable(x: Any) -> str:
    """A text for `x` that is equal in two processes exactly when `x` is: plain values, dtypes, ops and
    containers of them. Raises Unstable for anything else (an object, an array, a function)."""
    t = type(x)
    if x is None or t in (bool, int, float, complex, str, bytes) or x is Ellipsis:
        return f"{t.__name__}:{x!r}"  # repr round-trips floats exactly (and tells -0.0, nan)
    if t in (tuple, list):
        return f"{t.__name__}(" + ",".join(stable(v) for v in x) + ")"
    if t is slice:
        return f"slice({stable(x.start)},{stable(x.stop)},{stable(x.step)})"
    if t is dict:
        return "dict(" + ",".join(f"{stable(k)}={stable(v)}" for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))) + ")"
    mod = t.__module__ or ""
    if isinstance(x, enum.Enum):
        return f"{mod}.{t.__qualname__}.{x.name}"
    if mod.startswith("torch"):
        # dtypes, memory formats, layouts, devices, ops: their str names them
        if t.__name__ in ("dtype", "memory_format", "layout", "device", "OpOverload", "OpOverloadPacket"):
            return f"{t.__name__}:{x}"
    if t.__name__ == "dtype" and mod == "numpy":
        return f"np.dtype:{x.str}:{x.name}"
    if mod == "numpy" and hasattr(x, "dtype") and getattr(x, "shape", None) == ():  # a numpy scalar
        return f"np:{x.dtype.name}:{x.item()!r}"
    if isinstance(x, type) and (x.__module__ or "").split(".")[0] in ("numpy", "jax", "ml_dtypes"):
        return f"type:{x.__module__}.{x.__qualname__}"  # jnp.float32 and the like, used as dtypes
    raise Unstable(f"{t.__module__}.{t.__qualname__}")


def _digest_sources(root: Path) -> str:
    h = hashlib.sha256()
    # the C++ too: native/torch_dot.cpp's handlers are called by saved executables
    for f in sorted([*root.rglob("*.py"), *root.rglob("*.cpp")]):
        h.update(f.relative_to(root).as_posix().encode())
        try:
            h.update(f.read_bytes())
        except OSError:
            pass
    return h.hexdigest()


def _env_vars() -> list[tuple[str, str]]:
    """hf-tpu's, TorchTPU's, JAX's and XLA's variables that can change a program (not paths or timeouts)."""
    out = []
    for k, v in sorted(os.environ.items()):
        if k == "XLA_FLAGS" or (k.startswith(("HF_TPU_", "TORCH_TPU_", "JAX_"))
                                and not any(w in k for w in ("DIR", "CACHE", "SWEEP", "TIMEOUT"))):
            out.append((k, v))
    return out


def _trace_config(jax: Any) -> str:
    """JAX's configuration that its own jit cache keys on (config.trace_context), objects by type."""
    from jax._src import config

    parts = []
    for v in config.trace_context():
        r = repr(v)
        parts.append(type(v).__qualname__ if " at 0x" in r else r)
    return ",".join(parts)


@functools.cache
def _compiler_parts() -> tuple[str, ...]:
    jax = runtime.jax()
    versions = []
    for pkg in ("torch", "jax", "jaxlib", "torchax", "numpy", "hf-tpu"):
        try:
            versions.append((pkg, metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            versions.append((pkg, ""))
    import sys

    client = jax.devices()[0].client
    return (f"format={FORMAT}", f"python={sys.version}", repr(versions),
            f"backend={client.platform}:{client.platform_version}:{[str(d) for d in jax.devices()]}",
            f"config={_trace_config(jax)}", f"env={_env_vars()!r}")


@functools.cache
def environment() -> str:
    """Digest of everything outside the key's ident that can change a compiled program (module docstring)."""
    parts = [*_compiler_parts(), f"hf_tpu={_digest_sources(Path(__file__).resolve().parent)}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def compiler_environment() -> str:
    """environment() without the hf_tpu sources: what can change the executable XLA makes of a given lowered
    program (the second lookup's key; the sources only decide which program is lowered)."""
    return hashlib.sha256("\n".join(["lowered", *_compiler_parts()]).encode()).hexdigest()


_SCALARS = (bool, int, float)  # Python numbers a program takes as traced (weakly typed) arguments


def _arg_text(a: Any) -> str:
    if type(a) in _SCALARS:  # traced as a weakly typed scalar of its kind: the value is not in the program
        return f"py:{type(a).__name__}"
    devices = sorted(d.id for d in a.sharding.device_set)
    return f"{a.shape}:{a.dtype.name}:{int(a.weak_type)}:{devices}:{getattr(a.sharding, 'memory_kind', '')}"


def entry_key(ident: str, variant: str, options: Any, args: tuple | list, place: Any = None, tree: Any = None) -> str:
    """`args`: the call's array (or Python scalar) leaves; `tree`: their pytree structure when the call is
    not positional arrays alone (the optimizer's lists and keyword hyperparameters); `place`: JAX's default
    device for the call (where outputs made from no input go), None for JAX's own."""
    return _key([environment(), ident], variant, options, args, place, tree)


def lowered_entry_key(lowered: Any, variant: str, options: Any, args: tuple | list, place: Any = None,
                      tree: Any = None) -> str | None:
    """The second lookup's key (lowered_key.py): entry_key's with the lowered program's digest for the ident
    and compiler_environment() for environment(); None when the lowered program cannot be named."""
    digest = lowered_digest(lowered)
    return None if digest is None else "L" + _key([compiler_environment(), digest], variant, options, args, place, tree)


def _key(head: list[str], variant: str, options: Any, args: tuple | list, place: Any, tree: Any) -> str:
    text = "\n".join([*head, variant, repr(sorted((options or {}).items())),
                      ";".join(_arg_text(a) for a in args), "" if place is None else f"default:{place.id}"]
                     + ([] if tree is None else [f"tree:{tree}"]))
    return hashlib.sha256(text.encode()).hexdigest()[:40]



# compile_args of JAX 0.10.2's lowering (pxla.MeshComputation), by how the digest treats them
_KEYED = ("global_in_avals", "global_out_avals", "in_shardings", "out_shardings", "tuple_args", "unordered_effects",
          "ordered_effects", "kept_var_idx", "num_devices", "committed", "in_layouts", "out_layouts",
          "intermediate_shardings", "context_mesh")
_EMPTY = ("host_callbacks", "keepalive", "mut", "pgle_profiler")  # must be empty / None (Python objects otherwise)
# the client (its platform, version and devices are in compiler_environment()); the shape-polymorphism state
# (must use no dimension variables); every argument's aval, the pruned ones too (keyed below)
_CHECKED = ("backend", "shape_poly_state", "all_args_info")


class _Unnamed(Exception):
    pass


def _text(x: Any) -> str:
    """repr, refused where it names an object by its address (not the same in another process)."""
    if isinstance(x, set | frozenset):
        x = sorted(x)
    if isinstance(x, list | tuple):
        return "[" + ",".join(_text(v) for v in x) + "]"
    r = repr(x)
    if " at 0x" in r or " object>" in r:
        raise _Unnamed(r[:80])
    return r


def _aval(a: Any) -> str:
    # repr shows shape, dtype and weak type; sharding, vma and memory space are fields of their own
    return _text(a) + "|" + "|".join(_text(getattr(a, f, None)) for f in ("sharding", "vma", "memory_space"))


def _metadata(lowered: Any) -> str:
    args = getattr(getattr(lowered, "_lowering", None), "compile_args", None)
    if not isinstance(args, dict) or set(args) - set(_KEYED) - set(_EMPTY) - set(_CHECKED):
        raise _Unnamed("unknown lowering fields")  # another JAX: not keyed until read again
    if any(args.get(k) for k in _EMPTY):
        raise _Unnamed("host callbacks or mutable state")
    poly = args.get("shape_poly_state")
    if poly is not None and (getattr(poly, "uses_dim_vars", True) or getattr(poly, "has_platform_index_argument", True)):
        raise _Unnamed("shape-polymorphic")
    parts = [f"in_tree={lowered.in_tree}", f"out_tree={lowered.out_tree}"]
    for k in _KEYED:
        v = args.get(k)
        if k in ("global_in_avals", "global_out_avals"):
            parts.append(f"{k}=" + ";".join(_aval(a) for a in v))
        else:
            parts.append(f"{k}={_text(v)}")
    info = args.get("all_args_info")  # every argument's aval, the pruned ones too (their weak types are checked)
    parts.append("all_in_avals=" + ";".join(_aval(a) for a in getattr(info, "in_avals", ())))
    return "\n".join(parts)


def _module_bytes(lowered: Any) -> bytes:
    from jax._src import cache_key  # JAX's own canonical form: its persistent cache hashes exactly these bytes

    return cache_key._canonicalize_ir(lowered.compiler_ir("stablehlo"), cache_key.IgnoreCallbacks.NO)


def lowered_digest(lowered: Any) -> str | None:
    """SHA-256 (hex) of the lowered program `lowered` (a jax.stages.Lowered) with everything JAX keeps beside
    its module, or None when some of it cannot be named alike in another process (module docstring)."""
    try:
        meta = _metadata(lowered)
        module = _module_bytes(lowered)
    except Exception:  # noqa: BLE001 - _Unnamed, or a JAX without these internals: no second lookup
        return None
    h = hashlib.sha256(meta.encode())
    h.update(b"\n--module--\n")
    h.update(module)
    return h.hexdigest()
