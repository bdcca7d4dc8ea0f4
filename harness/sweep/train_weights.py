"""The train phase's weights after the last AdamW step: what float32 rounding of the gradients can do to them.

Adam normalises each element's gradient by its own running RMS, so its update is about lr * sign(g) whatever
|g| is. Where a gradient element is within rounding noise of zero, the sign of float32's gradient is noise, and
so is the direction of the update: two correct float32 runs (CPU and tpu, or CPU and float64) can move that
element by lr apart per step. Elsewhere the update depends on the gradient through ratios of its values
across steps, and a relative gradient error e moves it by at most about lr * e per step. Judged against the
weight's own scale, that matters only where the weight is no bigger than its updates: a bias initialised at
zero, which after N steps is nothing but N updates (a Diffusers UNet's norm biases: 5 false fail_accuracy
rows of the full zoo's train run, and float64 references refused for it).

The rule, per element i of a parameter with step-1 gradient g (float64's where valid, else the baseline's)
and the largest gradient RMSE error the numerics rule lets tpu have on it, b = multiplier * rmse(fp64, cpu) +
floor * scale (without a valid reference: tol * scale, allclose's):

    allowance_i = N * lr * min(2, ADAM_NOISE_FACTOR * b / |g_i|)

is the part of a weight's distance from its reference that the gradient's permitted rounding can explain
through Adam's normalisation. Each side's final weight is moved towards the reference by at most that much
(`shrink`) before the ordinary rule judges it (numerics.compare_tensor): the float32 baseline's when deciding
whether the float64 reference is valid, tpu's when comparing. The allowance depends only on CPU and float64
gradients, never on tpu's, and tpu's step-1 gradients are compared as before, so a wrong backward still
fails on its gradient; a wrong optimizer (another lr, betas, eps, bias correction, a sign) moves the elements
whose gradient is well determined by far more than their allowance (lr * 4 b / |g|, ~1e-5 lr for a typical
element) and still fails on the weight.
"""

from __future__ import annotations

import math

from harness.sweep import numerics

# Per-element gradient errors exceed the tensor's RMSE error in the tails: the allowance takes this many RMSEs.
ADAM_NOISE_FACTOR = 4.0
# Per step, two correct runs whose update directions differ move an element at most about 2 lr apart.
MAX_STEP_SPREAD = 2.0


def allowances(ref: dict, fp64: dict | None, tol: numerics.Tolerance, steps: int, lr: float) -> dict:
    """weight.<param> -> elementwise allowance (float64 CPU tensor), for each param whose step-1 gradient is in
    `ref` (the baseline's tensors); `fp64` the float64 run's tensors or None (no valid reference)."""
    import torch

    out = {}
    for name, g in ref.items():
        if not name.startswith("grad.") or f"weight.{name[5:]}" not in ref:
            continue
        f = (fp64 or {}).get(name)
        g = g.detach().double()
        if f is not None and tuple(f.shape) == tuple(g.shape):
            truth = f.detach().double()
            noise = numerics.error_bound(tol, g, truth)  # the rule's bound on tpu's gradient error
        else:
            truth = g
            noise = tol.tol * numerics.tensor_scale(g)
        ratio = torch.where(truth != 0, ADAM_NOISE_FACTOR * noise / truth.abs().clamp_min(1e-300),
                            torch.full_like(truth, math.inf))
        out[f"weight.{name[5:]}"] = steps * lr * ratio.clamp(max=MAX_STEP_SPREAD).nan_to_num(MAX_STEP_SPREAD)
    return out


def shrink(tensors: dict, target: dict, allow: dict) -> dict:
    """`tensors` with each weight in `allow` moved elementwise towards `target`'s by at most its allowance
    (never past it); other tensors as they are. Non-finite values stay as they are."""
    import torch

    out = dict(tensors)
    for name, a in allow.items():
        w, t = tensors.get(name), target.get(name)
        if w is None or t is None or tuple(w.shape) != tuple(t.shape) or tuple(a.shape) != tuple(w.shape):
            continue
        d = w.double() - t.double()
        moved = t.double() + d.sign() * (d.abs() - a).clamp_min(0.0)
        out[name] = torch.where(torch.isfinite(d), moved, w.double()).to(w.dtype)
    return out


def rescued(ref: dict, res: dict, fp64: dict | None, tol: numerics.Tolerance, allow: dict) -> list[str]:
    """The parameters whose final weight passes only with its allowance (for the row's message)."""
    out = []
    for name in allow:
        if name in ref and name in res:
            ok, _, _ = numerics.compare_tensor(name, ref[name], res[name], (fp64 or {}).get(name), tol)
            if not ok:
                out.append(name[len("weight."):])
    return out


def first_names(params: list[str], shown: int = 3) -> str:
    """The first `shown` names, and how many more: a row's note names a few parameters, not thousands."""
    more = len(params) - shown
    return ", ".join(params[:shown]) + (f", ... (+{more})" if more > 0 else "")


def rescued_note(params: list[str]) -> str:
    if not params:
        return ""
    shown = first_names(params)
    return (f"{len(params)} final weight(s) within AdamW's amplification of the gradients' rounding "
            f"({shown})")
