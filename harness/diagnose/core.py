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
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from harness.core import errors, model_dtype
from harness.diagnose import compiled as C
from harness.diagnose.diagnosis import Diagnosis, FAILING, finite_or_none, first_line
from harness.diagnose.locate import (locate_compiled_divergence, locate_compiled_failure, locate_divergence,
                                     locate_eager_failure)
from harness.diagnose.modules import ModuleRecorder, named_modules
from harness.diagnose.ops import FailureProbe, ModuleStack
from harness.entry_calls import (compile_call, during_compile, output_tensors, prepare_inputs, prepare_model,
                                 to_cpu)
from harness.sweep import emulate, numerics


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


def _dtype(name: str) -> torch.dtype:
    spec = model_dtype.resolve(name)  # unknown names get resolve's error, which lists the valid ones
    if isinstance(spec, model_dtype.LayerwiseCast):
        # float8 storage hooks every layer's forward; the module replays here would need those hooks too
        raise ValueError(f"diagnose runs at float32 or bfloat16, not {name!r}: diagnose the row at bfloat16 "
                         "(--dtype bfloat16): float8 storage only changes the weights, identically on both sides")
    return spec


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
        d.status, d.error_type, d.error_message = "baseline_fail", type(exc).__name__, first_line(exc)
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
        d.error_type, d.error_message = type(cause).__name__, first_line(cause)
        d.located_op = errors.failing_op(run_exc)
        if mode == "compiled":
            locate_compiled_failure(d, graphs, run_exc, precision, tol, cpu_model, cpu_rec, out_dir)
        else:
            locate_eager_failure(d, t_mode, t_stack, t_rec, cpu_rec, cpu_model, out_dir, run_exc)
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
            d.notes.append(f"eager run raises: {type(t_exc).__name__}: {first_line(t_exc)}")
        else:
            locate_divergence(d, cpu_rec, t_rec, fp64_rec, tol, cpu_model, out_dir, precision, dtype,
                              eager_only=(mode == "compiled"), tpu_model=tpu_model)
        if mode == "compiled":
            locate_compiled_divergence(d, graphs, precision, tol, out_dir)
    return _finish(d, start, out_dir)


def _output_diffs(ref: dict, res: dict, fp64: dict | None, tol) -> dict:
    out = {}
    for k in ref:
        if k in res:
            ok, m, reason = numerics.compare_tensor(k, ref[k], res[k], (fp64 or {}).get(k), tol)
            if not ok:
                out[k] = {**{a: finite_or_none(b) for a, b in m.items()}, "reason": reason}
    return out


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
        d = Diagnosis(entry.id, mode, "not_available", error_type=type(exc).__name__, error_message=first_line(exc),
                      summary=f"the entry cannot be built: {first_line(exc)}")
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
        return {"located_module": f"<diagnose error: {type(exc).__name__}: {first_line(exc)[:80]}>",
                "located_op": "", "repro_path": ""}


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
