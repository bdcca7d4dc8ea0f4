"""Per-family fixes where generic shrinking is not enough, one row per model_type.

A rule can give constructor arguments for the unshrunk base config (`base`, when the class's own defaults
do not validate), values merged over the shrunk config dict (`config`), attributes set after construction
(`after`), and an input fixer (`inputs`) for models whose forward needs something the generic builders
cannot derive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

DELETE = object()  # in `config`: drop the key so the constructor derives it


@dataclass(frozen=True)
class Rule:
    base: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    inputs: Callable[[Any, Any, dict[str, Any], int], dict[str, Any]] | None = None


NO_RULE = Rule()

RULES: dict[str, Rule] = {}


def rule_for(model_type: str) -> Rule:
    return RULES.get(model_type, NO_RULE)
