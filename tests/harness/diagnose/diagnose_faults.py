"""Deliberate faults for the diagnose tests, applied in-process (`with applied(name)`) or, for a repro run in a
subprocess, by a sitecustomize.py that calls `apply(name)` for the whole process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

GELU = torch.ops.aten.gelu.default
ERFINV = torch.ops.aten.erfinv.default
PERTURBATION = 1e-2


@contextlib.contextmanager
def applied(name: str) -> Iterator[None]:
    """The fault `name` within the block, through hf_tpu.hooks.override_lowerings."""
    from hf_tpu import hooks, lowering

    if name == "perturb_gelu":
        def replace(op, fn):  # noqa: ANN001, ANN202
            return (lambda *a, **k: fn(*a, **k) + PERTURBATION) if op is GELU else None

        with hooks.override_lowerings(replace):
            yield
    elif name == "missing_erfinv":
        old_dec = lowering.decomposition
        lowering.decomposition = lambda op: None if op is ERFINV else old_dec(op)
        try:
            with hooks.override_lowerings(lambda op, fn: hooks.NO_LOWERING if op is ERFINV else None):
                yield
        finally:
            lowering.decomposition = old_dec
    else:
        raise ValueError(name)


_held: list[contextlib.AbstractContextManager] = []


def apply(name: str) -> None:
    """The fault `name` for the rest of the process (a repro script's sitecustomize)."""
    held = applied(name)
    held.__enter__()
    _held.append(held)


SITECUSTOMIZE = """import sys
sys.path.insert(0, {here!r})
import diagnose_faults
diagnose_faults.apply({name!r})
"""
