"""`hf-tpu diagnose ENTRY --phase train`: where a train row (harness/sweep/train.py) first goes wrong on `tpu`.

Every step of the row is replayed as the sweep runs it (same N, data, optimizer; train_steps.py) on CPU, in
float64 and on `tpu`; the verdict is the sweep's own, and the first tensor beyond the numerics rule, step by
step (the loss, the gradients in backward order, the weights after the optimizer step), says where it starts.
A row the rule fails is judged step by step from tpu's own state, as the sweep judges it (the transition
check, harness/sweep/train_carry.py): when every step agrees it passes and says so; otherwise:
- step K's optimizer update: the optimizer alone is replayed through step K on CPU's gradients and weights
  (train_steps.optimizer_verdict): tpu's update is wrong, or it agrees and the divergence is the gradients'
  rounding as Adam amplifies it.
- step K's forward or backward: that step alone, from CPU's weights at its start, on CPU, in float64 and on
  `tpu`; the parameter whose gradient goes wrong first, in the order the backward pass produces gradients
  (post-accumulate-grad hooks on the CPU run): the one nearest the loss, where the wrong op sits or which it
  feeds first. Then the op:
  - eager: the CPU step runs under a TorchDispatchMode that records every ATen op with its inputs, the
    backward's ops after a marker. Each op is replayed on `tpu` with the same inputs (ops.replay), backward
    first when the loss agrees (the forward is right), from the start otherwise; the first op whose result
    differs is named with its stage.
  - compiled: the forward and backward graphs AOTAutograd hands the `tpu` backend are walked node by node,
    PyTorch's CPU kernel against hf_tpu's lowering on the recorded inputs (compiled.locate_in_graphs).
  If that step alone agrees, the divergence is carried over from the earlier steps' rounding.
- fail_to_run / compile_fail: the step and stage (forward, backward or optimizer) and the ATen op that raised,
  as for inference.
Gradients that are zero in exact arithmetic are left out and frozen as the sweep does (train.null_gradients).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from harness.diagnose import compiled as C
from harness.diagnose import repro as R
from harness.diagnose import train_steps as S
from harness.diagnose.core import _finish, _launch_blocking, _set_precision
from harness.diagnose.diagnosis import Diagnosis, diff_dicts, first_line
from harness.diagnose.ops import FailureProbe, OpCall, RecordOps, clone_cpu, describe, replay, spec_text
from harness.entry_calls import compile_call, failure_status, prepare_inputs, prepare_model
from harness.sweep import draws, emulate, float64_ops, numerics, train_carry
from harness.sweep.device import backend_phase
from harness.sweep import train as T

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class _Step:
    """One forward + backward of the sweep's step 1: the loss, the gradients in the order backward produced
    them, and where the backward started (an index into a recorder's calls, or into the compiled graphs)."""

    def __init__(self) -> None:
        self.loss: torch.Tensor | None = None
        self.grads: dict[str, torch.Tensor] = {}
        self.order: list[str] = []
        self.backward_at = 0
        self.stage = ""
        self.error: BaseException | None = None


def _train_step(built: Any, entry: Any, device: str | None, dtype: Any, seed: int, rebuild: Callable | None,
                backend: Any = None, recorder: Any = None, mark: Callable[[], int] | None = None,
                exclude: tuple[str, ...] = (), weights: dict | None = None) -> _Step:
    """Step 1 as harness/sweep/train.py runs it (eval mode, its loss, its inputs), without the optimizer; from
    `weights` (by parameter name: CPU's at the start of a later step) where given."""
    s = _Step()
    model = prepare_model(built.model, device, dtype, rebuild)
    model.eval()  # dropout off, as in the sweep
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.is_floating_point()]
    if weights:
        with torch.no_grad():
            for name, p in params:
                p.copy_(weights[name].to(p.device, p.dtype))
    for name, p in params:
        p.register_post_accumulate_grad_hook(lambda _p, _n=name: s.order.append(_n))
    fn = built.call if backend is None else compile_call(built.call, model, backend)
    s.stage = "step 1 forward"
    try:
        with torch.enable_grad(), draws.shared_draws(seed), recorder or contextlib.nullcontext():
            torch.manual_seed(seed)
            inputs = T.train_inputs(entry, model, prepare_inputs(built.inputs, device, dtype))
            loss = T.scalar_loss(fn(model, inputs), exclude)
            s.loss = loss.detach().to("cpu").double()
            s.stage = "step 1 backward"
            s.backward_at = mark() if mark else 0
            loss.backward()
    except Exception as exc:  # noqa: BLE001
        s.error = exc
        return s
    # no gradient is a zero one (compiled mode materialises the zeros), as the sweep compares them
    s.grads = {n: p.grad.detach().to("cpu") if p.grad is not None else torch.zeros_like(p, device="cpu")
               for n, p in params}
    return s


