"""One entry, all its modes, inside a worker: baseline, float64 reference, then each backend mode.

`run_entry` reports through `emit(kind, payload)`: ("phase", name) before each phase (build, baseline,
reference, eager, compiled, control) so that the parent can attribute a dead worker to the phase it died in,
("row", row) as each mode's row is complete, and ("cause", {mode, cause, control_error}) after a failing
row's control (harness/sweep/control.py): the parent merges it into that mode's row.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from importlib import metadata

from harness.core import errors, model_dtype
from harness.entry_calls import (  # noqa: F401  (re-exported: repro scripts written earlier import them here)
    compile_call,
    during_compile,
    failure_status,
    output_tensors,
    prepare_inputs,
    prepare_model,
    to_cpu,
)
from harness.schema import SCHEMA_VERSION
from harness.sweep import (control, draws, emulate, float64_ops, informative, numerics, perf, tensor_parallel, ties,
                           train, train_control, train_spread, train_weights)
from harness.sweep.device import Device, backend_phase
from harness.sweep.options import SweepOptions
from hf_tpu.precision import cpu_reference

Emit = Callable[[str, object], None]
_VERSIONS: str | None = None


def versions() -> str:
    global _VERSIONS
    if _VERSIONS is None:
        parts = []
        for pkg in ("torch", "jax", "transformers", "diffusers"):
            try:
                parts.append(f"{pkg}={metadata.version(pkg)}")
            except metadata.PackageNotFoundError:
                parts.append(f"{pkg}=")
        _VERSIONS = ";".join(parts)
    return _VERSIONS


def base_row(entry, mode: str, opts: SweepOptions, backend: str, phase: str = "inference") -> dict:
    return {
        "entry_id": entry.id, "library": entry.library, "model_type": entry.model_type,
        "model_class": entry.model_class, "task": entry.task, "phase": phase, "mode": mode,
        "precision": opts.precision,
        "dtype": opts.dtype, "backend": backend, "versions": versions(), "schema_version": SCHEMA_VERSION,
    }


def _torch_dtype(name: str):
    """A torch.dtype, or float8 storage (harness.core.model_dtype)."""
    return model_dtype.resolve(name)


def run_entry(entry, modes: tuple[str, ...], opts: SweepOptions, device: Device, emit: Emit,
              skip_reference: bool = False, overrides: numerics.Overrides | None = None) -> None:
    import torch

    backend = device.backend_label()
    phases = tuple(getattr(opts, "phases", ("inference",)))
    rows = {m: base_row(entry, m, opts, backend) for m in modes}

    def finish_all(status: str, **fields) -> None:
        for ph in phases:
            for m in modes:
                emit("row", {**(rows[m] if ph == "inference" else base_row(entry, m, opts, backend, ph)),
                             "status": status, **fields})

    tol = numerics.tolerance_for(entry.id, opts.precision, model_dtype.tolerance_dtype(opts.dtype), overrides)
    if tol.skip:
        return finish_all("skipped", error_message=errors.normalise(tol.skip))
    if not getattr(entry, "available", True):
        return finish_all("not_available", error_message=errors.normalise(getattr(entry, "reason", "")))

    emit("phase", "build")
    try:
        built = entry.build(seed=opts.seed)
    except Exception as exc:  # noqa: BLE001
        return finish_all("not_available", **errors.error_fields(exc))

    dtype = _torch_dtype(opts.dtype)
    low_precision = model_dtype.is_low_precision(dtype)
    call = built.call

    def rebuild():
        return entry.build(seed=opts.seed).model

    if "inference" not in phases:  # the train phase runs its own baseline and reference: the forward's owe nothing
        if "train" in phases:
            run_train_phase(entry, built, modes, opts, device, tol, dtype if low_precision else None, rebuild, emit,
                            skip_reference, overrides)
        return None

    emit("phase", "baseline")
    base_dev = "cuda" if opts.baseline == "cuda" else None
    try:
        with torch.no_grad():
            torch.manual_seed(opts.seed)
            # a copy even on CPU: a model may keep state from its first forward as a plain attribute (Mimi's
            # codebook caches `_embed`), which `.to("tpu")` would not move; every run starts from the pristine
            # built model, as a user's freshly loaded one does
            bmodel = prepare_model(built.model, base_dev, dtype if low_precision else None, rebuild)
            with emulate.matmul_precision(opts.precision if base_dev is None else "highest"), \
                    draws.shared_draws(opts.seed) as drawn, ties.TieWatch() as tied:
                # the baseline at the backend's matmul precision: the fp64 rule stays precision-aware
                ref = to_cpu(output_tensors(call(bmodel, prepare_inputs(built.inputs, base_dev,
                                                                          dtype if low_precision else None))))
            with cpu_reference():
                uninformative = _uninformative(built, bmodel, ref, opts, base_dev, dtype if low_precision else None)
        del bmodel
    except Exception as exc:  # noqa: BLE001
        return finish_all("baseline_fail", **errors.error_fields(exc))

    fp64, ref_error = None, ""
    if not skip_reference:
        emit("phase", "reference")
        try:
            with torch.no_grad():
                torch.manual_seed(opts.seed)
                f64 = model_dtype.float64_reference(dtype)  # float8 runs keep their float8 weights
                rmodel = prepare_model(built.model, None, f64, rebuild)
                with cpu_reference(), draws.shared_draws(opts.seed), float64_ops.kernels():
                    fp64 = to_cpu(output_tensors(call(rmodel, prepare_inputs(built.inputs, None, f64))))
            del rmodel
        except Exception as exc:  # noqa: BLE001  (no fp64 reference: allclose alone decides)
            fp64, ref_error = None, raised_note(exc)
    # a reference that does not agree with the baseline to within its noise (another random draw, another
    # code path in float64) compares nothing: the row is judged without it, and says so
    tol = replace(tol, tie_sizes=frozenset(tied.sizes))
    ref_ok, ref_why = numerics.reference_valid(ref, fp64, tol) if fp64 is not None else (False, "")
    reference = "valid" if ref_ok else (f"none{ref_error}" if fp64 is None else f"invalid: {ref_why}")
    # a reference refused only because the baseline's own rounding is far from it still says how far tpu may be
    noisy_fp64 = fp64 if not ref_ok and "rmse(fp64, cpu)" in ref_why else None
    fp64 = fp64 if ref_ok else None
    for m in modes:
        rows[m].update(reference=errors.normalise(reference), uninformative=uninformative, drew=drawn.summary(),
                       ties=tied.summary())

    single: dict = {}  # the single-device outputs by mode, for the tensor-parallel rows
    for mode in (modes if "inference" in phases else ()):
        emit("phase", mode)
        if mode in tensor_parallel.TP_MODES:  # its own runs, control and cause (harness/sweep/tensor_parallel.py)
            low = dtype if low_precision else None
            emit("row", {**rows[mode], **tensor_parallel.run_tp_mode(
                mode, built, ref, fp64, lambda: single.get("eager") or _single_output(built, opts, device, low, rebuild),
                opts, tol, bool(drawn.drew), entry.id)})
            continue
        row = {**rows[mode], **run_mode(mode, built, ref, fp64, opts, device, tol, dtype if low_precision else None,
                                        rebuild, noisy_fp64, drew=bool(drawn.drew), keep=single)}
        if getattr(opts, "diagnose", False) and opts.device == "tpu" and row.get("status") in DIAGNOSED:
            emit("phase", mode)  # a fresh --timeout budget for the diagnosis (about 3 runs of the entry)
            row.update(diagnose(entry, built, mode, opts, ref, fp64, overrides))
        emit("row", row)
        if row.get("status") in control.CONTROLLED:
            # after the row is sent: a control that kills the worker costs the cause, never the row
            emit("phase", "control")
            emit("cause", {"mode": mode, **control.attribute(mode, built, opts, dtype if low_precision else None,
                                                             rebuild, lambda: _baseline_context(opts, bool(drawn.drew)))})
        elif row.get("status") in control.ACCURACY_CONTROLLED and mode == "compiled":
            emit("phase", "control")
            cause = control.attribute_accuracy(
                mode, built, opts.seed, lambda out: _rule_fails(ref, out, fp64, tol),
                dtype if low_precision else None, rebuild,
                lambda: _baseline_context(opts, bool(drawn.drew)))
            if cause:
                emit("cause", {"mode": mode, **cause})
    if "train" in phases:
        run_train_phase(entry, built, modes, opts, device, tol, dtype if low_precision else None, rebuild, emit,
                        skip_reference, overrides)


def _single_output(built, opts: SweepOptions, device: Device, dtype, rebuild: Callable) -> dict | None:
    """The single-device eager outputs when no eager row ran (None if that run raises)."""
    import torch

    try:
        model = prepare_model(built.model, device.name, dtype, rebuild)
        with torch.no_grad(), backend_phase():
            torch.manual_seed(opts.seed)
            return to_cpu(output_tensors(built.call(model, prepare_inputs(built.inputs, device.name, dtype))))
    except Exception:  # noqa: BLE001  (the tensor-parallel row is then compared with CPU only, and says so)
        return None


def _rule_fails(ref: dict, out: dict, fp64: dict | None, tol: numerics.Tolerance) -> str:
    """'' when `out` passes the numerics rule against the baseline `ref`, else the rule's reason."""
    cmp = numerics.compare_outputs(ref, to_cpu(out), fp64, tol, tol.tie_sizes)
    return "" if cmp.match else (cmp.reason or "fails")


