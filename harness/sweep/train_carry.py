"""The transition check: a train row whose free-running comparison fails, judged step by step from tpu's own state.

Adam normalises each gradient element by its own running RMS, so a rounding-size difference in a gradient
element near zero becomes an lr-size difference in its weight, and the next steps' losses and gradients
follow those weights (conv nets with batch norm: PPLCNet, PP-OCRv5's mobile models, MobileViT, RT-DETR; `hf-tpu
diagnose` there: "from CPU's weights at the start of step 2, tpu's step 2 alone agrees with CPU's"). Two
correct float32 runs then part after step 1 by more than the rule's factor x CPU's distance from float64, and
float32 does not determine where either lands (the nudged spread samples, train_spread.py, cover only a
part of it).

So a row the rule fails is judged again per step (`check`): for k = 1..N, from tpu's own state after step k-1
(weights, AdamW's state and the buffers: batch norm's running statistics), moved to CPU:
- the forward and backward: CPU float32 runs step k alone from that state, and a float64 reference from the same
  start; tpu's loss, gradients and buffers after step k are judged against it by the numerics rule;
- the optimizer: CPU's AdamW (the row's CPU optimizer) steps that state's weights and AdamW state with tpu's own
  step-k gradients, in float32 and in float64 (the reference); tpu's weights and AdamW state after step k are
  judged against it. On the same gradients Adam's normalisation has nothing to amplify, so this judges its
  arithmetic alone (the gradients were judged just before); counters (step counts, integer buffers) exactly.
Step 1 starts from the initial weights, so tpu's state after step 1 is judged against CPU's own. Starting each
later step from tpu's state, not CPU's, keeps a bug in the state carried across steps visible: an optimizer
that does not write exp_avg back, a buffer not updated in place, a step count not incremented, each leaves
tpu's state after step k other than what CPU makes of tpu's state after k-1. Only the accumulation of rounding
over the steps is not judged, which is what float32 does not determine. The row passes only when every step
agrees; otherwise it fails naming the first failing step and tensor. docs/numerics.md argues why such a pass
counts as judged.

The steps are run by the caller (train.py owns run_steps): this module holds the states' capture and loading
and the per-step judgement, below train.py in the import graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.sweep import numerics

# What a run records of its state after each step (run_steps(states=True)): the trace entry's keys besides
# "loss", "grad" and "weight".
BUFFER, OPTIM = "buffer", "optim"


def snapshot(model: Any, params: Sequence[tuple[str, Any]], opt: Any) -> dict:
    """The state besides the weights, CPU copies: every buffer by name, and the optimizer's per-parameter state
    by parameter name (tensors copied; a copy, since a CPU tensor's detach() is the storage the next step
    writes)."""
    import torch

    buffers = {n: b.detach().to("cpu", copy=True) for n, b in model.named_buffers()}
    optim: dict = {}
    if opt is not None:
        for name, p in params:
            st = opt.state.get(p)
            if st:
                optim[name] = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                               for k, v in st.items()}
    return {BUFFER: buffers, OPTIM: optim}


def load_model(model: Any, params: Sequence[tuple[str, Any]], state: dict) -> None:
    """Copy a recorded state's weights ("weight") and buffers into `model` (on its device and dtype)."""
    import torch

    with torch.no_grad():
        for name, p in params:
            p.copy_(state["weight"][name].to(p.device, p.dtype))
        for name, b in model.named_buffers():
            if name in state.get(BUFFER, {}):
                b.copy_(state[BUFFER][name].to(b.device))


def load_optimizer(opt: Any, params: Sequence[tuple[str, Any]], state: dict) -> None:
    """Set `opt`'s per-parameter state to a recorded one, on each parameter's device, floating tensors in its
    dtype; "step" stays a float32 CPU tensor, as PyTorch's for-loop AdamW keeps it (the row's CPU optimizer).
    By hand, not opt.load_state_dict: that would also copy the recorded optimizer's settings (fused=True of
    tpu's) into the CPU one."""
    import torch

    recorded = state.get(OPTIM, {})
    for name, p in params:
        if name not in recorded:
            continue
        opt.state[p] = {k: (v.clone() if k == "step" else
                            v.to(p.device, p.dtype if v.is_floating_point() else v.dtype, copy=True))
                        if isinstance(v, torch.Tensor) else v for k, v in recorded[name].items()}


