"""Which ATen ops hf-tpu runs, and how: one row per op, from the registry of our own rules (op_registry.py),
torchax's lowering table and the decomposition tables, as the device looks them up.

    python -m hf_tpu.op_table                 # every op torchax, PyTorch or hf-tpu has a rule for
    python -m hf_tpu.op_table --ours          # only the ops with a rule of ours
    python -m hf_tpu.op_table --op cholesky   # ops whose name contains a string

`lowering` says what runs the op's values: ours (in which module; a "graph" rule only in compiled graphs),
torchax's, a decomposition (eager traces it as one program, compiled graphs decompose it first), PyTorch's
composite (decomposed above autograd, it never reaches tpu whole), or none (HF_TPU_CPU_FALLBACK=1 runs it
on CPU, otherwise it raises NoLowering). `kinds` lists every rule of ours (op_registry.KINDS) and `flags` the
per-op rules the lowerings obey (op_registry.FLAGS).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch

# these register rules (op_registry) when imported: the table is complete only with all of them loaded
from hf_tpu import (backward_lowerings, cross_entropy, device, dispatch, graph_compiler, lowering,  # noqa: F401
                    op_registry, sdpa)
from hf_tpu.errors import op_name


@dataclass(frozen=True)
class Row:
    op: str
    lowering: str  # "ours", "ours, over torchax's", "torchax", "decomposed", "composite", "python only", "none"
    kinds: tuple[str, ...]  # our rules for the op
    modules: tuple[str, ...]  # where they are written
    flags: tuple[str, ...]


def _overloads(key: Any) -> list[Any]:
    if isinstance(key, torch._ops.OpOverloadPacket):
        return [getattr(key, name) for name in key.overloads()]
    return [key] if isinstance(key, torch._ops.OpOverload) else []


def _torchax_has(op: Any, table: dict[Any, Any]) -> bool:
    return op in table or getattr(op, "overloadpacket", None) in table


def _lowering(op: Any, kinds: tuple[str, ...], torchax: dict[Any, Any]) -> str:
    if set(kinds) - {"graph_decomposition"}:
        return "ours, over torchax's" if _torchax_has(op, torchax) else "ours"
    if lowering.find(op) is not None:
        return "torchax"
    if lowering.decomposition(op) is not None or "graph_decomposition" in kinds:
        return "decomposed"
    try:
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            return "composite"  # PyTorch decomposes it above autograd: it never reaches tpu whole
    except RuntimeError:
        return "python only"  # an overload the C++ dispatcher does not know (aten::copy_.float)
    return "none"


def rows() -> list[Row]:
    """One row per ATen op (an OpOverload) that torchax, PyTorch's decompositions or hf-tpu has a rule for."""
    from torch._decomp import decomposition_table

    from hf_tpu.torchax_compat import load_op_table

    torchax, decomps = load_op_table()
    ops: set[Any] = set()
    for key in (*torchax, *decomps, *decomposition_table):
        ops.update(_overloads(key))
    for kind in op_registry.KINDS:
        ops.update(op_registry.table(kind))
    for flag in op_registry.FLAGS:
        for key in op_registry.flagged(flag):
            ops.update(_overloads(key))
    modules = {(e.kind, e.op): e.module for e in op_registry.entries()}
    out = []
    for op in ops:
        kinds = tuple(k for k in op_registry.KINDS if op in op_registry.table(k))
        out.append(Row(op_name(op), _lowering(op, kinds, torchax), kinds,
                       tuple(dict.fromkeys(modules[(k, op)] for k in kinds)), op_registry.flags_of(op)))
    return sorted(out, key=lambda r: r.op)


def format_rows(table: list[Row]) -> str:
    head = ("op", "lowering", "kinds", "where", "flags")
    lines = [head] + [(r.op, r.lowering, ",".join(r.kinds), ",".join(m.removeprefix("hf_tpu.") for m in r.modules),
                       ",".join(r.flags)) for r in table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_tpu.op_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", action="store_true", help="only ops with a rule of ours (a kind or a flag)")
    parser.add_argument("--op", default="", help="only ops whose name contains this string")
    args = parser.parse_args(argv)
    table = [r for r in rows() if args.op in r.op and (not args.ours or r.kinds or r.flags)]
    print(format_rows(table))
    counts: dict[str, int] = {}
    for r in table:
        counts[r.lowering] = counts.get(r.lowering, 0) + 1
    print(f"\n{len(table)} ops: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
