"""Tensor-parallel rows (mode `tp2`, `hf-tpu sweep --tp 2`): the entry's model split over 2 ranks by
Transformers' own plan, its logits compared with the CPU baseline and with the single-device tpu run.

For each entry the worker saves the built model (`save_pretrained`) and its inputs and call to a temporary
directory, then starts 2 rank processes (harness/sweep/tp_child.py) with torchrun's environment; each loads
the model with `from_pretrained(tp_plan="auto")`, as a user's script under `torchrun --nproc_per_node=2` does
(each rank its own process and its own `tpu:0`; the collectives go through `tpu_dist`). Every rank's logits
must pass the numerics rule (harness/sweep/numerics.py) against the CPU float32 baseline (with the float64
reference when valid) and against the entry's single-device tpu eager output.

Only the logits are compared: the other outputs of a split model differ by design (its key/value cache holds
each rank's own heads). A model whose config has no `base_model_tp_plan` cannot be split this way: its row is
`skipped` with a message starting NOT_APPLICABLE, counted apart (summary()). A row that fails has its cause
from a control, the same 2-rank run on CPU with gloo (HF_TPU_DISABLE=1): `upstream` when the control fails
too (Transformers' plan does not work for this model), `backend` when only tpu fails, none when the control
ran out of time as well (control_error says so).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core import errors
from harness.sweep import numerics

TP_MODES = {"tp2": 2}  # mode -> ranks
NOT_APPLICABLE = "not applicable"
COMPARED = ("logits",)
_REPO = Path(__file__).resolve().parents[2]  # so that the ranks import this harness, whatever their cwd


def ranks(mode: str) -> int:
    return TP_MODES[mode]


def not_applicable(model: Any, dtype: str) -> str:
    """Why this model cannot run tensor-parallel with Transformers' plan ('' when it can)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "save_pretrained"):
        return f"{NOT_APPLICABLE}: {type(model).__name__} is not a Transformers model (no tp_plan)"
    if not getattr(config, "base_model_tp_plan", None):
        return f"{NOT_APPLICABLE}: no tensor-parallel plan ({type(config).__name__}.base_model_tp_plan is empty)"
    if dtype not in ("float32", "bfloat16", "float16"):
        return f"{NOT_APPLICABLE}: dtype {dtype} (float8 storage) is not loaded by from_pretrained(tp_plan=...)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailure(Exception):
    """A rank failed: `status` is fail_to_run, timeout or crash; the error columns say how."""

    def __init__(self, status: str, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def launch(workdir: Path, n: int, timeout: float, device: str = "tpu") -> tuple[list[dict], list[dict]]:
    """Run n ranks of tp_child on `workdir`; (each rank's output tensors, each rank's facts). Raises
    RankFailure. A rank that fails ends the others (they would wait in a collective until the timeout)."""
    import torch

    env = {**os.environ, "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)}
    if device == "cpu":
        env["HF_TPU_DISABLE"] = "1"  # the control: Transformers' own TP on CPU with gloo
    procs = []
    for r in range(n):
        log = open(workdir / f"rank{r}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "harness.sweep.tp_child", str(workdir)],
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=str(_REPO),
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                where = "; ".join(f"rank {r} at {w}" for r in range(n)
                                  if (w := stuck_at((workdir / f"rank{r}.log").read_text())))
                raise RankFailure("timeout", "Timeout", f"{n} ranks did not finish in {timeout:.0f} s"
                                  + (f" ({where})" if where else ""))
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    facts = []
    for r, p in enumerate(procs):
        f = workdir / f"rank{r}.json"
        info = json.loads(f.read_text()) if f.exists() else None
        if info is None or not info.get("ok"):
            if info is not None:
                raise RankFailure("fail_to_run", info["error_type"], f"rank {r}: {info['error_message']}")
            if p.returncode in (None, -9) and any(q.returncode not in (None, 0, -9) for q in procs):
                continue  # ended by us after another rank failed: that rank's error is the row's
            tail = (workdir / f"rank{r}.log").read_text()[-300:]
            raise RankFailure("crash", f"exit code {p.returncode}", f"rank {r} died: {tail}")
        facts.append(info)
    return [torch.load(workdir / f"out{r}.pt") for r in range(n)], facts


def stuck_at(log: str, frames: int = 3) -> str:
    """Where a rank was in its last faulthandler dump (tp_child's dump_after): the innermost `frames` frames of
    its main thread, 'func (file:line) < ...', then those of any other thread inside Transformers or hf_tpu
    (the loader's threads); '' without a dump."""
    dump = log.rsplit("Timeout (", 1)
    if len(dump) < 2:
        return ""
    main, others = "", []
    for block in dump[1].split("\nThread ")[1:] or dump[1:]:
        lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        calls = []
        for ln in lines[:frames]:  # File "/path/x.py", line 12 in func
            path, _, rest = ln[len('File "'):].partition('", line ')
            line, _, func = rest.partition(" in ")
            calls.append(f"{func} ({Path(path).name}:{line})")
        if any("tp_child.py" in ln for ln in lines):
            main = " < ".join(calls)
        elif any("/hf_tpu/" in ln or "/transformers/" in ln for ln in lines[:frames]):
            others.append("thread " + " < ".join(calls))
    return "; ".join(x for x in (main, *others) if x)


def _only(tensors: dict | None) -> dict | None:
    """The compared outputs: the logits when the model returns them, else every output."""
    if tensors is None:
        return None
    kept = {k: v for k, v in tensors.items() if k in COMPARED}
    return kept or tensors


def judge(ref: dict, single: dict | None, outs: list[dict], fp64: dict | None,
          tol: numerics.Tolerance) -> dict:
    """The row fields for the ranks' outputs `outs`: pass when every rank's logits pass the numerics rule
    against the CPU baseline `ref` and against the single-device tpu output `single` (None: not available, the
    message says so); the metric columns are the CPU comparison's, of the worst rank."""
    ref, single, fp64 = _only(ref), _only(single), _only(fp64)
    worst, problems, notes = None, [], []
    for r, out in enumerate(outs):
        out = {k: v for k, v in out.items() if k in ref}
        cpu = numerics.compare_outputs(ref, out, fp64, tol, tol.tie_sizes)
        if worst is None or (not cpu.match and worst.match) or (cpu.match == worst.match
                                                                and cpu.rel_rmse > worst.rel_rmse):
            worst = cpu
        if not cpu.match:
            problems.append(f"rank {r} vs cpu: {cpu.reason}")
        if single is not None:
            one = numerics.compare_outputs(single, out, fp64, tol, tol.tie_sizes)
            if not one.match:
                problems.append(f"rank {r} vs single-device tpu: {one.reason}")
            elif r == 0:
                notes.append(f"vs single-device tpu: max_abs_err {one.max_abs_err:.3g}")
    if single is None:
        notes.append("no single-device tpu output (its run failed): compared with cpu only")
    row = {**worst.metrics(), "status": "fail_accuracy" if problems else "pass"}
    if problems:
        row.update(error_type="AccuracyError", error_message=errors.normalise("; ".join(problems)))
    else:
        row["error_message"] = errors.normalise("; ".join([f"compared: {', '.join(sorted(ref))}", *notes]))
    return row


def run_tp_mode(mode: str, built: Any, ref: dict, fp64: dict | None, single: Callable[[], dict | None],
                opts: Any, tol: numerics.Tolerance, drew: bool = False, entry_id: str = "entry") -> dict:
    """One tensor-parallel row's fields (status, errors, metrics, cause, wall_s). `single()`: the entry's
    single-device tpu outputs (None when that run failed), asked for only when the model has a plan. Never
    raises."""
    start = time.perf_counter()
    why = not_applicable(built.model, opts.dtype)
    if why:
        return {"status": "skipped", "error_message": errors.normalise(why), "wall_s": time.perf_counter() - start}
    workdir = Path(tempfile.mkdtemp(prefix="hf-tpu-tp-"))
    try:
        row = _run(mode, built, ref, fp64, single(), opts, tol, drew, workdir, entry_id)
    except Exception as exc:  # noqa: BLE001  (saving the model failed: the row says so, the sweep goes on)
        row = {"status": "fail_to_run", **errors.error_fields(exc)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    row["wall_s"] = time.perf_counter() - start
    return row


def _run(mode: str, built: Any, ref: dict, fp64: dict | None, single: dict | None, opts: Any,
         tol: numerics.Tolerance, drew: bool, workdir: Path, entry_id: str) -> dict:
    import torch

    model = built.model
    model.save_pretrained(workdir / "model")
    torch.save({"inputs": built.inputs, "call": built.call}, workdir / "call.pt")
    spec = {"module": type(model).__module__, "qualname": type(model).__qualname__, "dtype": opts.dtype,
            "precision": opts.precision, "seed": opts.seed, "drew": drew, "device": opts.device,
            "dump_after": max(1.0, 0.55 * opts.timeout - 10)}
    (workdir / "spec.json").write_text(json.dumps(spec))
    # the run, then (if it fails) its control with the time left, all inside the worker's --timeout
    end = time.monotonic() + 0.9 * opts.timeout
    n = ranks(mode)
    try:
        outs, facts = launch(workdir, n, 0.55 * opts.timeout, opts.device)
    except RankFailure as err:
        row = {"status": err.status, "error_type": err.error_type, "error_message": errors.normalise(err.message)}
    else:
        row = judge(ref, single, outs, fp64, tol)
        sharded = f"{facts[0]['sharded']} of {facts[0]['parameters']} parameters sharded on {facts[0]['device']}"
        row["error_message"] = errors.normalise(f"{row.get('error_message', '')}; {sharded}".strip("; "))
    if row["status"] != "pass":
        keep_logs(workdir, n, Path(opts.out) / "tp-logs" / entry_id.replace("/", "__") if opts.out else None)
    left = end - time.monotonic()
    if row["status"] != "pass" and opts.device == "tpu" and left < 30:
        row["control_error"] = f"no control: {left:.0f} s left of --timeout"
    elif row["status"] != "pass" and opts.device == "tpu":
        row.update(control(workdir, n, left, ref, fp64, tol))
    return row


def keep_logs(workdir: Path, n: int, dest: Path | None) -> None:
    """A failing row's rank logs, kept in the run directory (<out>/tp-logs/<entry>/) before the control."""
    if dest is None:
        return
    dest.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        if (workdir / f"rank{r}.log").exists():
            shutil.copy(workdir / f"rank{r}.log", dest / f"rank{r}.log")


def control(workdir: Path, n: int, timeout: float, ref: dict, fp64: dict | None, tol: numerics.Tolerance) -> dict:
    """cause/control_error of a failing row: the same ranks on CPU with gloo, judged against the baseline."""
    for f in workdir.glob("rank*.json"):
        f.unlink()
    try:
        outs, _ = launch(workdir, n, timeout, "cpu")
    except RankFailure as err:
        if err.status == "timeout":
            # A control that did not finish says nothing about Transformers' plan: on a loaded machine the CPU
            # ranks are as slow to start as the tpu ones (Bamba's row: both ran out of time, neither hung).
            return {"cause": "", "control_error": errors.normalise(f"control did not finish: {err.message}")}
        return {"cause": "upstream", "control_error": errors.normalise(f"{err.error_type}: {err.message}")}
    got = judge(ref, None, outs, fp64, tol)
    if got["status"] != "pass":
        return {"cause": "upstream", "control_error": errors.normalise(
            f"tensor-parallel on CPU (gloo) fails the rule too: {got['error_message']}")}
    return {"cause": "backend", "control_error": ""}


def summary(df) -> dict:
    """Counts of the tensor-parallel rows of a results frame: with a plan (by status, and how many matched
    the single-device run too), and without one (not applicable)."""
    tp = df[df["mode"].isin(list(TP_MODES))]
    na = tp["status"].eq("skipped") & tp["error_message"].str.startswith(NOT_APPLICABLE)
    ran = tp[~na]
    return {"rows": len(tp), "no_tp_plan": int(na.sum()),
            "with_plan": {k: int(v) for k, v in ran["status"].value_counts().sort_index().items()},
            "causes": {k: int(v) for k, v in ran.loc[ran["cause"].ne(""), "cause"].value_counts().items()}}


def summary_text(df) -> str:
    s = summary(df)
    if not s["rows"]:
        return ""
    plan = ", ".join(f"{k} {v}" for k, v in s["with_plan"].items()) or "none"
    causes = ", ".join(f"{k} {v}" for k, v in s["causes"].items())
    return (f"tensor-parallel: {s['rows']} rows; with a tp plan: {plan}" + (f" (causes: {causes})" if causes else "")
            + f"; without base_model_tp_plan (not applicable): {s['no_tp_plan']}")