def step_tensors(entry: dict, k: int, skip: Sequence[str] = ()) -> dict:
    """The named tensors of one step's trace entry (run_steps(trace=True, states=True)): loss.stepK, grad.<p>,
    and the state after it: weight.<p>, <state key>.<p> (exp_avg, exp_avg_sq, step), buffer.<b>. `skip`: the
    frozen (null) parameters, whose gradients are noise and which have no state."""
    import torch

    out = {f"loss.step{k}": entry["loss"]} if "loss" in entry else {}
    out.update({f"grad.{n}": g for n, g in entry.get("grad", {}).items() if n not in skip})
    out.update({f"weight.{n}": w for n, w in entry["weight"].items() if n not in skip})
    for n, st in entry.get(OPTIM, {}).items():
        out.update({f"{key}.{n}": v for key, v in st.items() if isinstance(v, torch.Tensor)})
    out.update({f"{BUFFER}.{n}": b for n, b in entry.get(BUFFER, {}).items()})
    return out


def replay_optimizer(optimizer: Callable[[list], Any], start: dict, grads: dict, skip: Sequence[str],
                     dtype: Any) -> dict:
    """One optimizer step on CPU (`optimizer(params)`: the row's CPU AdamW) from a recorded state's weights and
    AdamW state with the gradients `grads`, in `dtype`: {"weight", "optim"} after it, as a trace entry."""
    import torch

    names = [n for n in start["weight"] if n not in skip]
    params = [(n, torch.nn.Parameter(start["weight"][n].detach().to("cpu", dtype, copy=True))) for n in names]
    opt = optimizer([p for _, p in params])
    load_optimizer(opt, params, start)
    for n, p in params:
        p.grad = None if grads[n] is None else grads[n].detach().to("cpu", dtype, copy=True)
    opt.step()
    return {"weight": {n: p.detach() for n, p in params}, OPTIM: snapshot(torch.nn.Module(), params, opt)[OPTIM]}


def _counts(tensors: dict) -> list[str]:
    """Names of counters (integer buffers, optimizer step counts), which must agree exactly."""
    return [n for n, t in tensors.items() if not t.is_floating_point() or n.startswith("step.")]


@dataclass
class StepVerdict:
    ok: bool
    judged_by: str  # "rule" (a valid float64 reference) | "allclose" | "rounding-dominated" | "exact"
    tensor: str = ""  # the first failing tensor (loss, gradients, buffers; then weights and AdamW's state)
    reason: str = ""


def judge_tensors(cpu: dict, tpu: dict, f64: dict | None, tol: numerics.Tolerance,
                  reference_factor: float) -> StepVerdict:
    """tpu's tensors against CPU's from the same inputs by the row's rule: counters exactly; the float64 run as
    the reference where valid under the train phase's bound (reference_factor); refused only for CPU's own
    distance from it, tpu within numerics.rounding_dominated of it agrees uninformatively; else allclose."""
    import torch

    counts = _counts(cpu)
    for n in counts:
        if n not in tpu or not torch.equal(cpu[n], tpu[n].to(cpu[n].dtype)):
            return StepVerdict(False, "exact", n, f"{n}: tpu {tpu.get(n)!r} != CPU {cpu[n]!r}")
    cpu = {n: t for n, t in cpu.items() if n not in counts}
    tpu = {n: t for n, t in tpu.items() if n in cpu}
    f64 = {n: t for n, t in f64.items() if n in cpu} if f64 else None
    valid, why = (numerics.reference_valid(cpu, f64, replace(tol, reference=tol.reference * reference_factor))
                  if f64 else (False, ""))
    ref = f64 if valid else None
    by = "rule" if valid else "allclose"
    cmp = numerics.compare_outputs(cpu, tpu, ref, tol)
    if cmp.match:
        return StepVerdict(True, by)
    if f64 and "rmse(fp64, cpu)" in why and numerics.rounding_dominated(cpu, tpu, f64, tol):
        return StepVerdict(True, "rounding-dominated")  # as the row's refused reference (train.judge)
    for n in cpu:  # the first failing tensor in the step's order
        ok, _, reason = numerics.compare_tensor(n, cpu[n], tpu[n], (ref or {}).get(n), tol)
        if not ok:
            return StepVerdict(False, by, n, reason)
    return StepVerdict(False, by, "", cmp.reason)


