"""`diagnose`: re-run one entry on CPU and `tpu` and say where it first goes wrong.

- fail_accuracy: CPU, float64 and `tpu` runs with forward hooks on every module; the first module (in the
  order calls finish) whose output diverges beyond the sweep's tolerance while its inputs agree. Inside it the
  CPU module runs again under a TorchDispatchMode that records each ATen op with its inputs; each op is
  replayed on `tpu` with the same inputs, and the first whose result differs is named. Compiled mode: the
  ATen graphs the `tpu` backend compiled are walked node by node (PyTorch's CPU kernel against hf_tpu's
  lowering on the same inputs), and the eager module localisation is reported alongside.
- fail_to_run / compile_fail: the ATen op that raised (the exception's `.op`, and the op a dispatch mode saw
  fail, with its inputs), the module it was called from (forward pre-hooks keep the module stack; compiled
  graphs carry `nn_module_stack`), or Dynamo's graph-break reason.
- a standalone repro script next to the report (repro.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core import errors
from harness.diagnose import compiled as C
from harness.diagnose import repro as R
from harness.diagnose.modules import ModuleRecorder, first_divergence, named_modules
from harness.diagnose.ops import (
    FailureProbe,
    ModuleStack,
    RecordOps,
    TensorDiff,
    align,
    clone_cpu,
    describe,
    is_discontinuous,
    replay,
    spec_text,
    to_device,
)
from harness.entry_calls import (
    compile_call,
    during_compile,
    output_tensors,
    prepare_inputs,
    prepare_model,
    to_cpu,
)
from harness.sweep import emulate, numerics

FAILING = ("fail_accuracy", "fail_to_run", "compile_fail")


@dataclass
class Diagnosis:
    entry_id: str
    mode: str
    status: str  # pass | fail_accuracy | fail_to_run | compile_fail | baseline_fail | not_available
    summary: str = ""
    located_module: str = ""
    module_class: str = ""
    located_op: str = ""
    outer_op: str = ""  # the op the dispatch mode saw fail when `.op` names an op of its decomposition
    op_inputs: list = field(default_factory=list)  # "float32[4, 32]", ... for each argument
    op_kwargs: dict = field(default_factory=dict)
    error_type: str = ""
    error_message: str = ""
    graph_breaks: list = field(default_factory=list)
    output_diffs: list = field(default_factory=list)  # whole-model outputs that diverge
    module_diffs: list = field(default_factory=list)  # the located module's outputs
    op_diffs: list = field(default_factory=list)  # the located op's outputs
    downstream: list = field(default_factory=list)  # modules that diverged earlier, on already diverged inputs
    notes: list = field(default_factory=list)
    modules_compared: int = 0
    ops_replayed: int = 0
    precision: str = "highest"
    dtype: str = "float32"
    tol: float = 0.0
    seconds: float = 0.0
    repro_path: str = ""
    report_path: str = ""
    phase: str = "inference"  # train: harness/diagnose/train.py
    located_parameter: str = ""  # train: the first parameter whose gradient diverges (backward order)

    def to_json(self) -> dict:
        return asdict(self)

    def row_fields(self) -> dict:
        """The results.csv columns diagnose fills."""
        found = self.located_op or self.module_class
        if self.located_parameter:  # a train row names its first diverging gradient's parameter there
            return {"located_module": self.located_parameter, "located_op": self.located_op,
                    "repro_path": self.repro_path}
        return {"located_module": self.located_module or ("<model>" if found else ""),
                "located_op": self.located_op, "repro_path": self.repro_path}


def _diff_dicts(diffs: list[TensorDiff], limit: int = 8) -> list[dict]:
    out = []
    for d in diffs[:limit]:
        out.append({"name": d.name, "match": d.match, "max_abs_err": _f(d.max_abs_err),
                    "max_rel_err": _f(d.max_rel_err), "cosine": _f(d.cosine), "reason": d.reason})
    return out


def _f(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _first_line(exc: BaseException) -> str:
    return errors.normalise(str(exc) or repr(exc))


@contextlib.contextmanager
def _launch_blocking():
    """Errors surface at the op that caused them: switched in this process through hf_tpu.hooks (hf_tpu reads
    the variable once, at import), and in the variable for the processes it starts."""
    old = os.environ.get("TORCH_TPU_LAUNCH_BLOCKING")
    os.environ["TORCH_TPU_LAUNCH_BLOCKING"] = "1"
    try:
        with _hooks_launch_blocking():
            yield
    finally:
        if old is None:
            os.environ.pop("TORCH_TPU_LAUNCH_BLOCKING", None)
        else:
            os.environ["TORCH_TPU_LAUNCH_BLOCKING"] = old


def _hooks_launch_blocking() -> contextlib.AbstractContextManager:
    try:
        from hf_tpu import device, hooks
    except ImportError:
        return contextlib.nullcontext()
    return hooks.launch_blocking(True) if device.is_registered() else contextlib.nullcontext()


def _set_precision(p: str) -> None:
    try:
        import hf_tpu

        hf_tpu.set_matmul_precision(p)
    except (ImportError, AttributeError):
        torch.set_float32_matmul_precision(p)


def _dtype(name: str):
    if name not in ("float32", "bfloat16"):
        # float8 storage hooks every layer's forward; the module replays here would need those hooks too
        raise ValueError(f"diagnose runs at float32 or bfloat16, not {name!r}: diagnose the row at bfloat16 "
                         "(--dtype bfloat16): float8 storage only changes the weights, identically on both sides")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


# ------------------------------------------------------------------------------------------------ the runs
def _hooked_run(built, model, device: str | None, dtype, seed: int, keep_io: bool = True,
                stack: bool = False, record_failure: bool = False):
    """Run the entry with module hooks (and, for tpu, a module stack and a failure-recording dispatch mode).
    Returns (outputs on CPU or None, ModuleRecorder, exception or None, RecordOps or None, ModuleStack)."""
    mods = named_modules(model)
    rec = ModuleRecorder(mods, keep_io=keep_io)
    ms = ModuleStack().attach(mods) if stack else None
    mode = FailureProbe(stack=ms) if record_failure else None
    out, exc = None, None
    try:
        with torch.no_grad():
            torch.manual_seed(seed)
            inputs = prepare_inputs(built.inputs, device, dtype)
            with (mode if mode is not None else contextlib.nullcontext()):
                res = built.call(model, inputs)
            out = to_cpu(output_tensors(res))
    except Exception as e:  # noqa: BLE001
        exc = e
    finally:
        rec.detach()
        if ms is not None:
            ms.detach()
    return out, rec, exc, mode, ms


def _compiled_run(built, model, dtype, seed: int):
    import torch._dynamo

    torch._dynamo.reset()
    try:
        import hf_tpu

        hf_tpu.reset_compile_stats()
    except (ImportError, AttributeError):
        pass
    out, exc = None, None
    with C.watch() as graphs:
        try:
            fn = compile_call(built.call, model, "tpu")  # as the sweep compiles it (pipelines: the denoiser)
            with torch.no_grad():
                torch.manual_seed(seed)
                out = to_cpu(output_tensors(fn(model, prepare_inputs(built.inputs, "tpu", dtype))))
        except Exception as e:  # noqa: BLE001
            exc = e
    return out, exc, graphs, C.graph_break_reasons()


# ---------------------------------------------------------------------------------------------- diagnose
def diagnose_built(built, entry_id: str, mode: str = "eager", *, out_dir: str | Path | None = None,
                   precision: str = "highest", dtype: str = "float32", seed: int = 0,
                   overrides: numerics.Overrides | None = None, rebuild: Callable | None = None,
                   ref: dict | None = None, fp64: dict | None = None) -> Diagnosis:
    """Diagnose one built entry (harness.zoo BuiltEntry or anything with model, inputs, call)."""
    start = time.perf_counter()
    tol = numerics.tolerance_for(entry_id, precision, dtype, overrides)
    d = Diagnosis(entry_id, mode, "pass", precision=precision, dtype=dtype, tol=tol.tol)
    tdtype = _dtype(dtype)
    low = tdtype != torch.float32
    out_dir = Path(out_dir) if out_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    # CPU baseline and float64 reference, with every module's inputs and outputs: the sweep's oracle (IEEE float32
    # on any host, the tpu's matmul rounding applied explicitly), so module-level comparisons judge as rows do
    cpu_model = built.model
    if low:
        cpu_model = prepare_model(built.model, None, tdtype, rebuild)
    with emulate.matmul_precision(precision):
        ref_out, cpu_rec, exc, _, _ = _hooked_run(built, cpu_model, None, tdtype if low else None, seed)
    if exc is not None:
        d.status, d.error_type, d.error_message = "baseline_fail", type(exc).__name__, _first_line(exc)
        d.summary = f"the CPU baseline fails: {d.error_type}: {d.error_message}"
        return _finish(d, start, out_dir)
    ref = ref if ref is not None else ref_out
    fp64_rec = None
    try:
        m64 = prepare_model(built.model, None, torch.float64, rebuild)
        with emulate.cpu_reference():
            f64_out, fp64_rec, exc64, _, _ = _hooked_run(built, m64, None, torch.float64, seed)
        fp64 = fp64 if fp64 is not None else (f64_out if exc64 is None else None)
        if exc64 is not None:
            fp64_rec = None
        del m64
    except Exception:  # noqa: BLE001
        fp64_rec = None

    _set_precision(precision)
    tpu_model = prepare_model(built.model, "tpu", tdtype if low else None, rebuild)
    with _launch_blocking():
        t_out, t_rec, t_exc, t_mode, t_stack = _hooked_run(
            built, tpu_model, "tpu", tdtype if low else None, seed, stack=True, record_failure=True)
        graphs: list = []
        if mode == "compiled":
            c_out, c_exc, graphs, d.graph_breaks = _compiled_run(built, tpu_model, tdtype if low else None, seed)
            res, run_exc = c_out, c_exc
        else:
            res, run_exc = t_out, t_exc

    if run_exc is not None:
        d.status = "fail_to_run"
        if mode == "compiled" and (errors.is_compile_error(run_exc) or during_compile(run_exc)):
            d.status = "compile_fail"  # the sweep's rule (harness/entry_calls.py: failure_status)
        cause = errors.root_cause(run_exc)
        d.error_type, d.error_message = type(cause).__name__, _first_line(cause)
        d.located_op = errors.failing_op(run_exc)
        if mode == "compiled":
            _locate_compiled_failure(d, graphs, run_exc, precision, tol, cpu_model, cpu_rec, out_dir)
        else:
            _locate_eager_failure(d, t_mode, t_stack, t_rec, cpu_rec, cpu_model, out_dir, run_exc)
        return _finish(d, start, out_dir)

    cmp = numerics.compare_outputs(ref, res, fp64, tol)
    if cmp.match:
        d.summary = f"passes: every output matches the CPU baseline ({mode}, tol {tol.tol:g})"
        if mode == "eager" or t_exc is None:
            return _finish(d, start, out_dir)
    else:
        d.status = "fail_accuracy"
        d.error_type, d.error_message = "AccuracyError", errors.normalise(cmp.reason)
        d.output_diffs = [{"name": k, **v} for k, v in _output_diffs(ref, res, fp64, tol).items()][:8]
    if mode == "eager" or d.status == "fail_accuracy":
        if t_exc is not None:  # compiled diverges, eager raises: report the eager failure as a note
            d.notes.append(f"eager run raises: {type(t_exc).__name__}: {_first_line(t_exc)}")
        else:
            _locate_divergence(d, cpu_rec, t_rec, fp64_rec, tol, cpu_model, out_dir, precision, dtype,
                               eager_only=(mode == "compiled"), tpu_model=tpu_model)
        if mode == "compiled":
            _locate_compiled_divergence(d, graphs, precision, tol, out_dir)
    return _finish(d, start, out_dir)


def _output_diffs(ref: dict, res: dict, fp64: dict | None, tol) -> dict:
    out = {}
    for k in ref:
        if k in res:
            ok, m, reason = numerics.compare_tensor(k, ref[k], res[k], (fp64 or {}).get(k), tol)
            if not ok:
                out[k] = {**{a: _f(b) for a, b in m.items()}, "reason": reason}
    return out


def _module_lookup(model: Any) -> dict[str, torch.nn.Module]:
    return dict(named_modules(model))


def _locate_divergence(d: Diagnosis, cpu_rec, t_rec, fp64_rec, tol, cpu_model, out_dir, precision, dtype,
                       eager_only: bool = False, tpu_model=None) -> None:
    div = first_divergence(cpu_rec.calls, t_rec.calls, fp64_rec.calls if fp64_rec else None, tol)
    where = "eager: " if eager_only else ""
    if div is None:
        d.notes.append(f"{where}no module's output diverges while its inputs agree (outputs compared for "
                       f"{len(cpu_rec.calls)} module calls): the divergence is in code outside any module")
        return
    d.modules_compared = div.modules_compared
    d.downstream = div.downstream[:10]
    mod_name = div.cpu.name or "<model>"
    if not eager_only:
        d.located_module, d.module_class = div.cpu.name, div.cpu.cls
        d.module_diffs = _diff_dicts([x for x in div.out_diffs if not x.match])
    else:
        d.notes.append(f"eager also diverges, first at module {mod_name} ({div.cpu.cls})")
        if not d.located_module:
            d.located_module, d.module_class = div.cpu.name, div.cpu.cls
            d.module_diffs = _diff_dicts([x for x in div.out_diffs if not x.match])
    module = _module_lookup(cpu_model).get(div.cpu.name)
    if module is None:
        return
    # op by op inside the module, on the CPU module's own inputs
    rec = RecordOps(keep=True)
    try:
        args, kwargs = clone_cpu(div.cpu.args), clone_cpu(div.cpu.kwargs)  # before the mode: not module ops
        with torch.no_grad(), emulate.matmul_precision(d.precision), rec:  # recorded as the baseline computed it
            module(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        d.notes.append(f"re-running {mod_name} alone on CPU failed: {type(exc).__name__}: {_first_line(exc)}")
    raised = []
    found = None
    for call in rec.calls:
        r = replay(call, "tpu", tol)
        if r.skipped:
            continue
        d.ops_replayed += 1
        if r.error:
            raised.append(f"{call.name}: {r.error}")
            continue
        if not r.match:
            found = r
            break
    if raised:
        d.notes.append(f"{len(raised)} CPU op(s) have no tpu equivalent on the same inputs (the tpu run takes "
                       f"another path), e.g. {raised[0]}")
    if found is not None and not (eager_only and d.located_op):
        call = found.call
        d.located_op = found.call.name
        d.op_inputs = [spec_text(describe(a)) for a in call.args]
        d.op_kwargs = {k: spec_text(describe(v)) for k, v in call.kwargs.items()}
        d.op_diffs = _diff_dicts([x for x in found.diffs if not x.match])
        worst = next((x for x in found.diffs if not x.match), None)
        d.summary = (f"{d.located_op} in {mod_name} ({div.cpu.cls}) differs on tpu from CPU on the same inputs"
                     + (f": max abs err {worst.max_abs_err:.3g}" if worst and not math.isnan(worst.max_abs_err) else ""))
        if out_dir is not None:
            d.repro_path = str(R.write_op_repro(out_dir / "repro.py", call.op, call.args, call.kwargs,
                                                mode="eager", tol=tol.tol, precision=precision, dtype=dtype,
                                                entry_id=d.entry_id, module=mod_name, module_class=div.cpu.cls,
                                                summary=d.summary))
    elif not d.summary:
        d.summary = (f"module {mod_name} ({div.cpu.cls}) is the first whose output diverges while its inputs agree; "
                     f"no single op of its {d.ops_replayed} differs on the same inputs")
        _align_module_run(d, rec.calls, tpu_model, div, tol, mod_name)
        if out_dir is not None and not d.repro_path:
            _module_repro(d, module, div.cpu.args, div.cpu.kwargs, out_dir, "eager")


def _align_module_run(d: Diagnosis, cpu_calls, tpu_model, div, tol, mod_name: str) -> None:
    """No op differs on identical inputs: run the module on tpu too, recording its ops, and walk both runs side
    by side to find where they part (another op path, or an op that turns a within-tolerance input difference
    into a large one)."""
    tmod = _module_lookup(tpu_model).get(div.cpu.name) if tpu_model is not None else None
    if tmod is None:
        return
    trec = RecordOps(keep=True)
    try:
        args, kwargs = to_device(div.tpu.args, "tpu"), to_device(div.tpu.kwargs, "tpu")
        with torch.no_grad(), trec:
            tmod(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        d.notes.append(f"re-running {mod_name} alone on tpu failed: {type(exc).__name__}: {_first_line(exc)}")
        return
    m = align(cpu_calls, trec.calls, tol)
    if m is None:
        d.notes.append(f"{mod_name} run alone on its recorded inputs: every op agrees; the divergence needs the "
                       "whole model's state (aliasing, caches) to show")
        return
    if m.kind == "path":
        d.located_op = m.cpu.name
        d.summary += (f"; the tpu run takes another path at op #{m.index}: {m.cpu.name} on CPU, "
                      f"{m.tpu.name if m.tpu else 'nothing'} on tpu")
        return
    d.located_op = m.cpu.name
    d.op_inputs = [spec_text(describe(a)) for a in m.cpu.args]
    d.op_diffs = _diff_dicts([x for x in m.diffs if not x.match])
    worst_in = max((x.max_abs_err for x in m.input_diffs if not math.isnan(x.max_abs_err)), default=0.0)
    if m.inputs_agree:
        why = ("a discontinuous op (comparison, selection or rounding) turns a within-tolerance input "
               "difference into a different result" if is_discontinuous(m.cpu.name) else
               "the op agrees on identical inputs but not on the tpu run's own inputs")
        d.summary += (f"; in the module's own tpu run, op #{m.index} {m.cpu.name} is the first whose result differs "
                      f"while its inputs agree within tolerance (max abs input err {worst_in:.3g}): {why}")
    else:
        d.summary += f"; in the module's own tpu run, op #{m.index} {m.cpu.name} is the first whose result differs"


def _module_repro(d: Diagnosis, module, args, kwargs, out_dir: Path, mode: str) -> None:
    """The module pickled with its recorded inputs; when it cannot be pickled (a class defined in a function),
    a script that rebuilds the whole entry from the zoo and compares its outputs."""
    try:
        d.repro_path = str(R.write_module_repro(out_dir / "repro.py", module, clone_cpu(args), clone_cpu(kwargs),
                                                mode=mode, tol=d.tol, precision=d.precision, dtype=d.dtype,
                                                entry_id=d.entry_id, module_name=d.located_module or "<model>",
                                                summary=d.summary))
        return
    except Exception as exc:  # noqa: BLE001
        (out_dir / "repro.pt").unlink(missing_ok=True)
        why = f"{type(exc).__name__}: {_first_line(exc)}"
    if d.entry_id and not d.entry_id.startswith("<"):
        d.repro_path = str(R.write_entry_repro(out_dir / "repro.py", d.entry_id, mode=mode, tol=d.tol,
                                               precision=d.precision, dtype=d.dtype, module_name=d.located_module,
                                               summary=d.summary))
        d.notes.append(f"the module cannot be saved alone ({why}): the repro rebuilds the entry")
    else:
        d.notes.append(f"could not write a module repro: {why}")


def _locate_eager_failure(d: Diagnosis, mode: FailureProbe | None, stack: ModuleStack | None, t_rec, cpu_rec,
                          cpu_model, out_dir, exc: BaseException) -> None:
    failed = mode.failed if mode is not None else None
    if failed is not None:
        d.located_module = failed.module
        outer = failed.name
        if not d.located_op:
            d.located_op = outer
        elif d.located_op != outer:
            d.outer_op = outer
        d.op_inputs = [spec_text(describe(a)) for a in failed.args]
        d.op_kwargs = {k: spec_text(describe(v)) for k, v in failed.kwargs.items()}
    elif stack is not None and stack.stack:
        d.located_module = stack.top()
    cls = {n: type(m).__name__ for n, m in named_modules(cpu_model)}
    d.module_class = cls.get(d.located_module, "")
    mod_name = d.located_module or "<model>"
    via = f" (raised inside {d.outer_op})" if d.outer_op else ""
    d.summary = (f"{d.located_op or 'a Python error'}{via} raises on tpu in {mod_name}"
                 f"{' (' + d.module_class + ')' if d.module_class else ''}"
                 + (f" with inputs {', '.join(d.op_inputs)}" if d.op_inputs else "")
                 + f": {d.error_type}: {d.error_message}")
    if failed is None:
        d.notes.append("no ATen op raised: the error is in Python code running on tpu tensors; see the traceback")
        loc = _user_code(exc)
        d.notes.append(f"raised at {loc}" if loc else "")
    if out_dir is None:
        return
    if failed is not None:
        try:
            d.repro_path = str(R.write_op_repro(out_dir / "repro.py", failed.op, failed.args, failed.kwargs,
                                                mode="eager", tol=d.tol, precision=d.precision, dtype=d.dtype,
                                                entry_id=d.entry_id, module=mod_name, module_class=d.module_class,
                                                summary=d.summary))
            return
        except ValueError as exc:
            d.notes.append(f"op repro not possible ({exc}): writing a module repro")
    module = _module_lookup(cpu_model).get(d.located_module)
    call = next((c for c in cpu_rec.calls if c.name == d.located_module), None)
    if module is not None and call is not None:
        _module_repro(d, module, call.args, call.kwargs, out_dir, "eager")


def _locate_compiled_failure(d: Diagnosis, graphs, exc, precision, tol, cpu_model, cpu_rec, out_dir) -> None:
    want = d.located_op
    finding = C.locate_in_graphs(graphs, precision, tol, want_op=want) if graphs else None
    if finding is not None:
        d.located_op = finding.op
        d.located_module, d.module_class = finding.module, finding.module_class
        d.op_inputs = [spec_text(describe(a)) for a in finding.call.args]
        d.op_kwargs = {k: spec_text(describe(v)) for k, v in finding.call.kwargs.items()}
        d.summary = (f"{finding.op} ({finding.why.replace('_', ' ')}) in compiled graph node {finding.node}, "
                     f"module {finding.module or '<model>'}"
                     + (f" ({finding.module_class})" if finding.module_class else "")
                     + (f", inputs {', '.join(d.op_inputs)}" if d.op_inputs else "") + f": {finding.detail}")
        _write_compiled_op_repro(d, finding, out_dir)
        return
    # no graph reached the backend, or the failure is Dynamo's own (a graph break it could not handle)
    loc = _user_code(exc)
    reason = d.error_message
    d.summary = (f"Dynamo failed before the tpu backend: {d.error_type}: {reason}" if not graphs else
                 f"compiled run failed: {d.error_type}: {reason}") + (f" at {loc}" if loc else "")
    if d.graph_breaks and not d.located_op:
        first = d.graph_breaks[0]
        d.summary += f"; first graph break: {first}"
        if errors.is_compile_error(exc):  # Dynamo's own error: the graph break is the cause
            d.located_op = f"graph break: {first.split(' (x')[0]}"[:160]
    if _traced_into_backend(exc, d.graph_breaks):
        d.notes.append("Dynamo traced into hf_tpu's eager dispatch / JAX (tpu tensor internals) after a graph break: "
                       "the compiled run executes backend Python code under Dynamo")
    if loc:
        d.notes.append(f"user code: {loc}")
    if out_dir is not None and cpu_model is not None and isinstance(cpu_model, torch.nn.Module) and cpu_rec.calls:
        root = next((c for c in reversed(cpu_rec.calls) if c.name == ""), None)
        if root is not None:
            _module_repro(d, cpu_model, root.args, root.kwargs, out_dir, "compiled")


_USER_RE = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')
_NOT_USER = ("/torch/", "/jax/", "/jaxlib/", "/hf_tpu/", "/harness/", "/functorch/", "/contextlib.py", "/runpy.py",
             "/torchax/")


def _user_code(exc: BaseException) -> str:
    """The innermost frame of model code (not torch, JAX, hf_tpu or the harness) on the way to the error."""
    for e in errors.chain(exc):
        m = [x for x in _USER_RE.finditer(str(e)) if not any(p in x.group(1) for p in _NOT_USER)]
        if m:
            f, line, fn = m[-1].groups()
            return f"{os.path.basename(f)}:{line} in {fn}"
    for e in errors.chain(exc):
        tb = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
        for fr in reversed(tb):
            if not any(p in fr.filename for p in _NOT_USER):
                return f"{os.path.basename(fr.filename)}:{fr.lineno} in {fr.name}"
    return ""


def _traced_into_backend(exc: BaseException, breaks: list[str]) -> bool:
    if any("_hf_tpu" in b or "jaxlib" in b or "nb_method" in b or "nb_func" in b for b in breaks):
        return True
    for e in errors.chain(exc):
        tb = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
        names = [fr.filename for fr in tb]
        if any("/torch/_dynamo/" in n for n in names) and any("/hf_tpu/dispatch.py" in n for n in names):
            return True
    return False


def _locate_compiled_divergence(d: Diagnosis, graphs, precision, tol, out_dir) -> None:
    finding = C.locate_in_graphs(graphs, precision, tol, compare_values=True) if graphs else None
    if finding is None:
        d.notes.append(f"compiled: no node of the {len(graphs)} compiled graph(s) differs from PyTorch's CPU "
                       "kernel on the same inputs")
        return
    d.located_op = finding.op
    if finding.module:
        d.located_module, d.module_class = finding.module, finding.module_class
    d.op_inputs = [spec_text(describe(a)) for a in finding.call.args]
    d.op_diffs = _diff_dicts([x for x in finding.diffs if not x.match])
    d.summary = (f"{finding.op} (compiled graph node {finding.node}) in {finding.module or '<model>'}"
                 f"{' (' + finding.module_class + ')' if finding.module_class else ''} differs from CPU on the same "
                 f"inputs: {finding.detail}")
    _write_compiled_op_repro(d, finding, out_dir)


def _finish(d: Diagnosis, start: float, out_dir: Path | None) -> Diagnosis:
    d.seconds = round(time.perf_counter() - start, 2)
    d.notes = [n for n in d.notes if n]
    if out_dir is not None:
        from harness.diagnose.report import write_reports

        d.report_path = str(write_reports(d, out_dir))
    return d


# -------------------------------------------------------------------------------------------- entries
def find_entry(entry_id: str, zoo: str | None = None, hub_layers: int = 2):
    """A zoo entry by id: test/<kind> (the sweep's test zoo), an id of the full zoo, or of a models list."""
    from harness.sweep import testzoo

    if entry_id.startswith("test/"):
        kind = entry_id.split("/", 1)[1].split("_")[0]
        return testzoo.parse_spec(f"test:{kind}")[0]
    from harness.zoo import load_zoo

    for spec in ([zoo] if zoo else ["full"]):
        for e in load_zoo(spec, hub_layers=hub_layers):
            if e.id == entry_id:
                return e
    raise KeyError(f"no entry {entry_id!r} in zoo {zoo or 'full'!r}")


def diagnose_entry(entry, mode: str = "eager", out_dir: str | Path | None = None, **kw) -> Diagnosis:
    seed = kw.get("seed", 0)
    try:
        built = entry.build(seed=seed)
    except Exception as exc:  # noqa: BLE001
        d = Diagnosis(entry.id, mode, "not_available", error_type=type(exc).__name__, error_message=_first_line(exc),
                      summary=f"the entry cannot be built: {_first_line(exc)}")
        return _finish(d, time.perf_counter(), Path(out_dir) if out_dir else None)
    return diagnose_built(built, entry.id, mode, out_dir=out_dir, rebuild=lambda: entry.build(seed=seed).model, **kw)


def safe_dirname(entry_id: str, mode: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", entry_id).strip("_")[:120] + f"--{mode}"


def diagnose_row(entry, built, mode: str, opts, ref: dict | None = None, fp64: dict | None = None,
                 overrides=None) -> dict:
    """For `hf-tpu sweep --diagnose`: diagnose a failing row's entry in the worker; returns the located_module,
    located_op and repro_path columns (never raises: a diagnosis error is reported in located_module)."""
    out = Path(opts.out) / "diagnose" / safe_dirname(entry.id, mode)
    try:
        out.mkdir(parents=True, exist_ok=True)
        d = diagnose_built(built, entry.id, mode, out_dir=out, precision=opts.precision, dtype=opts.dtype,
                           seed=opts.seed, overrides=overrides, rebuild=lambda: entry.build(seed=opts.seed).model,
                           ref=ref, fp64=fp64)
        fields = d.row_fields()
        if d.status not in FAILING:
            fields["located_module"] = fields["located_module"] or f"<diagnose: {d.status}>"
        return fields
    except Exception as exc:  # noqa: BLE001
        return {"located_module": f"<diagnose error: {type(exc).__name__}: {_first_line(exc)[:80]}>",
                "located_op": "", "repro_path": ""}


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def _write_compiled_op_repro(d: Any, finding: Any, out_dir: Path | None) -> None:
    """The op repro for a finding in a compiled graph (both the failing-op and the differing-op cases)."""
    if out_dir is None:
        return
    try:
        d.repro_path = str(R.write_op_repro(out_dir / "repro.py", finding.call.op, finding.call.args,
                                            finding.call.kwargs, mode="compiled", tol=d.tol,
                                            precision=d.precision, dtype=d.dtype, entry_id=d.entry_id,
                                            module=finding.module, module_class=finding.module_class,
                                            summary=d.summary))
    except ValueError as e:
        d.notes.append(f"op repro not possible: {e}")