def _compare_grads(ref: _Step, res: _Step, fp64: _Step | None, tol: numerics.Tolerance,
                   skip: list[str]) -> tuple[list[str], dict]:
    """(parameters whose gradient fails the numerics rule, in backward order; the first one's metrics)."""
    bad, first = [], {}
    # the parameters backward gave no gradient (zeros) last: they are furthest from the loss
    for name in ref.order + [n for n in ref.grads if n not in ref.order]:
        if name in skip or name not in ref.grads or name not in res.grads:
            continue
        f64 = fp64.grads.get(name) if fp64 is not None else None
        ok, m, reason = numerics.compare_tensor(f"grad.{name}", ref.grads[name], res.grads[name], f64, tol)
        if not ok:
            bad.append(name)
            first = first or {"name": f"grad.{name}", "match": False, "reason": reason,
                              "max_abs_err": m.get("max_abs_err"), "max_rel_err": m.get("max_rel_err"),
                              "cosine": m.get("cosine")}
    return bad, first


def _first_differing_op(calls: list[OpCall], start: int, stop: int, tol: numerics.Tolerance) -> tuple[int, Any]:
    """(index, replay result) of the first recorded op in [start, stop) whose tpu replay differs or raises."""
    for i in range(start, min(stop, len(calls))):
        r = replay(calls[i], "tpu", tol)
        if not r.skipped and not r.match:
            return i, r
    return -1, None