def _forward(entry: dict, k: int, skip: Sequence[str]) -> dict:
    """A step's forward and backward tensors: its loss, gradients and buffers (not the optimizer's state)."""
    return step_tensors({"loss": entry["loss"], "grad": entry["grad"], "weight": {}, BUFFER: entry.get(BUFFER, {})},
                        k, skip)


@dataclass
class Carried:
    """The transition check's outcome: `ok` every step agrees; else `step` and `tensor` name the first failing."""

    ok: bool
    note: str
    uninformative: bool = False
    step: int = 0
    tensor: str = ""


def check(tpu_trace: list[dict], cpu_step: Callable[[dict, bool], dict | None], optimizer: Callable[[list], Any],
          tol: numerics.Tolerance, reference_factor: float, skip: Sequence[str] = ()) -> Carried:
    """Judge tpu's steps one by one (module doc). `tpu_trace`: tpu's run_steps(trace=True, states=True) trace
    (index 0 the initial state, k step k's record with the state after it); `cpu_step(state, float64)`: CPU's
    trace entry of one step from `state` in float32 or float64 (None when float64 raises); `optimizer`: the
    row's CPU optimizer over a parameter list. Each step k, from tpu's state after k-1:
    - the forward and backward (loss, gradients, and the buffers the forward updates) against CPU's step;
    - the optimizer (weights and AdamW's state after the step) against CPU's optimizer stepped on tpu's own
      gradients of that step, float64's on the same inputs the reference: the optimizer's arithmetic alone,
      so that Adam's amplification of the gradients' rounding (judged just before) does not enter it.
    Stops at the first step that fails."""
    import torch

    how: set[str] = set()
    for k in range(1, len(tpu_trace)):
        start, got = tpu_trace[k - 1], tpu_trace[k]
        cpu, cpu64 = cpu_step(start, False), cpu_step(start, True)
        verdicts = [("forward and backward", judge_tensors(
            _forward(cpu, k, skip), _forward(got, k, skip), _forward(cpu64, k, skip) if cpu64 is not None else None,
            tol, reference_factor))]
        # a parameter backward gave no gradient is not stepped (eager leaves .grad None), as on tpu
        grads = {n: None if n in got.get("nograd", ()) else g for n, g in got["grad"].items() if n not in skip}
        state = {"weight": got["weight"], OPTIM: got.get(OPTIM, {})}
        verdicts.append(("optimizer step on tpu's gradients", judge_tensors(
            step_tensors(replay_optimizer(optimizer, start, grads, skip, None), k, skip),
            step_tensors(state, k, skip),
            step_tensors(replay_optimizer(optimizer, start, grads, skip, torch.float64), k, skip),
            tol, reference_factor)))
        for what, v in verdicts:
            if not v.ok:
                origin = "the initial weights" if k == 1 else f"tpu's own state after step {k - 1}"
                return Carried(False, f"transition check: step {k} from {origin} fails ({what}) on "
                                      f"{v.tensor or '?'}: {v.reason}", step=k, tensor=v.tensor)
            how.add(v.judged_by)
    steps = len(tpu_trace) - 1
    return Carried(True, (f"carried: steps 2..{steps} each agree from tpu's own state, step 1 from the initial "
                          f"weights (loss, gradients, buffers; AdamW's update on tpu's gradients; judged by "
                          f"{', '.join(sorted(how))}): the free-running divergence is the steps' rounding as "
                          "AdamW carries it"), uninformative="rounding-dominated" in how)


