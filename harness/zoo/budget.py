"""Parameter budget: count a model's parameters before allocating it, so a shrink rule that misses a key
fails the entry with a reason instead of building (and sweeping) a huge model."""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.zoo.entry import ZooBuildError

DEFAULT_BUDGET = 5_000_000


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_budget(factory: Callable[[], torch.nn.Module], budget: int = DEFAULT_BUDGET) -> int | None:
    """Parameters of `factory()` built on the meta device (no memory); raises ZooBuildError(over_budget)
    above the budget. Returns None when the model cannot be built on meta (the caller counts after the
    real build instead)."""
    try:
        with torch.device("meta"):
            model = factory()
    except Exception:
        return None
    n = count(model)
    if n > budget:
        raise ZooBuildError(over_budget_message(model, n, budget), category="over_budget", stage="init")
    return n


def over_budget_message(model: torch.nn.Module, n: int, budget: int) -> str:
    biggest = sorted(((p.numel(), name) for name, p in model.named_parameters()), reverse=True)[:3]
    names = ", ".join(f"{name} {tuple(p.shape)}" for _, name in biggest for p in [model.get_parameter(name)])
    return f"{n:,} parameters > budget {budget:,} (largest: {names})"


def enforce(model: torch.nn.Module, budget: int = DEFAULT_BUDGET) -> int:
    n = count(model)
    if n > budget:
        raise ZooBuildError(over_budget_message(model, n, budget), category="over_budget", stage="init")
    return n