def diagnose_train_built(built: Any, entry: Any, mode: str = "eager", *, out_dir: str | Path | None = None,
                         precision: str = "highest", dtype: str = "float32", seed: int = 0,
                         overrides: numerics.Overrides | None = None, rebuild: Callable | None = None,
                         steps: int = 3) -> Diagnosis:
    """Diagnose the train row of one built entry (a zoo BuiltEntry or anything with model, inputs, call; `entry`
    gives the id and task): its `steps` steps replayed (train_steps.py), the first diverging one located."""
    start = time.perf_counter()
    tol = numerics.tolerance_for(entry.id, precision, dtype, overrides)
    d = Diagnosis(entry.id, mode, "pass", precision=precision, dtype=dtype, tol=tol.tol, phase="train")
    out = Path(out_dir) if out_dir else None
    why = T.not_trainable(built.model)
    if why:
        d.status, d.summary = "not_available", why
        return _finish(d, start, out)
    tdtype = DTYPES[dtype] if dtype != "float32" else None
    try:
        runs = S.cpu_runs(built, entry, steps, tdtype, seed, rebuild, precision, tol)
    except T.StepError as err:
        d.status, d.error_type, d.error_message = "baseline_fail", type(err.exc).__name__, first_line(err.exc)
        d.summary = f"{err.stage} fails on CPU: {d.error_type}: {d.error_message}"
        return _finish(d, start, out)
    if runs.reference != "valid":
        d.notes.append(f"float64 reference {runs.reference}: allclose alone judges")
    if runs.null:
        d.notes.append(T.null_note(runs.null))

    _set_precision(precision)
    if mode == "compiled":
        torch._dynamo.reset()
    try:
        with backend_phase():  # the row's tpu run, as the sweep makes it (a fused row is diagnosed as eager)
            runs.tpu = T.run_steps(built, entry, "tpu", steps, tdtype, seed, rebuild,
                                   "tpu" if mode == "compiled" else None, exclude=tol.data_dependent,
                                   freeze=runs.null, trace=True, states=True)
    except T.StepError as err:
        _raised(d, err, runs, built, entry, mode, tdtype, seed, rebuild, precision, tol, out)
        return _finish(d, start, out)

    cmp, uninformative = S.verdict(runs, built, entry, steps, tdtype, seed, rebuild, precision, tol)
    first = S.first_divergence(runs, tol)
    carried = None
    if not (cmp.match or uninformative) and not train_carry.step1_fails(
            *(S._tensors(r, runs.null) for r in (runs.ref, runs.tpu, runs.fp64)), tol):
        # the sweep's transition check, on the steps just run (harness/sweep/train_carry.py)
        carried = train_carry.check(runs.tpu["trace"], train_carry.cpu_stepper(
            T.run_steps, T.StepError, built, entry, seed, precision, tdtype, rebuild, tol, runs.null),
            T.cpu_optimizer, tol, T.REFERENCE_FACTOR, runs.null)
        d.notes.append(carried.note)
        if carried.ok:
            d.summary = carried.note + (f"; free-running, step {first.step} {first.tensor} diverges first "
                                        f"({first.reason})" if first else "")
            return _finish(d, start, out)
    if uninformative or (cmp.match and first is None):
        d.summary = uninformative or (f"the losses, gradients and weights of all {steps} steps agree with CPU")
        if uninformative:  # the row's tensors are judged against float32's spread, as the sweep judges them
            d.notes.append("an uninformative pass, as the sweep judges the row"
                           + (f"; beyond the rule alone: step {first.step} {first.tensor} ({first.reason})"
                              if first else ""))
        return _finish(d, start, out)
    d.status = "fail_accuracy"
    if first is None:  # the walk holds every tensor the row compares: not expected
        d.summary = f"the row fails the rule ({cmp.reason}); no step's tensor does on its own"
        return _finish(d, start, out)
    if cmp.match:  # Adam's normalisation can hide a wrong gradient of a later step from the row's own tensors
        d.notes.append("the row's own tensors (every loss, step 1's gradients, the final weights) pass the sweep's "
                       "rule: only a tensor the sweep does not compare diverges")
    k = d.located_step = first.step
    d.located_tensor = first.tensor
    param = first.tensor.partition(".")[2] if first.tensor.startswith(("grad.", "weight.")) else ""
    if param:
        d.located_parameter, d.located_module = param, param.rpartition(".")[0]
        d.module_class = _class_of(built.model, d.located_module)
    d.output_diffs = [{"name": f"step {k} {first.tensor}", "match": False, "reason": first.reason,
                       **{x: first.metrics.get(x) for x in ("max_abs_err", "max_rel_err", "cosine")}}]
    if first.later:
        d.notes.append(f"{len(first.later)} more tensor(s) beyond the rule: " + ", ".join(first.later[:6])
                       + (" ..." if len(first.later) > 6 else ""))
    what = f"step {k} {first.stage}: {first.tensor} diverges first ({first.reason})"
    d.notes.append(f"first diverging stage: step {k} {first.stage}")  # "stage: ..." is the located op's
    if first.stage == "optimizer":
        _optimizer_divergence(d, runs, k, tol, tdtype, what)
    else:
        _locate_step(d, built, entry, mode, k, runs, tdtype, seed, rebuild, precision, tol, out, what)
    return _finish(d, start, out)


def _optimizer_divergence(d: Diagnosis, runs: S.Runs, k: int, tol: numerics.Tolerance, dtype: Any,
                          what: str) -> None:
    """Step k's weights diverge while its loss and gradients agree: the optimizer step alone, on CPU's inputs."""
    label = runs.tpu["optimizer"]
    bad, first = S.optimizer_verdict(runs, k, tol, dtype)
    if bad:
        d.located_parameter = bad[0].partition(".")[2]
        d.located_module = d.located_parameter.rpartition(".")[0]
        d.located_tensor = bad[0]
        d.summary = (f"{what}; the optimizer step alone ({label}), replayed through step {k} on CPU's gradients "
                     f"and weights, differs from CPU's on {len(bad)} weight(s), first {bad[0]} ({first['reason']}): "
                     "tpu's optimizer update is wrong")
    else:
        d.summary = (f"{what}; the optimizer step alone ({label}), replayed through step {k} on CPU's gradients "
                     "and weights, agrees with CPU's: the divergence is the gradients' rounding as Adam amplifies "
                     "it over the steps, not the optimizer's arithmetic")


