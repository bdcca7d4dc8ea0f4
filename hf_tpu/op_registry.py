"""Every op hf-tpu runs by a hand-written rule, in one registry: the op, how it is run (its kind), the module the
rule is written in, and the per-op flags the lowerings obey.

torchax's lowerings are the base (torchax_compat.load_op_table); what is registered here overrides or extends
them. A rule is registered where it is written, by decorating it (or calling the decorator on a lambda or a
partial):

    @lowers(aten.eye.default, aten.eye.m)               # kind "jax": eager mode and compiled graphs
    def _eye(...): ...

    lowers(aten.is_pinned.default, kind="eager")(lambda *a, **k: False)

so `grep -rn "lowers(" hf_tpu` is the list, and `python -m hf_tpu.op_table` prints every op with where its
lowering comes from (ours, torchax's, a decomposition, or none). The tables are plain dicts read by cached
lookups (lowering.find, dispatch's per-op routes): registering costs nothing per op at run time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

KINDS: dict[str, str] = {
    "jax": "a JAX function on arrays, for eager mode and compiled graphs; lowering.find prefers it to torchax's",
    "backward": "a JAX function on arrays for a backward op (backward_lowerings.find, looked up first)",
    "graph": "a JAX function used only inside compiled graphs (graph_compiler.py)",
    "graph_decomposition": "a torch decomposition used only when compiled graphs are decomposed",
    "eager": "a kernel on tpu tensors that eager dispatch runs instead of any lowering (storage, views, "
             "write-backs, fused optimizer steps)",
    "autograd": "a kernel registered at AutogradPrivateUse1 (device.py), ahead of PyTorch's composite",
    "foreach_step": "a JAX function for one tensor of a foreach call, its Python scalars traced (foreach_ops.py), "
                    "where the single op's eager path checks a scalar's Python type",
}

FLAGS: dict[str, str] = {
    "opmath": "half-precision inputs computed in float32 and rounded once, as CPU's kernel (lowering_parity.py)",
    "half_as_written": "a pointwise op whose lowering rounds half-precision steps as CPU's kernel itself: "
                       "exempt from the float32-throughout rule (lowering.find)",
    "cast_input_first": "an explicit dtype= casts the input before the reduction, as PyTorch (lowering.py)",
    "lowering_dtypes": "its lowering's output dtypes are CPU's where the meta kernel's are not (op_dtypes.py)",
    "float8_as_is": "float8 operands passed as they are, not widened to float32 (eager_functional.py)",
    "per_op_kernel": "a PrivateUse1 kernel of its own, registered with the device (device.py)",
    "keep_composite": "its composite kernel keeps running for tpu: it moves data between devices (device.py)",
    "random": "draws random numbers with a key from rng.ENV: never cached as a program with the key baked in "
              "(random_ops.py)",
}


@dataclass(frozen=True)
class Entry:
    kind: str
    op: Any  # an OpOverload (or, for flags, an OpOverloadPacket standing for all its overloads)
    fn: Callable[..., Any]
    module: str  # where the rule is written


_tables: dict[str, dict[Any, Callable[..., Any]]] = {kind: {} for kind in KINDS}
_modules: dict[tuple[str, Any], str] = {}
_flags: dict[str, set[Any]] = {flag: set() for flag in FLAGS}


def _name(op: Any) -> str:
    from hf_tpu.errors import op_name

    return op_name(op)


def lowers(*ops: Any, kind: str = "jax") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers the decorated function as the `kind` rule of each op in `ops`; returns it unchanged. An op
    registered twice under one kind is an error naming both modules."""
    if kind not in KINDS:
        raise ValueError(f"unknown lowering kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if not ops:
        raise ValueError("lowers() needs at least one op")
    module = sys._getframe(1).f_globals.get("__name__", "?")
    table = _tables[kind]

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if op in table:
                raise ValueError(f"{_name(op)} is registered twice as a {kind!r} rule: in "
                                 f"{_modules[(kind, op)]} and in {module}; keep one")
            table[op] = fn
            _modules[(kind, op)] = module
        return fn

    return register


def table(kind: str) -> dict[Any, Callable[..., Any]]:
    """The live op -> rule table of one kind (read, never written, by the code that runs the rules)."""
    return _tables[kind]


def mark(flag: str, ops: Iterable[Any]) -> frozenset[Any]:
    """Records `flag` for each op and returns the ops as a frozenset (the module keeps it for its own checks)."""
    if flag not in FLAGS:
        raise ValueError(f"unknown op flag {flag!r}; the flags are {', '.join(FLAGS)}")
    ops = frozenset(ops)
    _flags[flag] |= ops
    return ops


def flagged(flag: str) -> frozenset[Any]:
    return frozenset(_flags[flag])


def flags_of(op: Any) -> tuple[str, ...]:
    packet = getattr(op, "overloadpacket", None)
    return tuple(f for f, ops in _flags.items() if op in ops or (packet is not None and packet in ops))


def entries() -> list[Entry]:
    """Every registered rule, by kind then op name."""
    out = [Entry(kind, op, fn, _modules[(kind, op)]) for kind, t in _tables.items() for op, fn in t.items()]
    return sorted(out, key=lambda e: (list(KINDS).index(e.kind), _name(e.op)))
