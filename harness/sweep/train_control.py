"""The train rows' control (harness/sweep/control.py holds the inference rows' and explains `cause`): the same
training steps compiled with `torch.compile(backend="aot_eager")` on CPU, Dynamo and AOTAutograd as the compiled
mode uses them with no backend compiler.

- A compiled row that fails to run or compile (`run_control`): upstream when the control fails too.
- A compiled fail_accuracy row (`attribute_accuracy`): the control's tensors are judged by the row's own rule
  (train.judge) against the same CPU baseline. Where the model computes something else while Dynamo traces it,
  no backend can match the eager baseline and the row is `upstream`: Aimv2Model's text model (its causal mask
  is dropped in eager, where SDPA then runs with the module's is_causal=False, and kept under tracing: loss
  0.18 x scale off on CPU with aot_eager as on tpu) and ColPaliForRetrieval (PaliGemma's prefix attention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core import errors
from harness.sweep import emulate, numerics, train
from harness.sweep.control import CONTROL_BACKEND


def _reset_dynamo() -> None:
    import torch._dynamo

    torch._dynamo.reset()  # no guards or graphs of the control left for the next entry's compiled run


def run_control(built: Any, entry: Any, opts: Any, dtype: Any = None, rebuild: Callable | None = None,
                exclude: tuple[str, ...] = ()) -> dict:
    """{"cause", "control_error"} for a compiled train row that failed to run: upstream when the control's steps
    raise too."""
    try:
        train.run_steps(built, entry, None, getattr(opts, "train_steps", 3), dtype, opts.seed, rebuild,
                        CONTROL_BACKEND, exclude=exclude)
    except train.StepError as err:
        f = errors.error_fields(err.exc)
        return {"cause": "upstream",
                "control_error": errors.normalise(f"{err.stage}: {f['error_type']}: {f['error_message']}")}
    finally:
        _reset_dynamo()
    return {"cause": "backend", "control_error": ""}


def attribute_accuracy(built: Any, entry: Any, opts: Any, ref: dict, fp64: dict | None, tol: numerics.Tolerance,
                       dtype: Any = None, rebuild: Callable | None = None, null: list[str] = (),
                       allow: dict | None = None, noisy_fp64: dict | None = None,
                       spread: dict | Callable[[int], dict | None] | None = None) -> dict:
    """{"cause", "control_error"} for a compiled fail_accuracy train row, from the control's steps run as the CPU
    baseline's (its matmul precision, the null parameters frozen) and judged as the row was (run_train's
    arguments). upstream when the control fails the rule too, backend when it passes; {} when the control
    raises (no evidence either way)."""
    steps = getattr(opts, "train_steps", 3)
    try:
        got = train.run_steps(built, entry, None, steps, dtype, opts.seed, rebuild, CONTROL_BACKEND,
                              context=lambda: emulate.matmul_precision(opts.precision),
                              exclude=tol.data_dependent, freeze=null)
    except train.StepError:
        return {}
    finally:
        _reset_dynamo()
    cmp, dominated = train.judge(ref, train.without(got["tensors"], list(null)), fp64, tol, allow, noisy_fp64,
                                 spread, steps)
    if cmp.match or dominated:
        return {"cause": "backend", "control_error": ""}
    return {"cause": "upstream", "control_error": errors.normalise(f"aot_eager on CPU fails the rule too: {cmp.reason}")}