def _locate_step(d: Diagnosis, built: Any, entry: Any, mode: str, k: int, runs: S.Runs, tdtype: Any, seed: int,
                 rebuild: Callable | None, precision: str, tol: numerics.Tolerance, out: Path | None,
                 what: str) -> None:
    """Step k's forward or backward diverges: that step alone, from CPU's weights at its start, on CPU (ops
    recorded), in float64 and on tpu; the first diverging gradient (backward order) and the op."""
    weights = runs.ref["trace"][k - 1]["weight"]
    rec = RecordOps(keep=mode == "eager")  # the compiled walk needs no CPU recording
    with emulate.matmul_precision(precision):  # the sweep's oracle: IEEE float32 with tpu's matmul rounding
        ref = _train_step(built, entry, None, tdtype, seed, rebuild, recorder=rec, mark=lambda: len(rec.calls),
                          exclude=tol.data_dependent, weights=weights)
    with emulate.cpu_reference(), float64_ops.kernels():
        f64 = _train_step(built, entry, None, torch.float64, seed, rebuild, exclude=tol.data_dependent,
                          weights=weights)
    fp64 = _valid_reference(ref, f64, tol, Diagnosis(d.entry_id, d.mode, ""))
    graphs: list[C.Graph] = []
    with _launch_blocking():
        if mode == "compiled":
            torch._dynamo.reset()
            with C.watch() as graphs:
                res = _train_step(built, entry, "tpu", tdtype, seed, rebuild, backend="tpu",
                                  mark=lambda: len(graphs), exclude=tol.data_dependent, weights=weights)
        else:
            res = _train_step(built, entry, "tpu", tdtype, seed, rebuild, exclude=tol.data_dependent,
                              weights=weights)
    loss_ok, bad = True, []
    if res.error is None:
        loss_ok, _, _ = numerics.compare_tensor(f"loss.step{k}", ref.loss, res.loss,
                                                fp64.loss if fp64 is not None else None, tol)
        bad, _ = _compare_grads(ref, res, fp64, tol, runs.null)
    if res.error is not None or (loss_ok and not bad):
        d.summary = (f"{what}; from CPU's weights at the start of step {k}, tpu's step {k} alone agrees with "
                     f"CPU's (loss and gradients): the divergence is carried over from the earlier steps' rounding, "
                     "no op of this step makes it")
        return
    if bad:
        d.located_parameter = bad[0]
        d.located_module = bad[0].rpartition(".")[0]
        d.module_class = _class_of(built.model, d.located_module)
        d.notes.append(f"step {k} alone: {len(bad)} of {len(ref.order)} gradients diverge; in backward order: "
                       + ", ".join(bad[:6]) + (" ..." if len(bad) > 6 else ""))
    if mode == "compiled":
        _locate_in_graphs(d, graphs, precision, tol, out, what)
    else:
        _locate_by_replay(d, rec, ref.backward_at, loss_ok, tol, out, what)


def _raised(d: Diagnosis, err: T.StepError, runs: S.Runs, built: Any, entry: Any, mode: str, tdtype: Any,
            seed: int, rebuild: Callable | None, precision: str, tol: numerics.Tolerance, out: Path | None) -> None:
    """tpu's run raised at `err.stage` ("step K forward|backward|optimizer"): that step alone, from CPU's
    weights at its start, under a failure probe (eager) or with its graphs watched (compiled), names the op."""
    _, k, stage = err.stage.split()
    k = d.located_step = int(k)
    if stage != "optimizer":
        graphs: list[C.Graph] = []
        probe = FailureProbe() if mode == "eager" else None
        weights = runs.ref["trace"][k - 1]["weight"]
        with _launch_blocking():
            if mode == "compiled":
                torch._dynamo.reset()
                with C.watch() as graphs:
                    res = _train_step(built, entry, "tpu", tdtype, seed, rebuild, backend="tpu",
                                      exclude=tol.data_dependent, weights=weights)
            else:
                res = _train_step(built, entry, "tpu", tdtype, seed, rebuild, recorder=probe,
                                  exclude=tol.data_dependent, weights=weights)
        if res.error is not None:
            res.stage = res.stage.replace("step 1", f"step {k}")
            _failed(d, res, mode, graphs, precision, tol, probe, out, first_step=k == 1)
            return
    exc = err.exc
    d.status = failure_status(exc, mode, k == 1)
    d.error_type, d.error_message = type(exc).__name__, first_line(exc)
    d.located_op = str(getattr(exc, "op", "") or "")
    d.notes.append(f"failed at {err.stage}")
    d.summary = (f"{err.stage} raises on tpu" + (f" in {d.located_op}" if d.located_op else "")
                 + (f" ({T._optimizer_label('tpu')})" if stage == "optimizer" else
                    f" (not when step {k} runs alone from CPU's weights)")
                 + f": {d.error_type}: {d.error_message}")


