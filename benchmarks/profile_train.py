"""Where a training step's time goes, per op class, on tpu (Strict eager) against CPU eager.

  python benchmarks/profile_train.py [--model gpt2] [--batch 4] [--seq 128] [--steps 2] [--no-autocast]
                                     [--threads 0] [--tiny]

One process builds the model (seeded, offline, dropout off, precision "highest"), keeps a CPU copy and a tpu
copy, each with AdamW(fused=True), and takes finetune_step.py's step on each: forward with labels under
`torch.autocast(device, bfloat16)` (unless --no-autocast), backward, optimizer step, zero_grad, `loss.item()`.
After two warm-up steps each (compiles, plans), it times `--steps` steps alternating CPU and tpu, then
records `--steps` steps of each under torch.profiler. ATen ops are grouped by self time into
profile_forward.py's classes plus the backward's and the optimizer's; on tpu the XLA programs hf-tpu makes
(every xla_options.jit program: eager ops, views, the fused optimizer) are timed as they run and charged to
the ATen op being dispatched, so "dispatch" is an op's self time less its programs'. Also printed: XLA
programs run per step (split by fast-compile and full-optimisation variants) and programs compiled during
the profiled steps (0 when the warm-up covered them).

On tpu the backward runs on autograd's device thread; torch.profiler sees every thread. Not a test: the
figures depend on the machine's load. Run it alone.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_DEFER_AND_FUSE", "0")
# each program on the calling thread, so that an op's time holds its program (runtime._sync_cpu_dispatch)
os.environ.setdefault("HF_TPU_CPU_ASYNC_DISPATCH", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from profile_classes import TRAIN_CLASSES as CLASSES  # noqa: E402
from profile_classes import op_class, per_class, print_table, wait  # noqa: E402

# programs run outside any ATen op's dispatch (an autograd Function's), charged to the op they stand for
_PROGRAM_OPS = {"hf_tpu.cross_entropy": "aten::cross_entropy_loss"}


class ProgramTimer:
    """Wraps every program xla_options.jit makes from now on: each call's wall time is charged to the ATen op
    being dispatched (fused.current_op), and calls are counted by variant (fast compile or full)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.on = False

    def install(self) -> None:
        from hf_tpu import fused, xla_options

        orig = xla_options.jit
        timer = self

        def jit(fn: Any, **kw: Any) -> Any:
            prog = orig(fn, **kw)
            module = getattr(getattr(fn, "func", fn), "__module__", "")
            variants = (getattr(prog, "fast", None), getattr(prog, "full", None))

            def run(*args: Any, **kwargs: Any) -> Any:
                if not timer.on:
                    return prog(*args, **kwargs)
                before = [v._cache_size() for v in variants if v is not None]
                t = time.perf_counter()
                out = prog(*args, **kwargs)
                wait(out)
                dt = time.perf_counter() - t
                op = fused.current_op
                # (current_op is the last op dispatched: stale inside an autograd Function)
                name = _PROGRAM_OPS.get(module) or (
                    "aten::" + str(op).removeprefix("aten.").split(".")[0] if op is not None else "?")
                timer.seconds[name] += dt
                after = [v._cache_size() for v in variants if v is not None]
                kind = "full" if variants[1] is not None and xla_options._large(args, xla_options.LARGE_ELEMENTS) \
                    else "fast"
                timer.calls[kind] += 1
                if after != before:
                    timer.calls["compiled"] += 1
                return out

            run._cache_size = getattr(prog, "_cache_size", lambda: 0)  # type: ignore[attr-defined]
            return run

        xla_options.jit = jit


