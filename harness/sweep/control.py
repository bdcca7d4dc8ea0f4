"""Attribution of a failing row (`cause`): does PyTorch's own reference path run the entry where the backend
failed? Compiled mode: the same entry with `torch.compile(backend="aot_eager")` on CPU (Dynamo and
AOTAutograd as the backend uses them, no backend compiler). Eager mode: the CPU baseline is the control, and it
ran (else the row would be baseline_fail).

    backend   the control works: the failure is the backend's
    upstream  the control fails too (a Dynamo limitation or a model bug no backend can fix); control_error says
              how, so that a reader can tell whether it failed the same way

A compiled `fail_accuracy` row gets the same control, judged by the numerics rule: the control's outputs are
compared with the CPU baseline exactly as the backend's were. Where the model computes something else under
torch.compile on CPU too (a mask built one way in eager and another under tracing: Aimv2's text model,
PaliGemma's prefix attention), no backend could match the eager baseline, and the row is `upstream` with
control_error "aot_eager on CPU fails the rule too: ...". An eager row's control is the baseline itself: its
cause stays '' (a tie order or a threshold flip is told apart by the verdict columns, not by a control).
The train rows' control (the same training steps with aot_eager on CPU) is harness/sweep/train_control.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core import errors
from harness.entry_calls import compile_call, output_tensors, prepare_inputs, prepare_model

CONTROLLED = ("compile_fail", "fail_to_run")
ACCURACY_CONTROLLED = ("fail_accuracy",)  # compiled rows only: see attribute_accuracy
CAUSES = ("backend", "upstream")
CONTROL_BACKEND = "aot_eager"


def attribute(mode: str, built: Any, opts: Any, dtype: Any = None, rebuild: Callable | None = None,
              context: Callable[[], Any] | None = None) -> dict:
    """{"cause": backend | upstream, "control_error": "" or "Type: message"} for a failing row of `mode`.
    `context()`: what the mode ran inside (the shared draws: a TorchFunctionMode Dynamo traces through, so the
    control must trace through it too, as VITS's NumPy arithmetic shows)."""
    if mode != "compiled":
        return {"cause": "backend", "control_error": ""}
    exc = run_control(built, opts.seed, dtype, rebuild, context)
    if exc is None:
        return {"cause": "backend", "control_error": ""}
    f = errors.error_fields(exc)
    return {"cause": "upstream", "control_error": errors.normalise(f"{f['error_type']}: {f['error_message']}")}


def run_control(built: Any, seed: int = 0, dtype: Any = None, rebuild: Callable | None = None,
                context: Callable[[], Any] | None = None) -> BaseException | None:
    """Run the entry compiled with aot_eager on CPU, as the compiled mode runs it; the exception, or None."""
    out = control_outputs(built, seed, dtype, rebuild, context)
    return out if isinstance(out, BaseException) else None


def control_outputs(built: Any, seed: int = 0, dtype: Any = None, rebuild: Callable | None = None,
                    context: Callable[[], Any] | None = None) -> dict | BaseException:
    """The entry's output tensors compiled with aot_eager on CPU (inside `context()` when given: the baseline's
    shared draws), or the exception it raised."""
    import contextlib

    import torch
    import torch._dynamo

    torch._dynamo.reset()  # no guards or cached graphs of the backend's run carried over
    try:
        model = prepare_model(built.model, None, dtype, rebuild)
        fn = compile_call(built.call, model, CONTROL_BACKEND)
        with torch.no_grad(), (context() if context else contextlib.nullcontext()):
            torch.manual_seed(seed)
            return output_tensors(fn(model, prepare_inputs(built.inputs, None, dtype)))
    except Exception as exc:  # noqa: BLE001
        return exc
    finally:
        torch._dynamo.reset()


def attribute_accuracy(mode: str, built: Any, seed: int, judge: Callable[[dict], str], dtype: Any = None,
                       rebuild: Callable | None = None, context: Callable[[], Any] | None = None) -> dict:
    """{"cause", "control_error"} for a fail_accuracy row of `mode`: compiled rows run the aot_eager control and
    `judge` it (the numerics rule against the CPU baseline: '' when it passes, else why not). upstream when the
    control fails the rule too, backend when it passes; {} for eager rows and for a control that raised (no
    evidence either way)."""
    if mode != "compiled":
        return {}
    out = control_outputs(built, seed, dtype, rebuild, context)
    if isinstance(out, BaseException):
        return {}
    why = judge(out)
    if not why:
        return {"cause": "backend", "control_error": ""}
    return {"cause": "upstream", "control_error": errors.normalise(f"aot_eager on CPU fails the rule too: {why}")}