def _baseline_context(opts: SweepOptions, drew: bool = True):
    """What the CPU baseline ran inside: its matmul precision and, for a model that draws, the shared draws (a
    control compared with it must draw the same numbers, and trace through the same mode as the mode did)."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(emulate.matmul_precision(opts.precision))
    stack.enter_context(_draws(opts.seed, drew))
    return stack


def _draws(seed: int, drew: bool):
    """The shared draws for a model whose baseline drew, else nothing: the mode is a TorchFunctionMode, and
    Dynamo tracing through one fails on NumPy arithmetic in a forward (LightGlue's layer thresholds, VITS's
    spline constant: "'ndarray' object has no attribute 'sub'"), so a model that draws nothing runs without it."""
    import contextlib

    return draws.shared_draws(seed) if drew else contextlib.nullcontext()


def raised_note(exc: BaseException, stage: str = "") -> str:
    """What a float64 reference run raised, for the rows' `reference` column ("none: the float64 run raised
    ..."): such rows are judged by allclose alone, and the note says what to make float64-clean."""
    f = errors.error_fields(exc)
    return f": the float64 run raised{' at ' + stage if stage else ''}: {f['error_type']}: {f['error_message']}"


def run_train_phase(entry, built, modes: tuple[str, ...], opts: SweepOptions, device: Device,
                    tol: numerics.Tolerance, dtype, rebuild: Callable, emit: Emit, skip_reference: bool,
                    overrides: numerics.Overrides | None = None) -> None:
    """The train rows (harness/sweep/train.py): CPU baseline and float64 reference steps, then each mode."""
    import torch

    backend = device.backend_label()
    base = {m: base_row(entry, m, opts, backend, "train") for m in modes}
    why = train.not_trainable(built.model)
    if why:  # not the backend's business: out of the denominators
        for m in modes:
            emit("row", {**base[m], "status": "skipped", "error_message": errors.normalise(why)})
        return
    emit("phase", "train-baseline")
    fp64, null, ref_error = None, [], ""

    def reference(step1: dict) -> list[str]:
        """Run between the baseline's step-1 backward and its optimizer step: the float64 reference, whose own
        step 1 names the null gradients (train.null_gradients) that neither run then steps."""
        nonlocal fp64, null, ref_error
        if skip_reference:
            return []
        emit("phase", "train-reference")

        def nulls(step1_64: dict) -> list[str]:
            nonlocal null
            null = train.null_gradients(step1, step1_64)
            return null
        try:
            with cpu_reference(), float64_ops.kernels():
                fp64 = train.run_steps(built, entry, None, opts.train_steps, torch.float64, opts.seed, rebuild,
                                       exclude=tol.data_dependent, freeze=nulls)["tensors"]
        except train.StepError as err:
            # no reference: nothing is known null, and the baseline steps every parameter
            fp64, null, ref_error = None, [], raised_note(err.exc, err.stage)
        emit("phase", "train-baseline")
        return null

    try:
        ref = train.run_steps(built, entry, None, opts.train_steps, dtype, opts.seed, rebuild,
                              context=lambda: emulate.matmul_precision(opts.precision),
                              exclude=tol.data_dependent, freeze=reference)["tensors"]
    except train.StepError as err:
        for m in modes:
            emit("row", {**base[m], "status": "baseline_fail", **errors.error_fields(err.exc), "failed_at": err.stage,
                         "error_message": errors.normalise(f"{err.stage} (cpu): {err.exc}")})
        return
    # null gradients are float32 noise on both sides: not compared, and frozen in every run (train.py)
    ref, fp64 = train.without(ref, null), train.without(fp64, null)
    ref_tol = replace(tol, reference=tol.reference * train.REFERENCE_FACTOR)
    # the baseline's final weights as far from float64 as Adam makes of its gradients' rounding do not make
    # the reference invalid (harness/sweep/train_weights.py)
    base_w = (train_weights.shrink(ref, fp64, train_weights.allowances(ref, fp64, tol, opts.train_steps, train.LR))
              if fp64 is not None else ref)
    ref_ok, ref_why = numerics.reference_valid(base_w, fp64, ref_tol) if fp64 is not None else (False, "")
    reference = "valid" if ref_ok else (f"none{ref_error}" if fp64 is None else f"invalid: {ref_why}")
    # refused only for the baseline's own distance from it (a gradient with heavy cancellation): it still
    # tells whether tpu is as near the truth as CPU (numerics.rounding_dominated), as for the forward
    noisy_fp64 = fp64 if not ref_ok and "rmse(fp64, cpu)" in ref_why else None
    fp64 = fp64 if ref_ok else None
    second: dict = {}

    def spread(mode: str, i: int = 0) -> dict | None:
        """float32's second sample (train.nudged), run once for the first row the rule fails, in its own phase
        (and --timeout budget): tpu is then judged against float32's spread (train.run_train)."""
        if i not in second:  # the i-th sample (train_spread.NUDGE_SEEDS): a row near its bound asks for more
            emit("phase", "train-spread")
            second[i] = train.nudged(built, entry, opts, dtype, rebuild,
                                     lambda: emulate.matmul_precision(opts.precision), tol.data_dependent, null,
                                     train_spread.sample_seed(i))
            emit("phase", f"train-{mode}")
        return second[i]
    allow = train_weights.allowances(ref, fp64, tol, opts.train_steps, train.LR)
    for mode in modes:
        emit("phase", f"train-{mode}")
        row = {**base[mode], "reference": errors.normalise(reference),
               **train.run_train(mode, built, entry, ref, fp64, opts, device, tol, dtype, rebuild, _eager_mode,
                                 null, allow, noisy_fp64, lambda i, mode=mode: spread(mode, i))}
        if getattr(opts, "diagnose", False) and opts.device == "tpu" and row.get("status") in DIAGNOSED:
            emit("phase", f"train-{mode}")  # a fresh --timeout budget for the diagnosis
            from harness.diagnose.train import diagnose_train_row

            row.update(diagnose_train_row(entry, built, mode, opts, overrides))
        emit("row", row)
        if row.get("status") in control.CONTROLLED:
            emit("phase", "control")
            cause = (train_control.run_control(built, entry, opts, dtype, rebuild, tol.data_dependent)
                     if mode == "compiled" else {"cause": "backend", "control_error": ""})
            emit("cause", {"mode": mode, "phase": "train", **cause})
        elif row.get("status") in control.ACCURACY_CONTROLLED and mode == "compiled":
            emit("phase", "control")
            cause = train_control.attribute_accuracy(built, entry, opts, ref, fp64, tol, dtype, rebuild, null,
                                                     allow, noisy_fp64, lambda i: spread("compiled", i))
            if cause:
                emit("cause", {"mode": mode, "phase": "train", **cause})


