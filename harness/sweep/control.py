"""Attribution of a failing row (`cause`): does PyTorch's own reference path run the entry where the backend
failed? Compiled mode: the same entry with `torch.compile(backend="aot_eager")` on CPU (Dynamo and
AOTAutograd as the backend uses them, no backend compiler). Eager mode: the CPU baseline is the control, and it
ran (else the row would be baseline_fail).

    backend   the control works: the failure is the backend's
    upstream  the control fails too (a Dynamo limitation or a model bug no backend can fix); control_error says
              how, so that a reader can tell whether it failed the same way
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core import errors
from harness.entry_calls import compile_call, output_tensors, prepare_inputs, prepare_model

CONTROLLED = ("compile_fail", "fail_to_run")
CAUSES = ("backend", "upstream")
CONTROL_BACKEND = "aot_eager"


def attribute(mode: str, built: Any, opts: Any, dtype: Any = None, rebuild: Callable | None = None) -> dict:
    """{"cause": backend | upstream, "control_error": "" or "Type: message"} for a failing row of `mode`."""
    if mode != "compiled":
        return {"cause": "backend", "control_error": ""}
    exc = run_control(built, opts.seed, dtype, rebuild)
    if exc is None:
        return {"cause": "backend", "control_error": ""}
    f = errors.error_fields(exc)
    return {"cause": "upstream", "control_error": errors.normalise(f"{f['error_type']}: {f['error_message']}")}


def run_control(built: Any, seed: int = 0, dtype: Any = None, rebuild: Callable | None = None) -> BaseException | None:
    """Run the entry compiled with aot_eager on CPU, as the compiled mode runs it; the exception, or None."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()  # no guards or cached graphs of the backend's run carried over
    try:
        model = prepare_model(built.model, None, dtype, rebuild)
        fn = compile_call(built.call, model, CONTROL_BACKEND)
        with torch.no_grad():
            torch.manual_seed(seed)
            output_tensors(fn(model, prepare_inputs(built.inputs, None, dtype)))
    except Exception as exc:  # noqa: BLE001
        return exc
    finally:
        torch._dynamo.reset()
    return None
