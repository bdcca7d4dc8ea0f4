"""Is a comparison worth anything? Uninformative baseline outputs, and runs that differ from themselves.

A baseline output tensor is uninformative when it is all zeros, constant, has non-finite values, or is
bit-identical when the inputs change (`perturb_inputs`): any backend would "match" it. A row is
uninformative when every one of its output tensors is (column `uninformative`); coverage.md does not count
such rows as numerics passes and lists them. A tensor that carries information keeps the row informative.

Nondeterminism: the steady-state repeats run the same inputs again; two `tpu` runs that are not
bit-identical flag the row (column `nondeterministic`), as dynamo's `eager_two_runs_differ` does.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.core.tensors import tensor_problem  # noqa: F401 - re-exported

PERTURB_SCALE = 0.5  # floating inputs move by half their own std: a large, in-distribution change
ID_SUFFIXES = ("input_ids",)  # integer inputs that are safe to permute (token order changes, vocabulary kept)


def perturb_inputs(inputs: dict, seed: int = 0) -> dict | None:
    """A copy of `inputs` with floating tensors moved by PERTURB_SCALE of their std (seeded) and *input_ids
    rolled along the sequence; None when nothing can be perturbed (a pipeline's Python-only inputs)."""
    g = torch.Generator().manual_seed(seed + 1)
    changed = False

    def fn(name: str, v: Any) -> Any:
        nonlocal changed
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and v.numel() > 0:
                changed = True
                std = float(v.double().std()) if v.numel() > 1 else 1.0
                noise = torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype)
                return v + PERTURB_SCALE * (std or 1.0) * noise
            if name.endswith(ID_SUFFIXES) and v.ndim >= 1 and v.shape[-1] > 1:
                changed = True
                return v.roll(1, dims=-1)
            return v.clone()
        if isinstance(v, dict):
            return {k: fn(str(k), x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(fn(name, x) for x in v)
        return v

    out = {k: fn(str(k), v) for k, v in inputs.items()}
    return out if changed else None


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def uninformative(ref: dict, perturbed: dict | None = None) -> str:
    """'' when at least one baseline tensor carries information, else a short account of why none does."""
    if not ref:
        return ""
    why: dict[str, str] = {}
    for name, t in ref.items():
        problem = tensor_problem(t)
        if not problem and perturbed is not None and name in perturbed and _identical(t, perturbed[name]):
            problem = "unchanged when the input changes"
        if not problem:
            return ""
        why[name] = problem
    kinds: dict[str, list[str]] = {}
    for name, problem in why.items():
        kinds.setdefault(problem, []).append(name)
    return "; ".join(f"{k}: {', '.join(v[:3])}{' …' if len(v) > 3 else ''}" for k, v in kinds.items())[:200]


def first_difference(a: dict, b: dict) -> str:
    """'' when two runs' outputs are bit-identical, else the first tensor that differs and by how much."""
    if set(a) != set(b):
        return f"output names differ: {sorted(set(a) ^ set(b))[:3]}"
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            return f"{name}: shape {tuple(x.shape)} then {tuple(y.shape)}"
        if not _identical(x, y):
            diff = (x.double() - y.double()).abs().nan_to_num(0.0)
            return f"{name}: max |run1 - run2| = {float(diff.max()):.3g}"
    return ""
