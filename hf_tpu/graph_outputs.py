"""A compiled graph's outputs that are its inputs, handed back as they came in rather than through its program.

XLA returns every output of a program in a buffer of its own: an output that is one of the program's
parameters is copied (JAX 0.10.2: `jax.jit(lambda a: (a, a + 1))` gives a copy of `a`, and so does the
compiled executable). AOTAutograd's forward graphs return inputs often: a parameter the backward needs (a
float32 matmul's weight, a layer norm's weight, every weight whose narrowing cast the partitioner recomputes)
is a forward output saved for the backward. Each compiled forward then copied those parameters, into memory
that stayed allocated until the backward had run. Returning the input itself is what eager PyTorch does
(autograd saves the tensor, not a copy), with the same values; the program is traced without those outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree


def forwarded_inputs(gm: torch.fx.GraphModule) -> dict[int, int]:
    """{position among the output's leaves: position among the graph's inputs} for the outputs that are graph
    inputs (placeholders) holding tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = pytree.tree_leaves(out_node.args[0])
    return {pos: placeholders.index(leaf) for pos, leaf in enumerate(leaves)
            if isinstance(leaf, torch.fx.Node) and leaf.op == "placeholder"
            and isinstance(leaf.meta.get("val"), torch.Tensor)}


def without_forwarded(fn: Callable[..., Any], forwarded: dict[int, int], with_infos: bool) -> Callable[..., Any]:
    """`fn` (a lowered graph) returning None in place of the forwarded outputs, so that the program does not
    copy them; `with_infos`: fn returns (outputs, error-check infos)."""
    def run(*args: Any) -> Any:
        out = fn(*args)
        infos = None
        if with_infos:
            out, infos = out
        leaves, spec = pytree.tree_flatten(out)
        for pos in forwarded:
            leaves[pos] = None
        out = pytree.tree_unflatten(leaves, spec)
        return (out, infos) if with_infos else out

    run.__dict__.update(fn.__dict__)  # error_checks and other attributes the compiler reads
    return run


def kept_inputs(args: list[Any], forwarded: dict[int, int]) -> dict[int, Any]:
    """The input tensors to hand back, by output position (read before the boxed inputs are cleared)."""
    return {pos: args[i] for pos, i in forwarded.items()}


def put_back(results: list[Any], kept: dict[int, Any]) -> None:
    """The kept inputs in their output positions (`results`: the output's leaves, in order)."""
    for pos, tensor in kept.items():
        results[pos] = tensor