def step1_fails(ref: dict, res: dict, fp64: dict | None, tol: numerics.Tolerance) -> bool:
    """Step 1's loss and gradients fail the rule against a valid reference: the transition check would fail at
    step 1 too, and the row is not worth its runs (without a valid reference the check's own step-1 reference
    may be valid where the row's, refused for a later step's tensor, is not)."""
    if fp64 is None:
        return False
    names = [n for n in ref if n.startswith(("loss.step1", "grad_norm.step1", "grad.")) and n in res and n in fp64]
    return not numerics.compare_outputs({n: ref[n] for n in names}, {n: res[n] for n in names},
                                        {n: fp64[n] for n in names}, tol).match


def cpu_stepper(run_steps: Callable[..., dict], step_error: type[Exception], built: Any, entry: Any, seed: int,
                precision: str, dtype: Any, rebuild: Callable | None, tol: numerics.Tolerance,
                null: Sequence[str]) -> Callable[[dict, bool], dict | None]:
    """`check`'s cpu_step: one step on CPU from a recorded state, as the row's baseline runs (its matmul
    precision, the null parameters frozen) or as its float64 reference (None when that raises: allclose
    judges the step). `run_steps` and its `step_error` are train.py's, passed down: this module sits below it."""
    import torch

    from harness.sweep import emulate, float64_ops
    from hf_tpu.precision import cpu_reference

    kw = {"exclude": tol.data_dependent, "freeze": list(null), "trace": True, "states": True}

    def cpu_step(state: dict, wide: bool) -> dict | None:
        if not wide:
            return run_steps(built, entry, None, 1, dtype, seed, rebuild, start=state,
                             context=lambda: emulate.matmul_precision(precision), **kw)["trace"][1]
        try:
            with cpu_reference(), float64_ops.kernels():
                return run_steps(built, entry, None, 1, torch.float64, seed, rebuild, start=state, **kw)["trace"][1]
        except step_error:
            return None
    return cpu_step


def check_row(run_steps: Callable[..., dict], step_error: type[Exception], built: Any, entry: Any, opts: Any,
              device: str, backend: Any, context: Callable | None, dtype: Any, rebuild: Callable | None,
              tol: numerics.Tolerance, null: Sequence[str], got: dict, optimizer: Callable[[list], Any],
              reference_factor: float) -> Carried:
    """The transition check of a train row the rule fails (train.run_train's arguments). tpu's steps run again
    recording their state (`got` is the row's run: the rerun must reproduce its tensors bit for bit, or it
    vouches for nothing), then each step k on CPU, in float32 and float64, from tpu's state after step k-1."""
    import torch

    if backend is not None:
        torch._dynamo.reset()  # as the row's run started
    try:
        again = run_steps(built, entry, device, getattr(opts, "train_steps", 3), dtype, opts.seed, rebuild, backend,
                          context, exclude=tol.data_dependent, freeze=list(null), trace=True, states=True)
    except step_error as err:
        return Carried(False, f"transition check: tpu's run raised at {err.stage} when run again")
    differs = [n for n, t in got["tensors"].items() if not torch.equal(t, again["tensors"].get(n, t.new_empty(0)))]
    if differs:
        return Carried(False, f"transition check: tpu's run is not reproducible ({len(differs)} "
                              f"tensor(s) differ when run again, first {differs[0]}): nothing to judge")
    cpu_step = cpu_stepper(run_steps, step_error, built, entry, opts.seed, opts.precision, dtype, rebuild, tol, null)
    try:
        return check(again["trace"], cpu_step, optimizer, tol, reference_factor, null)
    except step_error as err:
        return Carried(False, f"transition check: CPU's step raised at {err.stage}: {err}")