DIAGNOSED = ("fail_accuracy", "fail_to_run", "compile_fail")

compile_for_sweep = compile_call  # the older name
_during_compile = during_compile

def _uninformative(built, bmodel, ref: dict, opts: SweepOptions, device, dtype) -> str:
    """harness.sweep.informative on the baseline: its outputs, and the outputs for perturbed inputs."""
    import torch

    perturbed = None
    if not informative.uninformative(ref):  # something may carry information: does it follow the input?
        pin = informative.perturb_inputs(built.inputs, opts.seed)
        if pin is not None:
            try:
                torch.manual_seed(opts.seed)
                with draws.shared_draws(opts.seed):
                    perturbed = to_cpu(output_tensors(built.call(bmodel, prepare_inputs(pin, device, dtype))))
            except Exception:  # noqa: BLE001  (perturbed inputs the model refuses: no evidence either way)
                perturbed = None
    return informative.uninformative(ref, perturbed)


def diagnose(entry, built, mode: str, opts: SweepOptions, ref: dict, fp64: dict | None, overrides) -> dict:
    """`--diagnose`: located_module, located_op and repro_path for a failing row (harness.diagnose; never raises)."""
    try:
        from harness.diagnose import diagnose_row
    except ImportError:
        return {}
    return diagnose_row(entry, built, mode, opts, ref=ref, fp64=fp64, overrides=overrides)


