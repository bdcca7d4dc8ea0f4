"""Whether a tensor can carry information at all: what the sweep's verdicts (sweep/informative.py) and the
zoo's batch-norm calibration (zoo/norm_calibration.py) both ask of outputs."""

from __future__ import annotations

import torch


def tensor_problem(t: torch.Tensor) -> str:
    """'' when `t` can carry information, else why not: zeros, constant, not finite."""
    if t.numel() == 0:
        return ""
    x = t.detach()
    if not bool(torch.isfinite(x).all()):
        return "not finite"
    if not bool(x.any()):
        return "all zeros"
    flat = x.flatten()
    if t.numel() > 1 and bool((flat == flat[0]).all()):
        return "constant"
    return ""
