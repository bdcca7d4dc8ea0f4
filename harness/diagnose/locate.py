"""Where a failing run first goes wrong (core.py runs it): the first diverging module and, inside it, the first
diverging ATen op (eager); the node of a compiled graph that differs from PyTorch's CPU kernel; the op and
the user code an error came from; each with a standalone repro script."""

from __future__ import annotations

import math
import os
import re
import traceback
from pathlib import Path
from typing import Any

import torch

from harness.core import errors
from harness.diagnose import compiled as C
from harness.diagnose import repro as R
from harness.diagnose.diagnosis import Diagnosis, diff_dicts, first_line
from harness.diagnose.modules import first_divergence, named_modules
from harness.diagnose.ops import (FailureProbe, ModuleStack, RecordOps, align, clone_cpu, describe,
                                  is_discontinuous, replay, spec_text, to_device)
from harness.sweep import emulate


def _module_lookup(model: Any) -> dict[str, torch.nn.Module]:
    return dict(named_modules(model))


def locate_divergence(d: Diagnosis, cpu_rec, t_rec, fp64_rec, tol, cpu_model, out_dir, precision, dtype,
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
        d.module_diffs = diff_dicts([x for x in div.out_diffs if not x.match])
    else:
        d.notes.append(f"eager also diverges, first at module {mod_name} ({div.cpu.cls})")
        if not d.located_module:
            d.located_module, d.module_class = div.cpu.name, div.cpu.cls
            d.module_diffs = diff_dicts([x for x in div.out_diffs if not x.match])
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
        d.notes.append(f"re-running {mod_name} alone on CPU failed: {type(exc).__name__}: {first_line(exc)}")
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
        d.op_diffs = diff_dicts([x for x in found.diffs if not x.match])
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
        d.notes.append(f"re-running {mod_name} alone on tpu failed: {type(exc).__name__}: {first_line(exc)}")
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
    d.op_diffs = diff_dicts([x for x in m.diffs if not x.match])
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
        why = f"{type(exc).__name__}: {first_line(exc)}"
    if d.entry_id and not d.entry_id.startswith("<"):
        d.repro_path = str(R.write_entry_repro(out_dir / "repro.py", d.entry_id, mode=mode, tol=d.tol,
                                               precision=d.precision, dtype=d.dtype, module_name=d.located_module,
                                               summary=d.summary))
        d.notes.append(f"the module cannot be saved alone ({why}): the repro rebuilds the entry")
    else:
        d.notes.append(f"could not write a module repro: {why}")


def locate_eager_failure(d: Diagnosis, mode: FailureProbe | None, stack: ModuleStack | None, t_rec, cpu_rec,
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


def locate_compiled_failure(d: Diagnosis, graphs, exc, precision, tol, cpu_model, cpu_rec, out_dir) -> None:
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


def locate_compiled_divergence(d: Diagnosis, graphs, precision, tol, out_dir) -> None:
    finding = C.locate_in_graphs(graphs, precision, tol, compare_values=True) if graphs else None
    if finding is None:
        d.notes.append(f"compiled: no node of the {len(graphs)} compiled graph(s) differs from PyTorch's CPU "
                       "kernel on the same inputs")
        return
    d.located_op = finding.op
    if finding.module:
        d.located_module, d.module_class = finding.module, finding.module_class
    d.op_inputs = [spec_text(describe(a)) for a in finding.call.args]
    d.op_diffs = diff_dicts([x for x in finding.diffs if not x.match])
    d.summary = (f"{finding.op} (compiled graph node {finding.node}) in {finding.module or '<model>'}"
                 f"{' (' + finding.module_class + ')' if finding.module_class else ''} differs from CPU on the same "
                 f"inputs: {finding.detail}")
    _write_compiled_op_repro(d, finding, out_dir)


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
