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
- the precision.

No name (the graph is then traced in every process, as before) for symbolic sizes, for a value or argument
without a stable text, for a function from elsewhere, for as_strided (its lowering reads the storage
offsets and the sharing of storages between nodes, which the name leaves out), and when the lowering
table is not the package's own (hooks.override_lowerings). The lowering table itself is covered by the
cache's environment digest (every hf_tpu source file).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import eager_functional, executable_cache

VERSION = 2  # bump when the text below changes meaning
_AS_STRIDED = {torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default,
               torch.ops.aten.as_strided_scatter.default}
_PLAIN_MODULES = ("_operator", "operator", "builtins", "math")


class _NoName(Exception):
    pass


def _target(n: torch.fx.Node) -> str:
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        if t in _AS_STRIDED:
            raise _NoName("as_strided reads storage offsets the name leaves out")
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
            h.update(f"{i}|{n.op}|{target}|{args}|{_value(n.meta.get('val'))}\n".encode())
    except (_NoName, executable_cache.Unstable):
        return None
    return f"graph|{h.hexdigest()}"
