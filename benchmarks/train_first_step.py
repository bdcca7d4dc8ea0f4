"""Where a train row's first step goes (issue 27, throughput): one process per (entry, mode), the sweep's
training step (harness/sweep/train.py: its loss, inputs and optimizer) timed by stage in process CPU seconds (all
threads; on a shared machine wall time is mostly waiting for a core), with JAX's own compile durations (tracing,
lowering to MLIR, XLA compile: wall seconds), the persistent-cache hits and misses, and AOTAutograd's seconds.

    python benchmarks/train_first_step.py --match 'bert/BertForSequenceClassification' --cache /tmp/c --runs 2

--runs N runs every (entry, mode) N times in fresh processes on one compile cache directory (HF_TPU_CACHE_DIR:
JAX's persistent cache and the graph cache): the first run on an empty directory is cold, the later ones warm.
Prints one JSON line per process and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

STEPS = 3


def measure(entry_id: str, mode: str, zoo: str, draws_mode: bool = True) -> dict[str, Any]:
    """One (entry, mode) in this process: seconds per stage of each step, and the compile breakdown of step 1."""
    import jax
    import torch

    import hf_tpu
    from harness.entry_calls import compile_call, prepare_inputs, prepare_model
    from harness.sweep import draws, train
    from harness.sweep.device import backend_phase
    from harness.zoo import load_zoo

    durations: dict[str, float] = defaultdict(float)
    jax.monitoring.register_event_duration_secs_listener(lambda name, secs, **_: durations.__setitem__(
        name, durations[name] + secs))
    entry = next(e for e in load_zoo(zoo) if e.id == entry_id)
    t0 = time.process_time()
    built = entry.build(seed=0)
    build_s = time.process_time() - t0
    hf_tpu.set_matmul_precision("highest")
    model = prepare_model(built.model, "tpu", None, lambda: entry.build(seed=0).model)
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    opt, label = train.make_optimizer(params, "tpu")
    fn = built.call if mode == "eager" else compile_call(built.call, model, "tpu")
    inputs = train.train_inputs(entry, model, prepare_inputs(built.inputs, "tpu", None))
    steps = []
    first_breakdown: dict[str, Any] = {}
    hf_tpu.reset_compile_stats()
    durations.clear()
    from torch._dynamo.utils import compilation_time_metrics

    compilation_time_metrics.clear()
    for k in range(STEPS):
        stage: dict[str, float] = {}
        clock = time.process_time  # CPU seconds of every thread (XLA compiles on its own threads)
        # the sweep's shared_draws is a TorchFunctionMode; the graph cache (compile_cache/cached.py) serves
        # graphs that draw nothing under it (it declares itself draws-only): --no-draws measures without it
        shared = draws.shared_draws(0) if draws_mode else contextlib.nullcontext()
        with torch.enable_grad(), backend_phase(), shared:
            w, t = time.perf_counter(), clock()
            opt.zero_grad(set_to_none=True)
            loss = train.scalar_loss(fn(model, inputs))
            loss.detach().cpu()  # the forward has run (the loss is on the host)
            stage["forward"] = clock() - t
            t = clock()
            loss.backward()
            next(p for p in params if p.grad is not None).grad.detach().cpu()
            stage["backward"] = clock() - t
            t = clock()
            opt.step()
            params[0].detach().cpu()
            stage["optimizer"] = clock() - t
            stage["wall"] = time.perf_counter() - w
        steps.append({s: round(v, 3) for s, v in stage.items()})
        if k == 0:
            cs = hf_tpu.compile_stats()
            first_breakdown = {
                "jax": {n.split("/")[-1]: round(v, 3) for n, v in durations.items() if v >= 0.005},
                "hf_tpu": {k2: cs.get(k2) for k2 in ("compilations", "cache_hits", "cache_misses", "aot_s", "xla_s")},
                "dynamo_s": round(sum(sum(v) for n, v in compilation_time_metrics.items()
                                      if n in ("_compile.compile_inner", "entire_frame_compile")), 3),
            }
    return {"entry": entry_id, "mode": mode, "optimizer": label, "build_cpu_s": round(build_s, 2), "steps": steps,
            "step1": first_breakdown, "process_cpu_s": round(time.process_time(), 2)}


def drive(args: argparse.Namespace) -> int:
    from harness.zoo import load_zoo

    import re

    ids = [e.id for e in load_zoo(args.zoo) if re.search(args.match, e.id)]
    if not ids:
        print(f"train_first_step: no entry of zoo {args.zoo!r} matches {args.match!r}", file=sys.stderr)
        return 2
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TPU_CACHE_DIR": str(Path(args.cache).resolve())}
    rows = []
    for run in range(1, args.runs + 1):
        for entry_id in ids:
            for mode in args.modes.split(","):
                t = time.perf_counter()
                extra = ["--no-draws"] if args.no_draws else []
                p = subprocess.run([sys.executable, __file__, "--one", entry_id, "--mode", mode, "--zoo", args.zoo,
                                    *extra],
                                   env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t
                line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
                if p.returncode or line is None:
                    print(f"{entry_id} {mode}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                    continue
                row = {**json.loads(line), "run": run, "process_wall_s": round(wall, 1)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n{'entry':40} {'mode':8} run proc-cpu step1 cpu f/b/o       step2  XLA    trace  aot   hits/miss")
    for r in rows:
        s1, s2, j, h = r["steps"][0], r["steps"][1], r["step1"]["jax"], r["step1"]["hf_tpu"]
        cpu2 = s2["forward"] + s2["backward"] + s2["optimizer"]
        print(f"{r['entry'][-40:]:40} {r['mode']:8} {r['run']:3} {r['process_cpu_s']:7.1f} "
              f"{s1['forward']:6.2f}/{s1['backward']:6.2f}/{s1['optimizer']:5.2f} {cpu2:6.2f} "
              f"{j.get('backend_compile_duration', 0):6.2f} {j.get('jaxpr_trace_duration', 0):6.2f} "
              f"{h.get('aot_s') or 0:5.2f} {h.get('cache_hits')}/{h.get('cache_misses')}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--match", default="bert/BertForSequenceClassification")
    p.add_argument("--zoo", default="smoke")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--cache", default=None, help="compile cache directory (HF_TPU_CACHE_DIR) for every run")
    p.add_argument("--runs", type=int, default=2, help="runs per (entry, mode); the first on an empty --cache is cold")
    p.add_argument("--no-draws", action="store_true",
                   help="without the sweep's shared_draws mode (a TorchFunctionMode the graph cache serves under)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.mode, args.zoo, not args.no_draws)))
        return 0
    if not args.cache:
        p.error("--cache DIR is needed (an empty directory gives a cold first run)")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
