"""Where a training step's CPU-seconds go on tpu (Strict eager) against CPU eager: by phase and by op class.

  OMP_WAIT_POLICY=PASSIVE python benchmarks/profile_train_cpu_seconds.py [--model gpt2] [--steps 3]
                                                                         [--batch 4] [--seq 128] [--layers N]
                                                                         [--ops N] [--tiny] [--compiled]

finetune_step.py's step (forward with labels under bfloat16 autocast, backward, AdamW(fused=True) step,
zero_grad, `loss.item()`) in CPU-seconds (`time.process_time`: the whole process's user+sys, every thread), for
a machine shared with other work, where wall time measures the load. One process builds the model (seeded,
offline, dropout off, precision "highest"), keeps a CPU and a tpu copy, takes two warm-up steps on each
(compiles, plans), then:

1. `--steps` plain steps of each, alternating: CPU-seconds per phase (forward, backward, optimizer step,
   zero_grad + item) and the tpu/CPU ratio of each pair's whole step. tpu ops are synchronous here (XLA:CPU
   runs each program on the calling thread: the script sets HF_TPU_CPU_ASYNC_DISPATCH=0), so a phase's
   CPU-seconds are its own.
2. `--steps` steps of each under a TorchDispatchMode that times every ATen op reaching dispatch (leaf ops; the
   backward's run on autograd's device thread, which inherits the mode) with `process_time`, per op class and
   phase; on tpu every XLA program hf-tpu runs (xla_options.jit's, wrapped before the first tpu op) is timed
   too and charged to the op being dispatched: its XLA share, the rest of the op's time being dispatch. The
   mode's own cost falls outside the ops; what a phase spends outside every op (autograd's engine, autocast's
   kernels, the module's Python) is the phase's total less its ops'.

`--compiled`: the tpu side's forward goes through torch.compile(backend="tpu") (one XLA program forward, one
backward); only part 1 runs (a TorchDispatchMode would see the compiled graph's call, not its ops), and the
XLA programs' share of each phase is printed (graph programs and the optimizer's, timed as they run).

Run with OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP threads otherwise spin after each parallel region and
count as CPU-seconds. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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

from profile_classes import TRAIN_CLASSES, op_class, wait  # noqa: E402

# autocast's casts (and every other dtype conversion) get a class of their own, ahead of the others
CLASSES = (("casts", ("_to_copy",)), *TRAIN_CLASSES)
PHASES = ("forward", "backward", "optimizer", "zero_grad+item")
ms = lambda v: f"{statistics.median(v) * 1e3:.0f} ({min(v) * 1e3:.0f}-{max(v) * 1e3:.0f})"  # noqa: E731


class Clock:
    """CPU-seconds per (side, phase, op class), and tpu's XLA programs per (phase, op class)."""

    def __init__(self) -> None:
        self.side: str | None = None  # "cpu", "tpu", or None: not recording
        self.phase = "forward"
        self.depth = 0  # ops inside ops (a composite's leaves reach the mode inside its own call)
        self.ops: collections.Counter = collections.Counter()  # (side, phase, class) -> seconds
        self.calls: collections.Counter = collections.Counter()
        self.xla: collections.Counter = collections.Counter()  # (phase, class) -> seconds
        self.programs: collections.Counter = collections.Counter()  # (phase, class) -> calls
        self.xla_ops: collections.Counter = collections.Counter()  # op name -> seconds
        self.by_op: collections.Counter = collections.Counter()  # (side, phase, op name) -> seconds
        self.op_calls: collections.Counter = collections.Counter()

    def mode(self) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        clock = self

        class Timed(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                clock.depth += 1
                t = time.process_time()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    clock.depth -= 1
                    if clock.side is not None and clock.depth == 0:
                        key = (clock.side, clock.phase, op_class("aten::" + func.__name__, CLASSES))
                        dt = time.process_time() - t
                        clock.ops[key] += dt
                        clock.calls[key] += 1
                        clock.by_op[(clock.side, clock.phase, func.__name__)] += dt
                        clock.op_calls[(clock.side, clock.phase, func.__name__)] += 1

        return Timed()

    def install_program_timer(self) -> None:
        """Wrap every program xla_options.jit makes from now on (call before the first tpu op)."""
        from hf_tpu import fused, xla_options

        orig, clock = xla_options.jit, self

        def timed(prog: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                if clock.side != "tpu":
                    return prog(*args, **kwargs)
                t = time.process_time()
                out = prog(*args, **kwargs)
                wait(out)
                dt = time.process_time() - t
                op = fused.current_op
                name = "aten::" + str(op).removeprefix("aten.").split(".")[0] if op is not None else "?"
                key = (clock.phase, op_class(name, CLASSES))
                clock.xla[key] += dt
                clock.programs[key] += 1
                clock.xla_ops[name] += dt
                return out

            return run

        def jit(fn: Any, **kw: Any) -> Any:
            prog = orig(fn, **kw)
            run = timed(prog)
            for variant in ("fast", "full"):  # a caller may call one variant itself
                if getattr(prog, variant, None) is not None:
                    setattr(run, variant, timed(getattr(prog, variant)))
            run._cache_size = getattr(prog, "_cache_size", lambda: 0)  # type: ignore[attr-defined]
            return run

        xla_options.jit = jit

    def install_graph_timer(self) -> None:
        """Time compiled graphs' programs too (graph_compiler's xla_options.jit_full), class "graph"."""
        from hf_tpu import xla_options

        orig, clock = xla_options.jit_full, self

        def jit_full(fn: Any, ident: str | None = None, **kw: Any) -> Any:
            prog = orig(fn, ident=ident, **kw)

            def run(*args: Any, **kwargs: Any) -> Any:
                if clock.side != "tpu":
                    return prog(*args, **kwargs)
                t = time.process_time()
                out = prog(*args, **kwargs)
                wait(out)
                clock.xla[(clock.phase, "graph")] += time.process_time() - t
                clock.programs[(clock.phase, "graph")] += 1
                return out

            run.executables = getattr(prog, "executables", None)  # type: ignore[attr-defined]
            if run.executables is None:
                del run.executables
            return run

        xla_options.jit_full = jit_full


def step(model: Any, opt: Any, ids: Any, device: str, clock: Clock | None = None) -> dict[str, float]:
    """One training step; CPU-seconds per phase."""
    import torch

    out: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Any:
        if clock is not None:
            clock.phase = name
        t = time.process_time()
        yield
        out[name] = time.process_time() - t

    with phase("forward"), torch.autocast(device, dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        opt.step()
    with phase("zero_grad+item"):
        opt.zero_grad(set_to_none=True)
        loss.item()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 (a smoke test of the script)")
    ap.add_argument("--layers", type=int, default=0,
                    help="this many layers instead of the config's (two copies of a 12-layer GPT-2 take ~6 GB)")
    ap.add_argument("--ops", type=int, default=0, help="also list each phase's N costliest ops on each side")
    ap.add_argument("--compiled", action="store_true", help="the tpu forward through torch.compile (part 1 only)")
    args = ap.parse_args()

    import torch
    import transformers

    import finetune_step
    import hf_tpu  # noqa: F401 - registers the tpu device

    clock = Clock()
    clock.install_program_timer()  # before the first tpu op makes its program
    torch.set_float32_matmul_precision("highest")
    transformers.utils.logging.set_verbosity_error()
    cpu = finetune_step.build(args.model, args.tiny, args.seq, args.layers)
    config = cpu.config
    tpu = copy.deepcopy(cpu).to("tpu").train()
    sides = {"cpu": (cpu, torch.optim.AdamW(cpu.parameters(), lr=1e-4, fused=True),
                     torch.randint(0, config.vocab_size, (args.batch, args.seq))),
             "tpu": (tpu, torch.optim.AdamW(tpu.parameters(), lr=1e-4, fused=True), None)}
    sides["tpu"] = (torch.compile(tpu, backend="tpu") if args.compiled else tpu, sides["tpu"][1],
                    sides["cpu"][2].to("tpu"))
    if args.compiled:
        clock.install_graph_timer()
    for _ in range(2):  # warm-up: compiles, plans, optimizer state
        for side, (m, o, x) in sides.items():
            step(m, o, x, side)
    plain: dict[str, list[dict[str, float]]] = {"cpu": [], "tpu": []}
    for _ in range(args.steps):
        for side, (m, o, x) in sides.items():
            clock.side = side if args.compiled else None  # the graph and optimizer programs, timed
            plain[side].append(step(m, o, x, side, clock))
            clock.side = None
    for _ in range(0 if args.compiled else args.steps):
        for side, (m, o, x) in sides.items():
            clock.side = side
            with clock.mode():
                phases = step(m, o, x, side, clock)
            clock.side = None
            for p, s in phases.items():
                clock.ops[(side, p, "(phase total)")] += s

    n = args.steps
    total = {s: [sum(r.values()) for r in plain[s]] for s in plain}
    ratios = [t / c for c, t in zip(total["cpu"], total["tpu"], strict=True)]
    layers = getattr(config, "n_layer", getattr(config, "num_hidden_layers", "?"))
    print(f"\n{args.model if not args.tiny else 'tiny GPT-2'} ({layers} layers) training step {args.batch} x {args.seq}, AdamW(fused), "
          f"bfloat16 autocast, precision highest, torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}\n")
    print(f"Plain steps, CPU-ms (median, min-max of {n}, alternating); tpu/cpu per pair "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})\n")
    print("| phase | cpu CPU-ms | tpu CPU-ms | tpu/cpu |")
    print("|---|---|---|---|")
    for p in PHASES:
        c, t = [r[p] for r in plain["cpu"]], [r[p] for r in plain["tpu"]]
        print(f"| {p} | {ms(c)} | {ms(t)} | {statistics.median(t) / statistics.median(c):.2f} |")
    print(f"| step | {ms(total['cpu'])} | {ms(total['tpu'])} | "
          f"{statistics.median(total['tpu']) / statistics.median(total['cpu']):.2f} |")
    if args.compiled:
        print("\ntpu XLA programs, CPU-ms per step (mean) by phase: " + ", ".join(
            f"{p} {sum(v for k, v in clock.xla.items() if k[0] == p) / n * 1e3:.0f} "
            f"({sum(v for k, v in clock.programs.items() if k[0] == p) / n:.0f} programs)" for p in PHASES))
        return

    print(f"\nUnder the timing mode, CPU-ms per step (mean of {n}); tpu's ops split into XLA programs and the "
          "rest (dispatch); 'outside ops': the phase's time not inside any ATen op\n")
    print("| phase | op class | cpu ops | cpu CPU-ms | tpu ops | tpu programs | tpu CPU-ms | tpu XLA | "
          "tpu dispatch | tpu/cpu |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in PHASES:
        rows = [c for c, _ in CLASSES] + ["other"]
        in_ops = {"cpu": 0.0, "tpu": 0.0}
        for c in rows:
            a, b = clock.ops[("cpu", p, c)] / n * 1e3, clock.ops[("tpu", p, c)] / n * 1e3
            x = clock.xla[(p, c)] / n * 1e3
            in_ops["cpu"] += a
            in_ops["tpu"] += b
            if not (a or b or x):
                continue
            print(f"| {p} | {c} | {clock.calls[('cpu', p, c)] / n:.0f} | {a:.1f} | {clock.calls[('tpu', p, c)] / n:.0f} | "
                  f"{clock.programs[(p, c)] / n:.0f} | {b:.1f} | {x:.1f} | {b - x:.1f} | "
                  f"{f'{b / a:.2f}' if a else '-'} |")
        tc, tt = (clock.ops[(s, p, "(phase total)")] / n * 1e3 for s in ("cpu", "tpu"))
        print(f"| {p} | outside ops | | {tc - in_ops['cpu']:.1f} | | | {tt - in_ops['tpu']:.1f} | | | |")
        print(f"| {p} | **phase total** | | {tc:.1f} | | | {tt:.1f} | | | {tt / tc:.2f} |")
    for side in ("cpu", "tpu") if args.ops else ():
        for p in PHASES:
            top = sorted(((k[2], v) for k, v in clock.by_op.items() if k[:2] == (side, p)), key=lambda kv: -kv[1])
            print(f"\n{side} {p}, costliest ops (CPU-ms per step, calls): " + ", ".join(
                f"{k} {v * 1e3 / n:.1f} ({clock.op_calls[(side, p, k)] / n:.0f})" for k, v in top[:args.ops]))
    top = sorted(clock.xla_ops.items(), key=lambda kv: -kv[1])[:12]
    print("\ntpu XLA CPU-ms per step by op: " + ", ".join(f"{k.removeprefix('aten::')} {v * 1e3 / n:.1f}"
                                                       for k, v in top))


if __name__ == "__main__":
    main()
