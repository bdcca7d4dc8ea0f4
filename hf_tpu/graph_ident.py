"""A compiled graph's program named for the executable cache (executable_cache.py), the same in every process.

graph_compiler.compile_graph lowers an ATen graph to one program. A process that loads the graph from the graph
cache (compile_cache) still traced it through the lowering table and lowered it to StableHLO before JAX's
persistent cache could serve the executable; with a name known before tracing, the executable cache serves it
instead. The name must be the same for the graph Dynamo and AOTAutograd just made (the process that fills
the cache) and for the graph loaded from the cache (every later process), and it must change whenever the
traced program could. A first version hashed the graph's Python code and every node's traced storage offset:
a loaded graph's nodes were then meta tensors without their storage offsets, so every graph with a view at
an offset (a QA head's `split`, a rotary embedding's half) was named differently in the process that filled
the cache and missed it in the next one. The name still leaves offsets out: only as_strided reads them.

So the name is a canonical serialization of exactly what the lowering reads (graph_compiler.to_jax_function):

- the nodes in order, each by its position (not its name), its kind and its target: an ATen op by its
  qualified name, a plain function (operator.getitem) by module and name, a get_attr by the bytes of the
  tensor it reads (shape, dtype, values);
- each node's arguments, other nodes by position, everything else by executable_cache.stable's text;
- each node's traced value: dtype, shape and stride of every tensor (the lowering casts and reshapes to
  them), the value of every plain number;
- for as_strided (STORAGE_READERS), what its lowering reads beyond its arguments: the node whose value's
  storage it indexes (storage_base: the start of the chain of views sharing its input's storage, so which
  values share a storage), that value's storage offset (its shape and strides are in its own text) and the
  input's own storage offset (the read's default start).
  A saved graph keeps both (compile_cache/serializable.py), so the graph Dynamo made and the one loaded
  from the graph cache get one name; two graphs whose as_strided reads a storage at other offsets get two;
- the precision.

No name (the graph is then traced in every process, as before) for symbolic sizes, for a value or argument
without a stable text, for a function from elsewhere, and when the lowering table is not the package's own
(hooks.override_lowerings). The lowering table itself is covered by the cache's environment digest (every
hf_tpu source file). as_strided graphs had no name before the storage text (VERSION unchanged: no text an
earlier name hashed changed meaning).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import eager_functional, executable_cache

VERSION = 2  # bump when the text below changes meaning
# the ops whose lowering indexes their input's storage (graph_compiler._as_strided_on_storage);
# as_strided_scatter's reads its arguments only (lowering_parity), so its arguments name it
STORAGE_READERS = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default)
_PLAIN_MODULES = ("_operator", "operator", "builtins", "math")


class _NoName(Exception):
    pass


def custom_opdef(target: Any) -> Any | None:
    """The torch.library definition of a custom op overload (PyTorch's own or a user's); None for ATen and
    prims ops (prims are custom ops too, whose bodies call the ATen op) and for anything else."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace in ("aten", "prims"):
        return None
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(target.name())
    return opdef if opdef is not None and opdef._opoverload is target else None


def _target(n: torch.fx.Node) -> str:
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        # a torch.library custom op is lowered through its Python body (graph_compiler._custom_op_body):
        # PyTorch's own bodies change only with torch (in the cache's environment digest); a user's body
        # may change between processes under the same name, so its graph gets no name
        opdef = custom_opdef(t)
        body = opdef._init_fn if opdef is not None else None  # _backend_fns holds torch's wrapper of it
        if body is not None and not getattr(body, "__module__", "").startswith("torch."):
            raise _NoName(f"custom op {t} with a body of the user's")
        return f"op:{t}"
    if callable(t) and getattr(t, "__module__", None) in _PLAIN_MODULES and "<" not in getattr(t, "__qualname__", "<"):
        return f"fn:{t.__module__}.{t.__qualname__}"
    raise _NoName(f"target {t!r}")


def _arg(x: Any, index: dict[torch.fx.Node, int]) -> str:
    if isinstance(x, torch.fx.Node):
        return f"%{index[x]}"
    if isinstance(x, (list, tuple)):  # FX's immutable_list is a list: the lowering gets a plain one
        kind = "tuple" if type(x) is tuple else "list"
        return f"{kind}(" + ",".join(_arg(v, index) for v in x) + ")"
    if isinstance(x, dict):
        return "dict(" + ",".join(f"{executable_cache.stable(k)}={_arg(v, index)}"
                                  for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))) + ")"
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NoName("a symbolic argument")
    return executable_cache.stable(x)