def _valid_reference(ref: _Step, f64: _Step, tol: numerics.Tolerance, d: Diagnosis) -> _Step | None:
    """The float64 step when the sweep's train phase would trust it (the same rule, REFERENCE_FACTOR)."""
    if f64.error is not None:
        d.notes.append(f"no float64 reference ({type(f64.error).__name__}): allclose alone judges")
        return None
    a = {"loss.step1": ref.loss, **{f"grad.{k}": v for k, v in ref.grads.items()}}
    b = {"loss.step1": f64.loss, **{f"grad.{k}": v for k, v in f64.grads.items()}}
    # one list for both sides: named again after b lost them, the null gradients were not found, and a's had
    # "no float64 counterpart" (every row with a null gradient was diagnosed by allclose alone)
    null = T.null_gradients(a, b)
    a, b = T.without(a, null), T.without(b, null)
    ok, why = numerics.reference_valid(a, b, replace(tol, reference=tol.reference * T.REFERENCE_FACTOR))
    if not ok:
        d.notes.append(f"float64 reference invalid ({why}): allclose alone judges")
    return f64 if ok else None


def _class_of(model: Any, path: str) -> str:
    try:
        return type(model.get_submodule(path)).__name__ if path else type(model).__name__
    except AttributeError:
        return ""


def _set_op(d: Diagnosis, call: OpCall) -> None:
    d.located_op = call.name
    d.op_inputs = [spec_text(describe(a)) for a in call.args]
    d.op_kwargs = {k: spec_text(describe(v)) for k, v in call.kwargs.items()}


def _locate_by_replay(d: Diagnosis, rec: RecordOps, backward_at: int, loss_ok: bool, tol: numerics.Tolerance,
                      out: Path | None, what: str) -> None:
    calls = rec.calls
    # the loss agrees: the forward is right, so the backward's ops first (then the forward's, whose saved
    # activations the backward reads, in case one is off within the loss's tolerance)
    order = [(backward_at, len(calls)), (0, backward_at)] if loss_ok else [(0, len(calls))]
    for lo, hi in order:
        i, r = _first_differing_op(calls, lo, hi, tol)
        if r is not None:
            break
    d.ops_replayed = len(calls)
    if r is None:
        d.summary = (f"{what}; no single op of the {len(calls)} recorded differs on tpu on the same inputs "
                     "(the divergence builds up over ops that each agree within tolerance)")
        return
    stage = "backward" if i >= backward_at else "forward"
    _set_op(d, r.call)
    d.op_diffs = diff_dicts([x for x in r.diffs if not x.match])
    detail = r.error or (d.op_diffs[0]["reason"] if d.op_diffs else "")
    index = i - backward_at if stage == "backward" else i
    d.summary = (f"{what}; the first op that differs on tpu on the same inputs is {stage} op #{index} "
                 f"{r.call.name} ({', '.join(d.op_inputs)}): {detail}")
    d.notes.append(f"stage: {stage}")
    _op_repro(d, r.call, out, "eager")


def _locate_in_graphs(d: Diagnosis, graphs: list[C.Graph], precision: str, tol: numerics.Tolerance,
                      out: Path | None, what: str) -> None:
    finding = C.locate_in_graphs(graphs, precision, tol, compare_values=True) if graphs else None
    if finding is None:
        d.summary = (f"{what}; no node of the {len(graphs)} compiled graph(s) (forward and backward) differs from "
                     "PyTorch's CPU kernel on the same inputs")
        return
    _set_op(d, finding.call)
    d.op_diffs = diff_dicts([x for x in finding.diffs if not x.match])
    if finding.module and not d.located_module:
        d.located_module, d.module_class = finding.module, finding.module_class
    stage = _graph_stage(graphs, finding)
    d.summary = f"{what}; {finding.op} ({stage} graph node {finding.node}) differs from CPU on the same inputs: " \
                f"{finding.detail}"
    d.notes.append(f"stage: {stage}")
    _op_repro(d, finding.call, out, "compiled")


