"""A compiled training graph's backward run as a few consecutive XLA programs, so that its saved activations
are freed as it goes, as eager autograd frees each layer's.

One XLA program holds all of its inputs until it returns, and XLA:CPU allocates its outputs and temporaries
when it starts: a backward compiled whole kept every activation the forward saved, beside every gradient,
until its last gradient was written (GPT-2 124M, bfloat16 autocast, 4 x 128: 0.43 GB saved + 0.46 GB of
gradients + 0.19 GB of temporaries at once, the step's peak). Split in pieces along its node order (the
reverse of the forward's layers), each piece's program holds only the saved tensors it reads, and a saved
tensor goes when the last piece that reads it has run: AOTAutograd clears the autograd context's saved tensors
before it calls the backward (`ctx.maybe_clear_saved_tensors()`), and the pieces run under torch.fx's
Interpreter with `garbage_collect_values` from a boxed argument list, so nothing else holds them.

The cuts (`plan`) are chosen from the graph alone (a graph loaded from the graph cache is cut the same way):
`pieces` pieces, each releasing about an equal share of the graph's input bytes, each cut where the fewest
bytes of intermediate values cross it (in a transformer, between layers: the residual stream's gradient). A
graph whose inputs are too small to be worth more programs is compiled whole. The pieces are the same ATen
ops lowered the same way; XLA fuses within a piece only, and the values that cross a cut are materialised.

Measured (GPT-2 124M, AdamW fused, bfloat16 autocast, 4 x 128: benchmarks/finetune_step.py --modes tpu-compiled,
3 pairs of processes alternating with HF_TPU_BACKWARD_PIECE_BYTES=100000000000, which compiles every backward
whole; machine loaded by a 2-worker sweep): 14 pieces; peak RSS 2.99-3.10 GB against 3.18-3.25 (CPU 2.87-2.89);
losses and gradient sums bit-identical; CPU-seconds per step 1.91-2.17 against 1.68-1.91 (+0.23-0.30 in each
pair: more page faults as the freed blocks are reused, or the materialised cut values; not separated).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.passes.split_module import split_module
from torch.utils import _pytree as pytree

from hf_tpu import graph_compiler

# Below this many input bytes per piece a split saves less than a program's own overhead is worth; with
# them, a graph is cut in at most MAX_PIECES (the dispatches of ~16 programs are ~1 ms of a step that takes
# a second when there is that much to free).
MIN_PIECE_BYTES = 32 * 2**20
MAX_PIECES = 16


def _bytes(val: Any) -> int:
    return sum(v.numel() * v.element_size() for v in pytree.tree_leaves(val) if isinstance(v, torch.Tensor))


def plan(gm: torch.fx.GraphModule, min_piece_bytes: int | None = None, max_pieces: int = MAX_PIECES
         ) -> list[int]:
    """Positions in gm's node list after which the graph is cut (empty: compiled whole). `min_piece_bytes`
    (default MIN_PIECE_BYTES, or HF_TPU_BACKWARD_PIECE_BYTES): the input bytes a piece must release."""
    if min_piece_bytes is None:
        min_piece_bytes = int(os.environ.get("HF_TPU_BACKWARD_PIECE_BYTES", MIN_PIECE_BYTES))
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    # symbolic sizes or scalar inputs: compiled whole (a piece's program would need them passed along)
    if any(not isinstance(p.meta.get("val"), torch.Tensor) for p in placeholders) or any(
            isinstance(d, torch.SymInt) for p in placeholders for d in p.meta["val"].shape):
        return []
    if any(n.op == "call_function" and n.target is torch.ops.higher_order.with_effects for n in nodes):
        return []  # effect tokens order their ops across the whole program (and carry error checks)
    last = {n: max((index[u] for u in n.users), default=index[n]) for n in nodes}
    total = sum(_bytes(p.meta["val"]) for p in placeholders)
    count = min(max_pieces, total // max(min_piece_bytes, 1))
    if count < 2:
        return []
    # freed[i]: input bytes whose last reader is at or before position i; crossing[i]: bytes of intermediate
    # values made at or before i and read after it (not the graph's outputs, which are held to the end anyway)
    freed = [0] * len(nodes)
    crossing = [0] * (len(nodes) + 1)
    for p in placeholders:
        freed[last[p]] += _bytes(p.meta["val"])
    for n in nodes:
        if n.op == "call_function" and last[n] > index[n] and not any(u.op == "output" for u in n.users):
            b = _bytes(n.meta.get("val"))
            crossing[index[n]] += b
            crossing[last[n]] -= b
    for i in range(1, len(nodes)):
        freed[i] += freed[i - 1]
        crossing[i] += crossing[i - 1]
    first = len(placeholders)
    cuts: list[int] = []
    share = total / count
    for k in range(1, count):
        lo, hi = k * share - share / 2, k * share + share / 2
        # each piece releases half a share at least (one large input can span several shares: fewer pieces)
        start = cuts[-1] + 1 if cuts else first
        lo = max(lo, (freed[cuts[-1]] if cuts else 0) + share / 2)
        # a cut has call nodes on both sides, and not a multi-output op's results before their getitems
        window = [i for i in range(start, len(nodes) - 2) if nodes[i].op == "call_function"
                  and nodes[i + 1].target is not operator.getitem and lo <= freed[i] <= hi]
        if window:
            cuts.append(min(window, key=lambda i: (crossing[i], abs(freed[i] - k * share))))
    return cuts


def _tuple_output(piece: torch.fx.GraphModule) -> bool:
    """Makes the piece return a tuple (graph_compiler's programs return their output's leaves as a list);
    True if it returned one value."""
    out = next(n for n in piece.graph.nodes if n.op == "output")
    if isinstance(out.args[0], (tuple, list)):
        return False
    out.args = ((out.args[0],),)
    piece.recompile()
    return True


class _Runner(torch.fx.Interpreter):
    """The split graph run piece by piece; each value dropped after its last reader (garbage_collect_values)."""

    def __init__(self, outer: torch.fx.GraphModule, pieces: dict[str, Callable[[list[Any]], Any]]) -> None:
        super().__init__(outer, garbage_collect_values=True)
        self.pieces = pieces

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.pieces[target](list(args))


def compile_backward(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None
                     ) -> Callable[..., Any]:
    """AOTAutograd's backward compiler: graph_compiler.compile_graph's program, or one program per piece of
    `plan(gm)` run in order (module docstring). Boxed: called with one list of inputs, which it clears."""
    cuts = plan(gm)
    if not cuts:
        # options by keyword: hooks.observe_graphs (hf-tpu diagnose) stands in for compile_graph and takes them so
        return graph_compiler.compile_graph(gm, example_inputs, options=options)
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    split = split_module(
        gm, None, lambda n: sum(position[n] > c for c in cuts), keep_original_order=True)
    pieces: dict[str, Callable[[list[Any]], Any]] = {}
    for name, piece in split.named_children():
        single = _tuple_output(piece)
        run = graph_compiler.compile_graph(piece, [n.meta["val"] for n in piece.graph.nodes
                                                   if n.op == "placeholder"], options=options)
        pieces[name] = (lambda r: lambda args: r(args)[0])(run) if single else run

    def call(args: list[Any]) -> Any:
        return _Runner(split, pieces).boxed_run(args)

    call._boxed_call = True  # type: ignore[attr-defined]
    call.pieces = len(pieces)  # type: ignore[attr-defined]
    return call