def run_mode(mode: str, built, ref: dict, fp64: dict | None, opts: SweepOptions, device: Device,
             tol: numerics.Tolerance, dtype=None, rebuild: Callable | None = None,
             noisy_fp64: dict | None = None, drew: bool = True, keep: dict | None = None) -> dict:
    """One mode's row. `drew`: the baseline's forward drew random numbers, so this mode runs inside the shared
    draws too (harness/sweep/draws.py); else outside them (`_draws`). `keep`: gets keep[mode] = the outputs."""
    import torch

    device.reset_stats()
    device.set_precision(opts.precision)
    perf.reset_peak_rss()
    start = time.perf_counter()
    row: dict = {}
    phase = "run"
    try:
        model = prepare_model(built.model, device.name, dtype, rebuild)
        fn = built.call
        if mode == "compiled":
            import torch._dynamo

            torch._dynamo.reset()  # `call` is shared by all entries: no guards or cache carried over
            fn = compile_call(built.call, model, device.compile_backend)
        with torch.no_grad(), backend_phase(), _eager_mode(mode, device):
            torch.manual_seed(opts.seed)
            phase = "first"
            t0 = time.perf_counter()
            with _draws(opts.seed, drew):
                res = to_cpu(output_tensors(fn(model, prepare_inputs(built.inputs, device.name, dtype))))
            first = time.perf_counter() - t0
            if keep is not None:
                keep[mode] = res
            counts = [device.stats().get("compilations")]
            n = opts.repeats if first < 2.0 else (1 if first < 60.0 or mode == "compiled" else 0)
            times = []
            phase = "steady"
            for _ in range(n):
                inputs = prepare_inputs(built.inputs, device.name, dtype)
                torch.manual_seed(opts.seed)
                t0 = time.perf_counter()
                with _draws(opts.seed, drew):
                    again = to_cpu(output_tensors(fn(model, inputs)))
                times.append(time.perf_counter() - t0)
                counts.append(device.stats().get("compilations"))
                if not row.get("nondeterministic"):
                    row["nondeterministic"] = errors.normalise(informative.first_difference(res, again))
        warmup = perf.warmup_steps(counts)
        row.update(perf.time_fields([first, *times], warmup))
        row.update(perf.perf_fields(counts, warmup))
        if mode == "compiled" and times:
            row["compile_s"] = max(0.0, first - row["run_s"])
        cmp = numerics.compare_outputs(ref, res, fp64, tol, tol.tie_sizes)
        row.update(cmp.metrics())
        dominated = "" if cmp.match else numerics.rounding_dominated(ref, res, noisy_fp64, tol)
        row["status"] = "pass" if cmp.match or dominated else "fail_accuracy"
        if dominated:
            row["uninformative"] = errors.normalise(dominated)  # judged by no rule: out of the denominators
        elif not cmp.match:
            row["error_type"] = "AccuracyError"
            row["error_message"] = errors.normalise(cmp.reason)
        elif cmp.notes:
            row["error_message"] = errors.normalise(cmp.notes)  # what the rule tolerated, e.g. threshold flips
        if cmp.match and getattr(opts, "canary", None):
            phase = "canary"
            row["canary"] = run_canary(mode, built, ref, fp64, res, opts, device, tol, dtype, rebuild)
    except Exception as exc:  # noqa: BLE001
        row.update(status=failure_status(exc, mode, phase == "first"), **errors.error_fields(exc))
    stats = device.stats()
    row["compilations"] = stats.get("compilations")
    row["graph_breaks"] = stats.get("graph_breaks")
    row["fallback_ops"] = ";".join(f"{k}:{v}" for k, v in sorted((stats.get("fallback_ops") or {}).items()))
    row.setdefault("peak_rss_mb", perf.peak_rss_mb())
    row["wall_s"] = time.perf_counter() - start
    return row


