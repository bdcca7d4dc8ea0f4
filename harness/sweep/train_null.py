"""The train phase's null gradients (harness/sweep/train.py): parameters whose step-1 gradient is zero in exact
arithmetic, told by the float64 run. Their float32 gradients are rounding noise on CPU and tpu alike: they are
left out of the comparison and frozen in every run (train.py's module doc says why)."""

from __future__ import annotations

from harness.sweep import numerics, train_weights

# A float64 gradient this many times smaller than the float32 one is zero in exact arithmetic: float64's
# rounding noise is ~1e-9 of float32's, a real gradient agrees to ~1e-7.
NULL_GRADIENT = 1e-3
# A gradient whose float64 size is below float32's smallest normal number is zero on a TPU, which flushes
# subnormal products before summing them (XLA:CPU too), while CPU PyTorch sums them into values up to a few
# times this (DeepSeek-OCR2's SAM encoder: RMS 4e-39, elements up to 3.5e-38): null as well. AdamW's update
# from it is nothing (its size is far below eps); a gradient of normal size is never caught by this.
SUBNORMAL = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny


def null_gradients(ref: dict, fp64: dict | None) -> list[str]:
    """The parameters (model order) whose step-1 gradient is zero in exact arithmetic: the float64 run's
    gradient is below NULL_GRADIENT of the float32 baseline's (float32 noise, nothing to compare), or zero
    in float32 on a TPU: its float64 size is below float32's smallest normal number (SUBNORMAL)."""
    if not fp64:
        return []
    out = []
    for name, g in ref.items():
        f = fp64.get(name)
        if not name.startswith("grad.") or f is None or tuple(f.shape) != tuple(g.shape):
            continue
        rms32, rms64 = numerics.tensor_scale(g), numerics.tensor_scale(f)
        if (rms32 > 0 and rms64 <= NULL_GRADIENT * rms32) or rms64 < SUBNORMAL:
            out.append(name[len("grad."):])
    return out


def without(tensors: dict | None, params: list[str]) -> dict | None:
    """`tensors` without the gradient and final weight of `params`."""
    if tensors is None or not params:
        return tensors
    drop = {f"{k}.{p}" for p in params for k in ("grad", "weight")}
    return {k: v for k, v in tensors.items() if k not in drop}


def null_note(params: list[str]) -> str:
    if not params:
        return ""
    shown = train_weights.first_names(params)
    return (f"not compared: {len(params)} parameter(s) with a zero gradient in exact arithmetic or below float32's "
            f"normal range ({shown})")
