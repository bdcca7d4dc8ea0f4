"""Deliberate faults for the diagnose tests, applied in-process (monkeypatch) or, for a repro run in a
subprocess, by a sitecustomize.py that calls `apply(name)`."""

from __future__ import annotations

import functools

import torch

GELU = torch.ops.aten.gelu.default
ERFINV = torch.ops.aten.erfinv.default
PERTURBATION = 1e-2


def apply(name: str, setattr=setattr) -> None:  # noqa: A002 - monkeypatch.setattr or the builtin
    from hf_tpu import lowering, op_jit

    orig = lowering.find.__wrapped__  # the uncached lookup

    if name == "perturb_gelu":
        @functools.cache
        def find(op):
            fn = orig(op)
            if op is GELU and fn is not None:
                return lambda *a, **k: fn(*a, **k) + PERTURBATION
            return fn
    elif name == "missing_erfinv":
        @functools.cache
        def find(op):
            return None if op is ERFINV else orig(op)

        old_dec = lowering.decomposition
        setattr(lowering, "decomposition", lambda op: None if op is ERFINV else old_dec(op))
    else:
        raise ValueError(name)
    setattr(lowering, "find", find)
    setattr(op_jit, "_programs", {})  # programs jitted before the patch would keep the old lowering


SITECUSTOMIZE = """import sys
sys.path.insert(0, {here!r})
import diagnose_faults
diagnose_faults.apply({name!r})
"""
