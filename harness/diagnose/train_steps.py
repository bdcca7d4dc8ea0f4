"""Every step of a train row, replayed for `hf-tpu diagnose --phase train` (harness/diagnose/train.py).

The row's runs as the sweep makes them (harness/sweep/runner.run_train_phase: same N, data, optimizer, null
gradients frozen; train.run_steps with `trace`): the CPU baseline, the float64 reference run between its
step-1 backward and its optimizer step, and `tpu`. Then:
- the verdict is the sweep's (train.judge on the row's tensors, float32's spread included), so diagnose
  agrees with the row it explains;
- the first divergence: step by step, the loss (forward), each gradient in backward order (backward), each
  weight after the optimizer step (optimizer; less what Adam makes of the gradients' permitted rounding over
  k steps, train_weights, as the sweep judges the final ones), first tensor the numerics rule fails;
- an optimizer-step divergence is replayed on the optimizer alone (replay_optimizer): tpu's optimizer and
  CPU's, in float32 and float64, stepped through steps 1..k on CPU's recorded gradients from CPU's recorded
  weights, so that the only difference left between them is the optimizer's own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch

from harness.sweep import emulate, float64_ops, numerics, train_weights
from harness.sweep import train as T
from harness.sweep.train_spread import sample_seed
from hf_tpu.precision import cpu_reference


@dataclass
class Runs:
    """The row's runs: run_steps(trace=True) results ("tensors", "trace", "order", "frozen", ...)."""

    ref: dict
    tpu: dict | None = None
    fp64: dict | None = None  # the float64 run's result when valid (runner's rule)
    noisy_fp64: dict | None = None  # refused only for the baseline's own distance from it
    reference: str = ""  # "valid" | "none" | "invalid: ..." (the row's `reference` column)
    null: list[str] = field(default_factory=list)
    allow: dict = field(default_factory=dict)
    tpu_error: T.StepError | None = None


@dataclass
class Divergence:
    step: int
    stage: str  # forward | backward | optimizer
    tensor: str  # loss.stepK, grad.<param>, weight.<param> (after step K's optimizer step)
    reason: str
    metrics: dict
    later: list[str] = field(default_factory=list)  # the other tensors beyond the rule, "stepK tensor"


def cpu_runs(built: Any, entry: Any, steps: int, dtype: Any, seed: int, rebuild: Any, precision: str,
             tol: numerics.Tolerance) -> Runs:
    """The CPU baseline and float64 reference as runner.run_train_phase runs them. Raises T.StepError when the
    baseline fails."""
    got64: dict = {}
    null: list[str] = []

    def reference(step1: dict) -> list[str]:
        def nulls(step1_64: dict) -> list[str]:
            null[:] = T.null_gradients(step1, step1_64)
            return list(null)
        try:
            with cpu_reference(), float64_ops.kernels():
                got64.update(T.run_steps(built, entry, None, steps, torch.float64, seed, rebuild,
                                         exclude=tol.data_dependent, freeze=nulls, trace=True))
        except T.StepError:
            got64.clear()
            null.clear()  # no reference: nothing is known null, and the baseline steps every parameter
        return list(null)

    ref = T.run_steps(built, entry, None, steps, dtype, seed, rebuild,
                      context=lambda: emulate.matmul_precision(precision), exclude=tol.data_dependent,
                      freeze=reference, trace=True)
    runs = Runs(ref=ref, null=list(null))
    ref_t, fp64_t = T.without(ref["tensors"], null), T.without(got64.get("tensors"), null)
    if fp64_t is None:
        runs.reference = "none"
    else:  # runner.run_train_phase's rule for the train reference (REFERENCE_FACTOR, weights shrunk)
        ref_tol = replace(tol, reference=tol.reference * T.REFERENCE_FACTOR)
        base_w = train_weights.shrink(ref_t, fp64_t, train_weights.allowances(ref_t, fp64_t, tol, steps, T.LR))
        ok, why = numerics.reference_valid(base_w, fp64_t, ref_tol)
        runs.reference = "valid" if ok else f"invalid: {why}"
        if ok:
            runs.fp64 = got64
        elif "rmse(fp64, cpu)" in why:
            runs.noisy_fp64 = got64
    runs.allow = train_weights.allowances(ref_t, _tensors(runs.fp64, null), tol, steps, T.LR)
    return runs


def _tensors(got: dict | None, null: list[str]) -> dict | None:
    return T.without(got["tensors"], null) if got else None


def verdict(runs: Runs, built: Any, entry: Any, steps: int, dtype: Any, seed: int, rebuild: Any,
            precision: str, tol: numerics.Tolerance) -> tuple[numerics.Comparison, str]:
    """The sweep's verdict on the row (train.judge), with its nudged run when the rule fails."""
    def spread(i: int) -> dict | None:
        return T.nudged(built, entry, SimpleNamespace(train_steps=steps, seed=seed), dtype, rebuild,
                        lambda: emulate.matmul_precision(precision), tol.data_dependent, runs.null,
                        sample_seed(i))
    return T.judge(_tensors(runs.ref, runs.null), _tensors(runs.tpu, runs.null), _tensors(runs.fp64, runs.null),
                   tol, runs.allow, _tensors(runs.noisy_fp64, runs.null), spread, steps)