def _graph_stage(graphs: list[C.Graph], finding: C.NodeFinding) -> str:
    """AOTAutograd's backward graph takes the forward's saved tensors and the output's gradient ("tangents")."""
    for g in graphs:
        if any(n.name == finding.node for n in g.gm.graph.nodes):
            tangents = any(n.op == "placeholder" and "tangents" in n.name for n in g.gm.graph.nodes)
            return "backward" if tangents else "forward"
    return "compiled"


def _failed(d: Diagnosis, res: _Step, mode: str, graphs: list[C.Graph], precision: str, tol: numerics.Tolerance,
            probe: FailureProbe | None, out: Path | None, first_step: bool = True) -> None:
    exc = res.error
    d.status = failure_status(exc, mode, first_step)
    d.error_type, d.error_message = type(exc).__name__, first_line(exc)
    d.notes.append(f"failed at {res.stage}")
    op = getattr(exc, "op", "") or ""
    call = probe.failed if probe is not None else None
    if mode == "compiled" and graphs:
        f = C.locate_in_graphs(graphs, precision, tol, want_op=str(op))
        call = f.call if f is not None else None
        if f is not None:
            d.located_module, d.module_class = f.module, f.module_class
    if call is not None:
        _set_op(d, call)
        d.located_module = d.located_module or call.module
    elif op:
        d.located_op = str(op)
    d.summary = (f"{res.stage} raises on tpu" + (f" in {d.located_op}" if d.located_op else "")
                 + (f" with inputs {', '.join(d.op_inputs)}" if d.op_inputs else "")
                 + f": {d.error_type}: {d.error_message}")
    if call is not None:
        _op_repro(d, call, out, mode)


def _op_repro(d: Diagnosis, call: OpCall, out: Path | None, mode: str) -> None:
    if out is None:
        return
    try:
        d.repro_path = str(R.write_op_repro(out / "repro.py", call.op, clone_cpu(call.args), clone_cpu(call.kwargs),
                                            mode=mode, tol=d.tol, precision=d.precision, dtype=d.dtype,
                                            entry_id=d.entry_id, module=d.located_module or "<model>",
                                            module_class=d.module_class, summary=d.summary))
    except ValueError as exc:
        d.notes.append(f"op repro not possible: {exc}")


def diagnose_train_entry(entry: Any, mode: str = "eager", out_dir: str | Path | None = None, **kw: Any) -> Diagnosis:
    seed = kw.get("seed", 0)
    try:
        built = entry.build(seed=seed)
    except Exception as exc:  # noqa: BLE001
        d = Diagnosis(entry.id, mode, "not_available", phase="train", error_type=type(exc).__name__,
                      error_message=first_line(exc), summary=f"the entry cannot be built: {first_line(exc)}")
        return _finish(d, time.perf_counter(), Path(out_dir) if out_dir else None)
    return diagnose_train_built(built, entry, mode, out_dir=out_dir, rebuild=lambda: entry.build(seed=seed).model,
                                **kw)


def diagnose_train_row(entry: Any, built: Any, mode: str, opts: Any, overrides: numerics.Overrides | None) -> dict:
    """For `hf-tpu sweep --diagnose`: a failing train row's located_module (the first diverging gradient's
    parameter), located_op and repro_path; fused rows are diagnosed as eager (their ops are the same). Never
    raises: a diagnosis error is reported in located_module."""
    from harness.diagnose.core import safe_dirname

    out = Path(opts.out) / "diagnose" / (safe_dirname(entry.id, mode) + "-train")
    try:
        out.mkdir(parents=True, exist_ok=True)
        d = diagnose_train_built(built, entry, "compiled" if mode == "compiled" else "eager", out_dir=out,
                                 precision=opts.precision, dtype=opts.dtype, seed=opts.seed, overrides=overrides,
                                 rebuild=lambda: entry.build(seed=opts.seed).model,
                                 steps=getattr(opts, "train_steps", 3))
    except Exception as exc:  # noqa: BLE001
        return {"located_module": f"<diagnose error: {type(exc).__name__}: {first_line(exc)[:80]}>"}
    fields = d.row_fields()
    if d.status in ("pass", "not_available", "baseline_fail"):
        fields["located_module"] = fields["located_module"] or f"<diagnose: {d.status}>"
    return {k: v for k, v in fields.items() if v}  # keep the row's own located_module when diagnose has none
