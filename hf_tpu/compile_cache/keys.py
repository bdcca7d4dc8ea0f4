"""Cache keys for compiled graphs. The saved artifact's own check covers only the Python and torch versions,
so what decides whether a saved graph may serve a call is ours, and all of it is in the key:

- versions: hf_tpu (and a digest of the hf_tpu sources that shape a graph), torch, JAX, jaxlib, torchax, Transformers, Diffusers, Python (and the key format);
- the compiled function: module, qualified name and a digest of its code (bytecode, constants, names);
- the call's arguments, recursively: tensors by shape, dtype, device, strides, requires_grad and storage
  offset; modules by class, config (Transformers/Diffusers `config`), training flag and parameters (names, shapes, dtypes);
  other values by type and value;
- the state the graph depends on: matmul precision, grad mode, default dtype, autocast;
- hf_tpu's lowering table as far as it shapes the ATen graph: which ops are decomposed before lowering
  (an op gaining or losing a lowering changes the graph). The lowerings themselves are not in the key: a
  loaded graph is lowered again by today's table, so a changed lowering shows on a warm cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import types
from importlib import metadata
from typing import Any

import torch

FORMAT = 2  # bump when the saved layout or the key's meaning changes (2: storage offsets saved and keyed)


@functools.cache
def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "format": str(FORMAT)}
    for pkg in ("hf-tpu", "torch", "jax", "jaxlib", "torchax", "transformers", "diffusers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = ""
    out["hf_tpu_code"] = _hf_tpu_code_digest()
    from hf_tpu import compile_options

    out["partitioner"] = compile_options.partition_fn().__name__  # HF_TPU_PARTITIONER: which values the forward saves
    return out


def _hf_tpu_code_digest() -> str:
    """hf_tpu's version stays 0.1.0 while its code changes: the sources that shape a saved graph (the
    compiler and its decompositions, the serialized backend, the Transformers patches Dynamo traces) count."""
    from pathlib import Path

    return sources_digest(Path(__file__).resolve().parents[1])


# the hf_tpu sources (files, or packages: every .py inside) that shape a saved graph; autocast.py's kernels and
# meta_kernels.py's shapes and strides run while AOTAutograd traces, so their output is in the saved graph too
KEYED_SOURCES = ("compile.py", "graph_compiler.py", "lowering.py", "patches", "compile_cache/serializable.py",
                 "compile_cache/keys.py", "autocast.py", "meta_kernels.py")


def sources_digest(root: Any) -> str:
    """Digest of KEYED_SOURCES under `root` (an hf_tpu directory; benchmarks/sweep_bench.py reads a checkout's)."""
    from pathlib import Path

    h = hashlib.sha256()
    for rel in KEYED_SOURCES:
        path = Path(root) / rel
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.relative_to(root).as_posix().encode())
            try:
                h.update(f.read_bytes())
            except OSError:
                pass
    return h.hexdigest()[:16]


