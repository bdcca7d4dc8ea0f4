"""Fused eager mode (TorchTPU's DeferAndFuse): ops are recorded instead of run, and the pending graph runs
as one jitted XLA program when a value is needed.

`TORCH_TPU_DEFER_AND_FUSE=1`, or `with hf_tpu.defer_and_fuse():`. An op that the fast path (plans.py) can
plan (a program with one output array or a flat tuple of them: the great majority of a forward) becomes a
`Node` holding its program and its inputs (arrays, or other nodes); its tensor's Buffer is lazy, with the
node as its loader (a multi-output op's tensors hang off one `part` node per output). Anything
that needs the array (`.cpu()`, `.item()`, printing, a branch on a tensor, a copy to another device, an
op the fast path does not plan, random ops) reads `Buffer.array`, which runs the node: the graph of every
pending node it depends on, and of every other pending node whose tensor is still held, becomes one
program, cached by its structure (the ops' programs, how they connect, which nodes are outputs; JAX adds
shapes and dtypes), never by values. Writes into views are nodes too (tensor.defer_write).

Semantics stay Strict's: a node captures its inputs' arrays when the op is issued (JAX arrays are
immutable, so later writes cannot change what it reads); random ops run as in Strict, so a seed gives the
same numbers. Memory: a node's result is kept only if its tensor is still alive when the graph runs
(weak reference); an intermediate nothing else holds is never materialised, and once run, nodes drop
their inputs. Errors: when a fused program fails, its nodes run one by one, and the failing ATen op is
named, as in Strict. `TORCH_TPU_LAUNCH_BLOCKING=1` turns fusing off.

Written by hand: torchax and JAX offer no deferred-execution layer over eager PyTorch dispatch, and
Dynamo's (graph capture from bytecode) is compiled mode, not eager.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from hf_tpu.errors import TpuOpError, op_name


# Read by dispatch on every op: a plain module global is the cheapest check.
def _launch_blocking() -> bool:
    return os.environ.get("TORCH_TPU_LAUNCH_BLOCKING", os.environ.get("TPU_LAUNCH_BLOCKING", "0")) == "1"


LAUNCH_BLOCKING = _launch_blocking()  # read by dispatch per op; switched by torch.tpu's eager modes
ACTIVE = os.environ.get("TORCH_TPU_DEFER_AND_FUSE", "0") == "1" and not LAUNCH_BLOCKING
MAX_PENDING = int(os.environ.get("HF_TPU_FUSE_MAX_DEPTH", "1000"))  # a chain this deep runs at once

_lock = threading.RLock()
_programs: dict[Any, Callable[..., Any]] = {}
_stats: collections.Counter[str] = collections.Counter()
_reasons: collections.Counter[str] = collections.Counter()
current_op: Any = None  # the op being dispatched: names what made a graph run


class Node:
    """One deferred op: `fn(list of input arrays) -> array`, its inputs (arrays or Nodes) and its result's
    abstract value as (shape, dtype). Called (as its Buffer's loader), it runs its pending graph and returns
    its array."""

    __slots__ = ("fn", "inputs", "aval", "op", "buf_ref", "value", "size", "__weakref__")

    def __init__(self, fn: Callable[[list[Any]], Any], inputs: list[Any], aval: Any, op: Any, size: int) -> None:
        self.fn, self.inputs, self.aval, self.op, self.size = fn, inputs, aval, op, size
        self.buf_ref: Any = None
        self.value: Any = None

    def __call__(self) -> Any:
        with _lock:
            if self.value is None:
                _run_graph(self)
            return self.value


def active() -> bool:
    return ACTIVE


def set_active(on: bool) -> None:
    global ACTIVE
    ACTIVE = bool(on) and not LAUNCH_BLOCKING


def set_launch_blocking(on: bool) -> None:
    """Run each op to completion as it is issued (errors raise at the op); turns fusing off."""
    global LAUNCH_BLOCKING, ACTIVE
    LAUNCH_BLOCKING = bool(on)
    if LAUNCH_BLOCKING:
        ACTIVE = False


@contextlib.contextmanager
def defer_and_fuse(on: bool = True) -> Iterator[None]:
    """Fused eager mode inside the block (pending work runs when the block ends)."""
    before = ACTIVE
    set_active(on)
    try:
        yield
    finally:
        set_active(before)


def stats() -> dict[str, Any]:
    """Fused graphs run, their program-cache hits and misses, ops deferred, graphs run node by node after
    an error, and what made graphs run (by ATen op, or `limit`)."""
    with _lock:
        return {**{k: _stats[k] for k in ("graphs", "cache_hits", "cache_misses", "deferred_ops", "fallbacks")},
                "materialised_by": dict(_reasons)}


def reset_stats() -> None:
    with _lock:
        _stats.clear()
        _reasons.clear()


# --------------------------------------------------------------------------------------- recording
_avals: dict[Any, Any] = {}


def defer(fn: Callable[[list[Any]], Any], inputs: list[Any], op: Any) -> Node:
    """A node for `fn(inputs)`. Its output's shape is decided by `fn` (one per plan, or per write geometry)
    and the inputs' shapes: keyed by the function, not by the plan key, whose hash would be recomputed
    (an OpOverload's hash is a Python call) on every op."""
    in_avals = []
    size = 0  # the longest chain of pending nodes below this one (a sum would count shared inputs again)
    for x in inputs:
        if type(x) is Node:
            in_avals.append(x.aval)
            if x.value is None and x.size > size:
                size = x.size
        else:
            in_avals.append((x.shape, x.dtype))
    size += 1
    akey = (fn, tuple(in_avals))
    aval = _avals.get(akey)
    if aval is None:  # imported here, not per op: an import statement costs microseconds even when cached
        from hf_tpu import runtime

        jax = runtime.jax()
        out = jax.eval_shape(fn, [jax.ShapeDtypeStruct(*a) for a in akey[1]])
        # a plain (shape, dtype) tuple: JAX's abstract values hash and compare in Python, slowly, per op;
        # a multi-output op's node has a tuple of them, one per output (see `part`)
        aval = _avals[akey] = (tuple((tuple(o.shape), o.dtype) for o in out) if isinstance(out, tuple | list)
                               else (tuple(out.shape), out.dtype))
    node = Node(fn, inputs, aval, op, size)
    _stats["deferred_ops"] += 1
    if size >= MAX_PENDING:
        _reasons["limit"] += 1
        node()
    return node


@functools.cache  # one getter per index, so graphs that differ in nothing else share a program
def _getter(i: int) -> Callable[[list[Any]], Any]:
    def get(inputs: list[Any]) -> Any:
        return inputs[0][i]

    return get


def part(node: Node, i: int) -> Node:
    """Output `i` of a multi-output node (whose value is a tuple of arrays), as a node of its own: the
    tensors hang off these, and the multi-output node is an internal of the graph."""
    size = 1 + node.size if node.value is None else 1
    return Node(_getter(i), [node], node.aval[i], node.op, size)


def resolve(x: Any) -> Any:
    """A node's array if it has run, else the node."""
    return x.value if type(x) is Node and x.value is not None else x


# ----------------------------------------------------------------------------------------- running
def _graph(roots: list[Node]) -> list[Node]:
    """The pending nodes the roots depend on, in an order where inputs come first."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for x in node.inputs:
            if type(x) is Node and x.value is None and id(x) not in seen:
                stack.append((x, False))
    return order


# Nodes whose tensors may still be alive, in the order they were attached (weak: a dropped tensor's node
# must be free to go). When a graph runs, every one still pending and held joins it, so that a forward's
# several outputs (logits, hidden states, a KV cache), each read by a `.cpu()` of its own, come out of one
# program rather than one each; Strict computes all of them anyway.
_attached: list[Any] = []


def _held_pending(root: Node) -> list[Node]:
    global _attached
    refs, _attached = _attached, []
    out = []
    for ref in refs:
        n = ref()
        if n is not None and n is not root and n.value is None and n.buf_ref is not None \
                and n.buf_ref() is not None:
            out.append(n)
    return out


def _run_graph(root: Node) -> None:
    others = _held_pending(root)
    # one of the others may be what fails: then the root's own graph decides what is raised
    if not others or not _run_nodes(root, [root, *others]):
        _run_nodes(root, [root])


def _run_nodes(root: Node, roots: list[Node]) -> bool:
    """Run the graph of `roots` as one program; False (nothing run) if a program of several roots failed."""
    from hf_tpu import xla_options

    nodes = _graph(roots)
    pos = {id(n): i for i, n in enumerate(nodes)}
    externals: list[Any] = []
    ext_pos: dict[int, int] = {}
    structure = []
    for n in nodes:
        refs = []
        for x in n.inputs:
            x = resolve(x)
            if type(x) is Node:
                refs.append(pos[id(x)])
            else:
                if id(x) not in ext_pos:
                    ext_pos[id(x)] = len(externals)
                    externals.append(x)
                refs.append(-1 - ext_pos[id(x)])
        structure.append((n.fn, tuple(refs)))
    # a node is an output when its tensor is still alive; the root always is
    outputs = tuple(i for i, n in enumerate(nodes) if n is root or (n.buf_ref is not None and n.buf_ref() is not None))
    key = (tuple(structure), outputs)
    prog = _programs.get(key)
    if prog is None:
        _stats["cache_misses"] += 1
        prog = _programs[key] = xla_options.jit(_program(tuple(structure), outputs))  # by size: xla_options.py
    else:
        _stats["cache_hits"] += 1
    try:
        results = prog(*externals)
    except Exception:
        if len(roots) > 1:
            return False
        _count_graph()
        _stats["fallbacks"] += 1
        results = _run_one_by_one(nodes, structure, externals, outputs)
    else:
        _count_graph()
    for i, r in zip(outputs, results, strict=True):
        n = nodes[i]
        n.value = r
        n.inputs = []  # drop references to inputs: they may now be freed
        buf = n.buf_ref() if n.buf_ref is not None else None
        if buf is not None and buf._array is None and buf._loader is n:
            buf.array = r
    return True


def _count_graph() -> None:
    _stats["graphs"] += 1
    _reasons[_op_name(current_op)] += 1


def _program(structure: tuple, outputs: tuple) -> Callable[[list[Any]], Any]:
    def run(*externals: Any) -> list[Any]:  # positional: jax.jit's fast path flattens no list
        vals: list[Any] = []
        for fn, refs in structure:
            vals.append(fn([vals[r] if r >= 0 else externals[-1 - r] for r in refs]))
        return [vals[i] for i in outputs]

    return run


def _run_one_by_one(nodes: list[Node], structure: list, externals: list[Any], outputs: tuple) -> list[Any]:
    """After a fused program failed: each node's own program in turn, so the error names its op."""
    vals: list[Any] = []
    for n, (fn, refs) in zip(nodes, structure, strict=True):
        try:
            vals.append(fn([vals[r] if r >= 0 else externals[-1 - r] for r in refs]))
        except Exception as exc:
            raise TpuOpError(n.op, exc) from exc
    return [vals[i] for i in outputs]


def _op_name(op: Any) -> str:
    if op is None:
        return "other"
    return op_name(op)


def attach(node: Node, buf: Any) -> None:
    node.buf_ref = weakref.ref(buf)
    _attached.append(weakref.ref(node))