def _eager_mode(mode: str, device: Device):
    """Fused mode: hf_tpu's deferred-and-fused eager mode around the runs (Strict eager otherwise)."""
    if mode == "fused" and device.name == "tpu":
        import hf_tpu

        return hf_tpu.defer_and_fuse()
    return contextlib.nullcontext()


def run_canary(mode: str, built, ref: dict, fp64: dict | None, clean: dict, opts: SweepOptions, device: Device,
               tol: numerics.Tolerance, dtype=None, rebuild: Callable | None = None) -> str:
    """`--canary`: the mode once more with opts.canary's fault injected into the backend (harness.sweep.canary).
    Returns "caught | missed | untouched (fault, rel rmse ...)" or "error (...)" when the faulty run raised."""
    from harness.sweep import canary

    fault = canary.parse_fault(opts.canary)
    text = _canary_once(fault, mode, built, ref, fp64, clean, opts, device, tol, dtype, rebuild)
    if text.startswith("untouched") and fault.family != "all":
        # why untouched: no op of the family on the output's path; say whether a matmul-or-conv fault is seen
        wider = canary.Fault("all", fault.factor)
        text += f"; {wider}: " + _canary_once(wider, mode, built, ref, fp64, clean, opts, device, tol, dtype,
                                              rebuild).split(" (")[0]
    return text