@functools.cache
def lowering_fingerprint() -> str:
    """Digest of which ops hf_tpu lowers directly (hand-written or torchax's, as lowering.find accepts them):
    the part of the lowering table that shapes the ATen graph, since every other op is decomposed first
    (hf_tpu.graph_compiler.decompositions). Cheaper than listing the decompositions (~1 s to materialise)."""
    from hf_tpu import lowering, op_registry
    from hf_tpu.torchax_compat import load_op_table

    lowerings, _ = load_op_table()
    ops: set[Any] = set(op_registry.table("jax"))
    for op in lowerings:
        if isinstance(op, torch._ops.OpOverloadPacket):
            ops.update(getattr(op, name) for name in op.overloads())
        elif isinstance(op, torch._ops.OpOverload):
            ops.add(op)
    names = sorted(lowering.op_name(op) for op in ops if lowering.find(op) is not None)
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256()

    def feed(c: types.CodeType) -> None:
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        h.update(repr(c.co_varnames).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                feed(k)
            else:
                h.update(repr(k).encode())

    feed(code)
    return h.hexdigest()[:16]


def function_id(fn: Any) -> dict[str, Any]:
    """What the compiled function is: its name and code, and the values its code reads from its closure and its
    globals. Dynamo bakes those values into the graph (a closed-over 3.0 becomes a constant, a closed-over
    torch.sin the graph's op), and guard_filter drops the guards that protected them (global and identity
    guards cannot be saved), so they must be in the key: `make(c)`'s `lambda x: x * c` compiled for c = 2.0
    was served again for c = 3.0 (and torch.cos's graph for torch.sin's) before."""
    code = getattr(fn, "__code__", None)
    out: dict[str, Any] = {"module": str(getattr(fn, "__module__", "")),
                           "qualname": str(getattr(fn, "__qualname__", fn)),
                           "code": code_digest(code) if code is not None else ""}
    if code is None:
        return out
    cells = getattr(fn, "__closure__", None) or ()
    out["closure"] = [_cell_value(c) for c in cells]
    fn_globals = getattr(fn, "__globals__", {})
    out["globals"] = {name: _value_id(fn_globals[name]) for name in sorted(_global_names(code))
                      if name in fn_globals}
    return out


def _global_names(code: types.CodeType) -> set[str]:
    """The names `code` (and the code nested in it) may read as globals: co_names holds attribute names too,
    kept only where the function's globals have them."""
    names = set(code.co_names)
    for k in code.co_consts:
        if isinstance(k, types.CodeType):
            names |= _global_names(k)
    return names


def _cell_value(cell: Any) -> Any:
    try:
        return _value_id(cell.cell_contents)
    except ValueError:  # a cell not yet filled
        return "<empty cell>"


def _value_id(x: Any, depth: int = 0) -> Any:
    """A stable description of a value a function reads: functions, builtins and classes by qualified name (a
    Python function with its code and own closure), modules by name, data as describe() gives it."""
    if isinstance(x, types.ModuleType):
        return {"module": x.__name__}
    if isinstance(x, type):
        return {"class": f"{x.__module__}.{x.__qualname__}"}
    if isinstance(x, types.FunctionType) and depth < 3:
        cells = x.__closure__ or ()
        return {"fn": f"{x.__module__}.{x.__qualname__}", "code": code_digest(x.__code__),
                "closure": [_value_id(c.cell_contents, depth + 1) if _filled(c) else "<empty cell>" for c in cells]}
    if callable(x) and hasattr(x, "__qualname__") and not isinstance(x, torch.nn.Module):
        return {"fn": f"{getattr(x, '__module__', '')}.{x.__qualname__}"}
    return describe(x)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _config_digest(config: Any) -> str:
    try:
        if hasattr(config, "to_json_string"):
            text = config.to_json_string(use_diff=False)
        else:
            d = dict(config)
            # Diffusers lists the defaulted arguments from a set: its order changes with the process's hash
            # seed, and so did every Diffusers model's key (its denoisers never hit in a new process)
            if isinstance(d.get("_use_default_values"), list | tuple):
                d["_use_default_values"] = sorted(map(str, d["_use_default_values"]))
            text = json.dumps(d, sort_keys=True, default=repr)
    except Exception:  # noqa: BLE001 - an odd config still gets a key, its repr
        text = repr(config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _module_digest(m: torch.nn.Module) -> dict[str, Any]:
    h = hashlib.sha256()
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{t.device.type}:{t.requires_grad}:{t.storage_offset()};".encode())
    config = getattr(m, "config", None)
    return {"class": f"{type(m).__module__}.{type(m).__qualname__}", "training": m.training,
            "config": _config_digest(config) if config is not None else "", "params": h.hexdigest()[:16]}


def describe(x: Any, depth: int = 0) -> Any:
    """A JSON-able description of one argument: what the key depends on."""
    if depth > 8:
        return type(x).__qualname__
    if isinstance(x, torch.Tensor):
        # the storage offset too: the graph's as_strided reads absolute offsets into its inputs' storages (a tpu
        # tensor's is always 0; a CPU view passed in is not)
        return {"t": [list(x.shape), str(x.dtype), x.device.type, list(x.stride()), x.requires_grad,
                      x.storage_offset()]}
    if isinstance(x, torch.nn.Module):
        return _module_digest(x)
    if isinstance(x, dict):
        return {"d": [[str(k), describe(v, depth + 1)] for k, v in x.items()]}
    if isinstance(x, list | tuple):
        return {type(x).__name__: [describe(v, depth + 1) for v in x]}
    if x is None or isinstance(x, bool | int | float | str | torch.dtype | torch.device):
        return repr(x)
    config = getattr(x, "config", None)
    out = {"obj": f"{type(x).__module__}.{type(x).__qualname__}"}
    if config is not None:
        out["config"] = _config_digest(config)
    return out


def autocast_state() -> dict[str, str]:
    """The autocast dtype of each device type where autocast is on. Dynamo's saved guards check it, but one key
    holds one entry: a model called both under autocast and without it (a bf16 training step and a float32
    evaluation) overwrote its own entry at each switch, and each new process compiled again."""
    out = {}
    for device in ("cpu", "tpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                out[device] = str(torch.get_autocast_dtype(device))
        except RuntimeError:  # a device type this torch has no autocast state for
            continue
    return out


def call_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], modes: str = "") -> tuple[str, dict[str, Any]]:
    """(hex key, the description it hashes) for compiling `fn(*args, **kwargs)` now. `modes`: the kind of
    torch-function modes active around the call (cached.DRAWS_ONLY, or "" for none): entries saved under
    such modes hold only graphs that draw nothing, and serve only calls under them."""
    from hf_tpu import precision

    desc = {
        "versions": versions(),
        "lowering": lowering_fingerprint(),
        "function": function_id(fn),
        "args": [describe(a) for a in args],
        "kwargs": {k: describe(v) for k, v in sorted(kwargs.items())},
        "precision": precision.current(),
        "grad": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "autocast": autocast_state(),
    }
    if modes:
        desc["modes"] = modes
    text = json.dumps(desc, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32], desc
