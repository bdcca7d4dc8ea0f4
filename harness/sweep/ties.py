"""Ties in ranking selections, seen in the CPU baseline's forward.

The RT-DETR family selects its decoder queries with `topk` over encoder scores. At random init those scores
have exact ties (or ties within float32 noise), which XLA's `top_k`, CPU's kernel and the float64 run break
differently: the same queries come out in another order, and comparing the outputs row by row reports a
wrong number where there is only another tie order. `TieWatch` (a TorchFunctionMode around the baseline's
forward, eager on CPU) records each `topk`/`sort`/`argsort`/`argmax`/`argmin` whose baseline scores have
near-ties: adjacent selected (or boundary) values closer than `REL` times the scores' scale. The row's `ties`
column lists them; numerics.compare_outputs then compares tensors whose dim 1 has a tied selection's size up
to a permutation of that dim (harness/sweep/numerics.py: `_compare_permuted`).
"""

from __future__ import annotations

import collections

import torch
from torch.overrides import TorchFunctionMode

REL = 1e-5  # near-tie: closer than float32 noise accumulated over a few ops, relative to the scores' scale
_RANKING = {torch.topk, torch.Tensor.topk, torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort,
            torch.argmax, torch.Tensor.argmax, torch.argmin, torch.Tensor.argmin}


def _arg(args, kwargs, i, name, default):
    return kwargs.get(name, args[i] if len(args) > i else default)


def _near_tie(values: torch.Tensor, dim: int, scale: float) -> bool:
    """Adjacent entries of `values` (sorted along `dim`) closer than REL * scale."""
    if values.shape[dim] < 2 or scale == 0:
        return False
    gaps = values.float().diff(dim=dim).abs()
    return bool((gaps <= REL * scale).any())


class TieWatch(TorchFunctionMode):
    """Records near-tied ranking selections: `sizes` (the selected dimension's length) and a summary."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: set[int] = set()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _RANKING and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() \
                and args[0].numel() > 1:
            try:
                self._check(func, args, kwargs, out)
            except Exception:  # noqa: BLE001  (an unusual signature: no evidence, never a failure)
                pass
        return out

    def _check(self, func, args, kwargs, out) -> None:
        x = args[0].detach()
        scale = float(x.float().abs().nan_to_num(0.0).max())
        name = func.__name__
        if name == "topk":
            k = _arg(args, kwargs, 1, "k", None)
            dim = _arg(args, kwargs, 2, "dim", -1)
            # the k selected values and the first one left out: a tie at the boundary changes the set
            more = min(k + 1, x.shape[dim])
            vals = torch.topk(x.float(), more, dim=dim).values
            size = k
        elif name in ("sort", "argsort"):
            dim = _arg(args, kwargs, 1, "dim", -1)
            vals, size = torch.sort(x.float(), dim=dim).values, x.shape[dim]
        else:
            dim = _arg(args, kwargs, 1, "dim", None)
            flat = x.float().flatten() if dim is None else x.float()
            d = -1 if dim is None else dim
            vals, size = torch.topk(flat, min(2, flat.shape[d]), dim=d).values, 1
            dim = d
        if _near_tie(vals, dim, scale):
            self.sizes.add(int(size))
            self.seen[f"{name}({size})"] += 1

    def summary(self) -> str:
        return ";".join(f"{k}:{v}" for k, v in sorted(self.seen.items()))