def step_fn(model: Any, opt: Any, ids: Any, device: str, autocast: bool) -> float:
    import contextlib

    import torch

    ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def profile(run: Any, steps: int) -> tuple[dict[str, list[float]], float]:
    """{class: [self ms per step, op calls per step]} and the mean profiled wall ms per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    walls = []
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t = time.perf_counter()
            run()
            walls.append(time.perf_counter() - t)
    return per_class(prof, steps, CLASSES), statistics.fmean(walls) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-autocast", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true", help="only the unprofiled alternating step times")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 (a smoke test of the script)")
    args = ap.parse_args()

    import torch
    import transformers

    import finetune_step
    import hf_tpu  # noqa: F401 - registers the tpu device

    timer = ProgramTimer()
    timer.install()  # before the first tpu op makes its program
    torch.set_float32_matmul_precision("highest")
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    cpu = finetune_step.build(args.model, args.tiny, args.seq)
    config = cpu.config
    tpu = copy.deepcopy(cpu).to("tpu").train()
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-4, fused=True)
    opt_t = torch.optim.AdamW(tpu.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    ids_t = ids.to("tpu")
    ac = not args.no_autocast
    run_c = lambda: step_fn(cpu, opt_c, ids, "cpu", ac)  # noqa: E731
    run_t = lambda: step_fn(tpu, opt_t, ids_t, "tpu", ac)  # noqa: E731
    for _ in range(2):
        run_c()
        run_t()
    plain: dict[str, list[float]] = {"cpu": [], "tpu": []}
    for _ in range(args.steps):
        for name, run in (("cpu", run_c), ("tpu", run_t)):
            t = time.perf_counter()
            run()
            plain[name].append((time.perf_counter() - t) * 1e3)
    ratios = [t / c for c, t in zip(plain["cpu"], plain["tpu"], strict=True)]
    if args.no_profile:
        print(f"paired tpu/cpu step ratio {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); "
              f"cpu {statistics.median(plain['cpu']):.0f} ms, tpu {statistics.median(plain['tpu']):.0f} ms")
        return
    cpu_cls, cpu_wall = profile(run_c, args.steps)
    timer.on = True
    tpu_cls, tpu_wall = profile(run_t, args.steps)
    timer.on = False
    xla_cls: dict[str, float] = collections.defaultdict(float)
    for name, s in timer.seconds.items():
        xla_cls[op_class(name, CLASSES)] += s * 1e3 / args.steps

    c_med, t_med = statistics.median(plain["cpu"]), statistics.median(plain["tpu"])
    print(f"\n{args.model} training step {args.batch} x {args.seq}, AdamW(fused), "
          f"{'bfloat16 autocast' if ac else 'float32'}, precision highest, torch threads "
          f"{torch.get_num_threads()}; ms per step")
    print(f"unprofiled wall: cpu {c_med:.0f}  tpu {t_med:.0f}  tpu/cpu {t_med / c_med:.2f}, paired "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})  (median of "
          f"{args.steps}, alternating; spread cpu {min(plain['cpu']):.0f}-{max(plain['cpu']):.0f}, "
          f"tpu {min(plain['tpu']):.0f}-{max(plain['tpu']):.0f})")
    per = {k: v / args.steps for k, v in timer.calls.items()}
    print(f"tpu XLA programs run per step: {per.get('fast', 0) + per.get('full', 0):.0f} "
          f"({per.get('full', 0):.0f} full optimisation, {per.get('fast', 0):.0f} fast compile); compiled "
          f"during the profiled steps: {timer.calls.get('compiled', 0)}\n")
    print_table(cpu_cls, tpu_cls, xla_cls, CLASSES, "tpu ops/step", 0)
    print(f"| step (profiled wall) | | {cpu_wall:.0f} | {tpu_wall:.0f} | | | {tpu_wall / cpu_wall:.2f} |")
    top = sorted(timer.seconds.items(), key=lambda kv: -kv[1])[:12]
    print("\ntpu XLA ms per step by op: " + ", ".join(f"{k.removeprefix('aten::')} {v * 1e3 / args.steps:.0f}"
                                                      for k, v in top))


if __name__ == "__main__":
    main()