def _canary_once(fault, mode: str, built, ref: dict, fp64: dict | None, clean: dict, opts: SweepOptions,
                 device: Device, tol: numerics.Tolerance, dtype=None, rebuild: Callable | None = None) -> str:
    import torch

    from harness.sweep import canary

    try:
        with canary.inject(fault):
            model = prepare_model(built.model, device.name, dtype, rebuild)
            fn = built.call
            if mode == "compiled":
                import torch._dynamo

                torch._dynamo.reset()  # trace again: the fault must be in the compiled program
                fn = compile_for_sweep(built.call, model, device.compile_backend)
            with torch.no_grad(), backend_phase():
                torch.manual_seed(opts.seed)
                with draws.shared_draws(opts.seed):
                    faulty = to_cpu(output_tensors(fn(model, prepare_inputs(built.inputs, device.name, dtype))))
        if mode == "compiled":
            torch._dynamo.reset()  # no faulty program is reused by a later entry
    except Exception as exc:  # noqa: BLE001
        return errors.normalise(f"error ({fault}: {type(exc).__name__}: {exc})")
    cmp = numerics.compare_outputs(ref, faulty, fp64, tol, tol.tie_sizes)
    outcome = canary.outcome(cmp.match, faulty, clean)
    return f"{outcome} ({fault}, rel rmse {cmp.rel_rmse:.3g}, rmse ratio {cmp.rmse_ratio:.3g})"