def first_divergence(runs: Runs, tol: numerics.Tolerance) -> Divergence | None:
    """The first tensor of the row (step by step: loss, gradients in backward order, weights after the
    optimizer step) that fails the numerics rule against the valid float64 reference (allclose without one)."""
    ref_tr, res_tr = runs.ref["trace"], runs.tpu["trace"]
    f64_tr = runs.fp64["trace"] if runs.fp64 else None
    names = walk_order(runs)
    ref_g1 = {f"grad.{n}": g for n, g in ref_tr[1]["grad"].items()}
    f64_g1 = {f"grad.{n}": g for n, g in f64_tr[1]["grad"].items()} if f64_tr else None
    first: Divergence | None = None
    for k in range(1, len(ref_tr)):
        fk = f64_tr[k] if f64_tr else None
        allow = train_weights.allowances(ref_g1 | _prefixed(ref_tr[k]["weight"], "weight."), f64_g1, tol, k, T.LR)
        checks = [("forward", "loss.step%d" % k, ref_tr[k]["loss"], res_tr[k]["loss"], fk["loss"] if fk else None)]
        checks += [("backward", f"grad.{n}", ref_tr[k]["grad"][n], res_tr[k]["grad"][n],
                    fk["grad"][n] if fk else None) for n in names]
        if k == 1:
            checks.insert(len(names) + 1, ("backward", "grad_norm.step1", runs.ref["tensors"]["grad_norm.step1"],
                                           runs.tpu["tensors"]["grad_norm.step1"],
                                           runs.fp64["tensors"]["grad_norm.step1"] if runs.fp64 else None))
        ws = {f"weight.{n}": (ref_tr[k]["weight"][n], res_tr[k]["weight"][n], fk["weight"][n] if fk else None)
              for n in names}
        # each float32 side's weight less Adam's amplification of its gradients' rounding (as the sweep)
        target = {w: (f if f is not None else r) for w, (r, _, f) in ws.items()}
        base = train_weights.shrink({w: r for w, (r, _, _) in ws.items()}, target, allow) if fk else \
            {w: r for w, (r, _, _) in ws.items()}
        judged = train_weights.shrink({w: t for w, (_, t, _) in ws.items()}, target, allow)
        checks += [("optimizer", w, base[w], judged[w], f) for w, (_, _, f) in ws.items()]
        for stage, name, r, t, f in checks:
            ok, m, why = numerics.compare_tensor(name, r, t, f, tol)
            if ok:
                continue
            if first is None:
                first = Divergence(k, stage, name, why, m)
            else:
                first.later.append(f"step {k} {name}")
    return first


def walk_order(runs: Runs) -> list[str]:
    """The parameters not null, in the order step 1's backward produced their gradients (nearest the loss
    first), then those backward gave no gradient."""
    skip = set(runs.null)
    return [n for n in dict.fromkeys(runs.ref["order"] + list(runs.ref["trace"][0]["weight"])) if n not in skip]


def _prefixed(d: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in d.items()}


def replay_optimizer(runs: Runs, k: int, device: str | None, dtype: Any) -> dict:
    """weight.<param> after step k of `device`'s optimizer (make_optimizer, as the row's) stepped through steps
    1..k on the CPU baseline's recorded gradients, each step from CPU's recorded weights: the optimizer alone,
    on CPU's inputs (its moments follow from the same gradients). The row's frozen parameters stay out."""
    tr = runs.ref["trace"]
    frozen = set(runs.ref["frozen"])
    names = [n for n in tr[0]["weight"] if n not in frozen]
    params = [torch.nn.Parameter(tr[0]["weight"][n].detach().clone().to(device or "cpu", dtype)) for n in names]
    opt, _ = T.make_optimizer(params, device)
    for j in range(1, k + 1):
        with torch.no_grad():
            for n, p in zip(names, params):
                p.copy_(tr[j - 1]["weight"][n].to(p.device, p.dtype))
                p.grad = tr[j]["grad"][n].to(p.device, p.dtype)
        opt.step()
    return {f"weight.{n}": p.detach().to("cpu", copy=True) for n, p in zip(names, params)}


def optimizer_verdict(runs: Runs, k: int, tol: numerics.Tolerance, dtype: Any) -> tuple[list[str], dict]:
    """(the weights whose step-k optimizer update on tpu fails the rule, replayed on CPU's inputs, in the walk's
    order; the first one's comparison). float64's optimizer on the same float32 inputs is the reference."""
    cpu = replay_optimizer(runs, k, None, dtype)
    tpu = replay_optimizer(runs, k, "tpu", dtype)
    f64 = replay_optimizer(runs, k, None, torch.float64)
    bad, first = [], {}
    for name in (f"weight.{n}" for n in walk_order(runs) if f"weight.{n}" in cpu):
        ok, m, why = numerics.compare_tensor(name, cpu[name], tpu[name], f64[name], tol)
        if not ok:
            bad.append(name)
            first = first or {"name": name, "reason": why, **m}
    return bad, first
