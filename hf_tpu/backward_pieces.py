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
up to `pieces` pieces, each releasing about an equal share of the graph's input bytes, each cut where the
fewest bytes cross it that one program would not write out either (in a transformer, between layers: the
residual stream's gradient), and never where that is more than an eighth of a share (inside the cross-entropy's
elementwise chain over the vocabulary, say). Views and casts are computed in the piece of their first reader, so
a cut crosses the value they read. A graph whose inputs are too small to be worth more programs is compiled
whole. The pieces are the same ATen ops lowered the same way; XLA fuses within a piece only.

Measured (`benchmarks/backward_phases.py`: GPT-2 124M, AdamW fused, bfloat16 autocast, 4 x 128, quiet machine;
the backward's CPU-seconds, median (min-max) of steps 3-6, and the process's peak RSS): one program 0.85
(0.81-0.90), 3.14 GB; as here, 13 pieces, 0.86 (0.82-0.86), 3.09 GB; the first version, cut by bytes alone
(three cuts in the head, each writing a (4, 128, 50257) value, and the LM head's float32 weight gradient
crossing every cut), 1.19-1.27 CPU-s, 3.07 GB. Losses and gradient sums bit-identical to the one program's.
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


aten = torch.ops.aten
# Ops whose results XLA writes to memory in one program too (a dot's or convolution's consumers are not fused
# into it; hf-tpu's torch dots are custom calls): a cut after them materialises nothing the whole program would not
_MATERIALISED = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
                 aten.convolution.default, aten.convolution_backward.default}
# Views and casts of one value are computed in the piece of their first reader, so that a cut crosses the value
# they read rather than a copy (GPT-2's tied embedding: the LM head's weight gradient, cast to float32 at the
# start of the backward and read at its end, crossed every cut as a 154 MB float32 copy)
_SUNK = {aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default, aten._unsafe_view.default,
         aten._to_copy.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.alias.default}
# A cut may materialise at most this share of the input bytes a piece releases (between transformer layers: the
# residual stream's gradient, ~3% of a GPT-2 layer's saved activations). The values crossing a cut are written
# to fresh buffers and read back, and XLA's fusion across it is lost: GPT-2's cross-entropy backward, cut from
# the LM head's gradient dots at two (4, 128, 50257) values, cost +0.3 CPU-s per step.
MAX_CROSSING_SHARE = 0.125


def _order(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """gm's nodes in the order its pieces run them: views and casts (_SUNK) moved to just before their first
    reader (a valid order: a moved node's input comes before it still)."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    place = dict(index)
    sunk = set()
    for n in reversed(nodes):
        if (n.op == "call_function" and n.target in _SUNK and len(n.all_input_nodes) == 1 and n.users
                and all(u.op != "output" for u in n.users)):
            place[n] = min(place[u] for u in n.users)
            sunk.add(n)
    # a moved node goes before its reader; moved nodes bound for one reader keep their own order
    return sorted(nodes, key=lambda n: (place[n], n not in sunk, index[n]))


def _materialised(n: torch.fx.Node) -> bool:
    if n.target is operator.getitem:
        n = n.args[0]
    return n.op == "call_function" and n.target in _MATERIALISED


def plan(gm: torch.fx.GraphModule, min_piece_bytes: int | None = None, max_pieces: int = MAX_PIECES
         ) -> list[int]:
    """Positions in `_order(gm)` after which the graph is cut (empty: compiled whole). `min_piece_bytes`
    (default MIN_PIECE_BYTES, or HF_TPU_BACKWARD_PIECE_BYTES): the input bytes a piece must release."""
    if min_piece_bytes is None:
        min_piece_bytes = int(os.environ.get("HF_TPU_BACKWARD_PIECE_BYTES", MIN_PIECE_BYTES))
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    # symbolic sizes or scalar inputs: compiled whole (a piece's program would need them passed along)
    if any(not isinstance(p.meta.get("val"), torch.Tensor) for p in placeholders) or any(
            isinstance(d, torch.SymInt) for p in placeholders for d in p.meta["val"].shape):
        return []
    if any(n.op == "call_function" and n.target is torch.ops.higher_order.with_effects for n in nodes):
        return []  # effect tokens order their ops across the whole program (and carry error checks)
    nodes = _order(gm)
    place = {n: i for i, n in enumerate(nodes)}
    last = {n: max((place[u] for u in n.users), default=place[n]) for n in nodes}
    total = sum(_bytes(p.meta["val"]) for p in placeholders)
    count = min(max_pieces, total // max(min_piece_bytes, 1))
    if count < 2:
        return []
    # freed[i]: input bytes whose last reader is at or before position i; crossing[i]: bytes of intermediate
    # values made at or before i and read after it that one program would not write out either (not the
    # graph's outputs, held to the end anyway, nor dot results)
    freed = [0] * len(nodes)
    crossing = [0] * (len(nodes) + 1)
    for p in placeholders:
        freed[last[p]] += _bytes(p.meta["val"])
    for n in nodes:
        if (n.op == "call_function" and last[n] > place[n] and not any(u.op == "output" for u in n.users)
                and not _materialised(n)):
            b = _bytes(n.meta.get("val"))
            crossing[place[n]] += b
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
        # a cut has call nodes on both sides, and not a multi-output op's results before their getitems; and
        # it materialises little (MAX_CROSSING_SHARE)
        window = [i for i in range(start, len(nodes) - 2) if nodes[i].op == "call_function"
                  and nodes[i + 1].target is not operator.getitem and lo <= freed[i] <= hi
                  and crossing[i] <= share * MAX_CROSSING_SHARE]
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
    order = _order(gm)
    for before, n in zip(order, order[1:]):  # the graph in that order, so that each piece's nodes are together
        before.append(n)
    gm.recompile()
    place = {n: i for i, n in enumerate(order)}
    split = split_module(gm, None, lambda n: sum(place[n] > c for c in cuts), keep_original_order=True)
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
