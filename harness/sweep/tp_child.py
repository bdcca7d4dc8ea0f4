"""One rank of a tensor-parallel row (harness/sweep/tensor_parallel.py): `python -m harness.sweep.tp_child DIR`.

Run by the sweep's worker once per rank with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). It does what a user's script under `torchrun` does: no process group of its own,
`from_pretrained(DIR/model, tp_plan="auto")` starts it with the device's default backend (tpu_dist on tpu, gloo
on CPU) and splits the model with Transformers' own plan; then the entry's call on the entry's inputs. Writes
`out<RANK>.pt` (the output tensors on CPU) and `rank<RANK>.json` (what was sharded, or the error).

HF_TPU_SWEEP_TP_FAULT=FACTOR (a test hook, as the canary's faults): every `torch.distributed.all_reduce` result
is multiplied by FACTOR, a wrong collective the numerics rule must catch.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path

FAULT_ENV = "HF_TPU_SWEEP_TP_FAULT"


def _die_with_parent() -> None:
    """Linux: the kernel kills this rank when its worker dies (a rank left waiting in a collective would
    otherwise hang for ever)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def _inject_fault(factor: float) -> None:
    """Scale every all_reduce result: Transformers' rowwise layers reduce their partial sums with
    `dist.all_reduce` on the inference path (transformers/distributed/tensor_parallel.py)."""
    import torch.distributed as dist

    real = dist.all_reduce

    def wrong_all_reduce(tensor, *args, **kwargs):
        work = real(tensor, *args, **kwargs)
        tensor.mul_(factor)
        return work

    dist.all_reduce = wrong_all_reduce


def _model_class(spec: dict):
    obj = importlib.import_module(spec["module"])
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def run_rank(workdir: Path, spec: dict) -> tuple[dict, dict]:
    """(output tensors on CPU, facts about the split model) for this rank."""
    import torch

    from harness.entry_calls import output_tensors, prepare_inputs, to_cpu
    from harness.sweep import draws

    on_cpu = spec["device"] == "cpu" or os.environ.get("HF_TPU_DISABLE") == "1"  # the control runs on CPU
    if not on_cpu:
        import hf_tpu

        hf_tpu.set_matmul_precision(spec["precision"])
        if os.environ.get(FAULT_ENV):  # a fault of the device's collectives: the CPU control has none
            _inject_fault(float(os.environ[FAULT_ENV]))
    cls = _model_class(spec)
    model = cls.from_pretrained(workdir / "model", tp_plan="auto", dtype=getattr(torch, spec["dtype"]))
    model.eval()
    saved = torch.load(workdir / "call.pt", weights_only=False)
    inputs = prepare_inputs(saved["inputs"], str(model.device), None)
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    facts = {"device": str(model.device), "parameters": len(params),
             "sharded": sum(isinstance(p, DTensor) for p in params)}
    with torch.no_grad():
        torch.manual_seed(spec["seed"])
        ctx = draws.shared_draws(spec["seed"]) if spec.get("drew") else _null()
        with ctx:
            out = to_cpu(output_tensors(saved["call"](model, inputs)))
    return out, facts


def _null():
    import contextlib

    return contextlib.nullcontext()


def main(workdir: Path) -> int:
    _die_with_parent()
    rank = int(os.environ["RANK"])
    spec = json.loads((workdir / "spec.json").read_text())
    if spec.get("dump_after"):  # where a rank is when the worker's deadline nears (a hang in a collective)
        import faulthandler

        faulthandler.dump_traceback_later(spec["dump_after"], exit=False)
    try:
        out, facts = run_rank(workdir, spec)
        import torch

        torch.save(out, workdir / f"out{rank}.pt")
        (workdir / f"rank{rank}.json").write_text(json.dumps({"ok": True, **facts}))
        return 0
    except BaseException as exc:  # noqa: BLE001  (the worker classifies it)
        (workdir / f"rank{rank}.json").write_text(json.dumps({
            "ok": False, "error_type": type(exc).__name__, "error_message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:]}))
        return 1
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    os._exit(code)  # no process-group teardown: the other rank may be gone already
