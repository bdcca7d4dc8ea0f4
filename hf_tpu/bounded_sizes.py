"""Bounded dynamism's sizes (bounded.py): which dimensions are symbols, a symbolic size evaluated at a call's
actual values, and the buckets (TorchTPU's: consecutive multiples of `bucket_size`) whose upper bounds the
inputs are padded to."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


# ---------------------------------------------------------------------------------------- symbolic sizes


def expr(x: Any) -> Any:
    """The sympy expression of a SymInt (an int stays an int)."""
    return x.node.expr if isinstance(x, torch.SymInt) else x


def is_dyn(x: Any) -> bool:
    e = expr(x)
    return not isinstance(e, int) and bool(getattr(e, "free_symbols", None))


def dyn_dims(val: Any) -> list[int]:
    return [d for d, s in enumerate(val.shape) if is_dyn(s)] if isinstance(val, torch.Tensor) else []


class Unsupported(Exception):
    """A graph (or size expression) bounded dynamism has no rule for: the graph keeps static shapes."""


def evaluate(expr: Any, env: dict[Any, Any]) -> Any:
    """`expr` (Integer, Symbol, +, *) at the symbols' values in `env` (ints or traced JAX scalars)."""
    import sympy

    if isinstance(expr, int):
        return expr
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    if isinstance(expr, sympy.Add):
        return sum((evaluate(a, env) for a in expr.args[1:]), evaluate(expr.args[0], env))
    if isinstance(expr, sympy.Mul):
        return math.prod((evaluate(a, env) for a in expr.args[1:]), start=evaluate(expr.args[0], env))
    raise Unsupported(f"size expression {expr}")


def _coefficient(expr: Any, sym: Any) -> int | None:
    """k when expr == k*sym (k a positive int), else None."""
    import sympy

    k = sympy.simplify(sympy.sympify(expr) / sym)
    return int(k) if isinstance(k, sympy.Integer) and k > 0 else None


# ---------------------------------------------------------------------------------------------- buckets


@dataclass
class Buckets:
    """Per bucket, each symbol's upper bound; buckets cover [lower, upper] of every symbol contiguously."""

    symbols: list[Any]
    uppers: list[dict[Any, int]]
    lower: dict[Any, int]

    def index(self, values: dict[Any, int]) -> int:
        for i, ups in enumerate(self.uppers):
            if all(values[s] <= ups[s] for s in self.symbols):
                return i
        raise ValueError(f"dynamic sizes {values} exceed the compiled buckets {self.uppers}")


def make_buckets(symbols: Sequence[Any], ranges: dict[Any, tuple[int, int | None]], hints: dict[Any, int],
                 num_buckets: int, bucket_size: int) -> Buckets:
    """TorchTPU's buckets: the first upper bound is the first multiple of `bucket_size` at or above the traced
    size (and above the lower bound), each next one `bucket_size` further, the last extended to the finite
    `max` if there is one; a symbol that reached its max stays there."""
    per_symbol: dict[Any, list[int]] = {}
    for s in symbols:
        lower, upper = ranges[s]
        start = max(lower, hints[s])
        first = -(-start // bucket_size) * bucket_size
        if first <= lower and (upper is None or upper > lower):
            first += bucket_size
        ups: list[int] = []
        for i in range(num_buckets):
            last = i == num_buckets - 1
            cand = upper if (last and upper is not None) else first + i * bucket_size
            if upper is not None:
                cand = min(cand, upper)
            if ups and cand <= ups[-1]:
                cand = ups[-1]
            ups.append(cand)
        per_symbol[s] = ups
    uppers: list[dict[Any, int]] = []
    for i in range(num_buckets):
        b = {s: per_symbol[s][i] for s in symbols}
        if uppers and b == uppers[-1]:
            break  # every symbol reached its max
        uppers.append(b)
    return Buckets(list(symbols), uppers, {s: ranges[s][0] for s in symbols})


Factors = list[tuple[Any, ...]]  # per dimension, the row-major factors it is made of (size-1 factors dropped)


def clean_factors(val: Any) -> Factors:
    """A tensor's dimensions, each its own single factor (no view has merged any)."""
    return [(expr(x),) for x in val.shape] if isinstance(val, torch.Tensor) else []


def is_clean(f: Factors) -> bool:
    """No dynamic dimension is merged with another."""
    return all(len(dim) <= 1 or not any(is_dyn(x) for x in dim) for dim in f)