def _value(val: Any) -> str:
    parts = []
    for v in pytree.tree_leaves(val):
        if isinstance(v, torch.Tensor):
            dims = (*v.shape, *v.stride())
            if any(isinstance(d, torch.SymInt) for d in dims):
                raise _NoName("symbolic sizes")
            parts.append(f"T{tuple(v.shape)}:{tuple(v.stride())}:{v.dtype}")
        elif v is None or type(v) in (bool, int, float):
            parts.append(f"{type(v).__name__}:{v!r}")
        else:
            raise _NoName(f"a traced value of type {type(v).__name__}")
    return ";".join(parts)


def storage_base(node: torch.fx.Node) -> torch.fx.Node:
    """The first node of the chain of views (slice, permute, view, ...) `node` is at the end of: the value
    whose storage they all share (traced values keep their storage's identity), so that as_strided can read
    elements outside the last view, as PyTorch does. The lowering (graph_compiler) and the name both use it."""
    from torch.multiprocessing.reductions import StorageWeakRef

    ref = StorageWeakRef(node.meta["val"].untyped_storage())
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
        parent = node.args[0].meta.get("val")
        if not isinstance(parent, torch.Tensor) or StorageWeakRef(parent.untyped_storage()) != ref:
            break
        node = node.args[0]
    return node


def storage_source(n: torch.fx.Node) -> torch.fx.Node | None:
    """For a STORAGE_READERS node whose input is a traced tensor, the node whose storage its lowering reads
    (storage_base of the input); None for any other node."""
    src = n.args[0] if n.args else None
    if n.op != "call_function" or n.target not in STORAGE_READERS or not isinstance(src, torch.fx.Node) \
            or not isinstance(src.meta.get("val"), torch.Tensor):
        return None
    return storage_base(src)


def _storage(n: torch.fx.Node, index: dict[torch.fx.Node, int]) -> str:
    """What a storage reader's lowering reads beyond its arguments: the storage's node and its offset, and the
    input's own offset (where the read starts when as_strided is given none)."""
    base = storage_source(n)
    if base is None:
        return ""
    off, own = base.meta["val"].storage_offset(), n.args[0].meta["val"].storage_offset()
    if isinstance(off, torch.SymInt) or isinstance(own, torch.SymInt):
        raise _NoName("a symbolic storage offset")
    return f"|storage=%{index[base]}@{int(off)}|input@{int(own)}"  # the input's: the read's default offset


def _attr_bytes(gm: torch.fx.GraphModule, target: str) -> bytes:
    attr = gm
    for part in target.split("."):
        attr = getattr(attr, part)
    if not isinstance(attr, torch.Tensor):
        raise _NoName(f"get_attr of a {type(attr).__name__}")
    # a fresh graph may hold it on tpu, a loaded one holds it on CPU (serializable._dump_graph): same values
    cpu = attr.detach().cpu().contiguous()
    head = f"{tuple(cpu.shape)}:{cpu.dtype}:".encode()
    return head + (cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b"")


def own_lowerings() -> bool:
    """The lowering table is the package's own (no hooks.override_lowerings in force)."""
    return eager_functional._own_lowerings()


def graph_ident(gm: torch.fx.GraphModule, prec: str) -> str | None:
    """The name of `gm`'s program at precision `prec` in every process (module docstring), or None."""
    if not own_lowerings():
        return None
    h = hashlib.sha256(f"graph-v{VERSION}|{prec}\n".encode())
    index: dict[torch.fx.Node, int] = {}
    try:
        for i, n in enumerate(gm.graph.nodes):
            index[n] = i
            if n.op == "placeholder":
                target = "input"  # its name is not read; its aval is in each call's key
            elif n.op == "get_attr":
                h.update(_attr_bytes(gm, n.target))
                target = "attr"
            elif n.op == "call_function":
                target = _target(n)
            elif n.op == "output":
                target = "output"
            else:  # call_module / call_method: not in an ATen graph
                return None
            args = _arg((n.args, n.kwargs), index) if n.op != "placeholder" else ""
            h.update(f"{i}|{n.op}|{target}|{args}|{_value(n.meta.get('val'))}{_storage(n, index)}\n".encode())
    except (_NoName, executable_cache.Unstable):
        return None
    return f"graph|{h.hexdigest()}"
