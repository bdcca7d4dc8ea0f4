"""Where an eager inference forward's CPU-seconds go, per op class, on tpu (Strict eager) against CPU eager.

  OMP_WAIT_POLICY=PASSIVE python benchmarks/profile_cpu_seconds.py [--model gpt2] [--repeats 4]

profile_forward.py's table in CPU-seconds instead of wall time, for a loaded machine, where wall time measures the
load. One process builds the model (eager_bench.py's MODELS: seeded, offline, precision "highest"), keeps a CPU
and a tpu copy, warms both up, then runs `--repeats` forwards of each alternately. Every ATen op that reaches
dispatch is timed with `time.process_time` (the whole process's user+sys, all threads) under a
TorchDispatchMode, which sees leaf ops only, so a composite op counts where its kernel runs. On tpu every cached
eager program (hf_tpu/plans.py) is timed as well: its XLA share; the rest of the op's time is dispatch. The
mode's own cost falls outside the ops, so the totals exceed a plain forward's. hf-tpu's attention kernel
(sdpa.py) runs above the mode, which sees none of its op, only its program: attention's XLA time shows with
no op time (a negative dispatch), its op time lands in another class.

Every figure also has its main-thread part (time.thread_time of the thread running the model): CPU eager's
OpenMP threads and XLA's intra-op pool (tf_XLAEigen) do the rest. The forward's wall time on a quiet machine
with programs run on the calling thread (the script sets HF_TPU_CPU_ASYNC_DISPATCH=0, as the
attribution needs) is close to its main thread's CPU time (every op, and XLA's share of each program, runs
there one after another), so the main-thread columns show the critical path while the machine is loaded: a
dot that XLA keeps on the calling thread costs its whole CPU time in wall time, one that oneDNN splits over
two threads half. The per-thread totals of each forward (/proc/self/task/*/schedstat) are printed by
thread name.

Run with OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP threads otherwise spin after each parallel region and count
as CPU-seconds (25x CPU eager's matmul time on a tiny Llama, measured). Not a test; the note of issue 31 has the
table.
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

from eager_bench import MODELS, build  # noqa: E402
from profile_classes import FORWARD_CLASSES as CLASSES  # noqa: E402
from profile_classes import op_class, wait  # noqa: E402


class Clock:
    """CPU-seconds per op class for the side being timed, and per op of tpu's XLA programs."""

    def __init__(self) -> None:
        self.side: str | None = None  # "cpu", "tpu" or None (not recording)
        self.ops: dict[str, collections.Counter] = {"cpu": collections.Counter(), "tpu": collections.Counter()}
        self.calls: dict[str, collections.Counter] = {"cpu": collections.Counter(), "tpu": collections.Counter()}
        self.xla: collections.Counter = collections.Counter()
        self.xla_ops: collections.Counter = collections.Counter()
        # the same, main thread only (time.thread_time)
        self.ops_main: dict[str, collections.Counter] = {"cpu": collections.Counter(),
                                                         "tpu": collections.Counter()}
        self.xla_main: collections.Counter = collections.Counter()

    def mode(self) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        clock = self

        class Timed(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                t, m = time.process_time(), time.thread_time()
                out = func(*args, **(kwargs or {}))
                if clock.side is not None:
                    cls = op_class("aten::" + func.__name__, CLASSES)
                    clock.ops[clock.side][cls] += time.process_time() - t
                    clock.ops_main[clock.side][cls] += time.thread_time() - m
                    clock.calls[clock.side][cls] += 1
                return out

        return Timed()

    def wrap_programs(self) -> None:
        """Time every cached eager program from now on (run after a warm-up has made them)."""
        from hf_tpu import plans

        for key, plan in plans.table.items():
            if getattr(plan.program, "_timed", False):
                continue
            name = "aten::" + str(key[0]).removeprefix("aten.").split(".")[0]
            plan.program = self._timed(plan.program, name)

    def _timed(self, prog: Any, name: str) -> Any:
        def run(*arrays: Any) -> Any:
            t, m = time.process_time(), time.thread_time()
            out = prog(*arrays)
            wait(out)
            if self.side == "tpu":
                dt = time.process_time() - t
                self.xla[op_class(name, CLASSES)] += dt
                self.xla_main[op_class(name, CLASSES)] += time.thread_time() - m
                self.xla_ops[name] += dt
            return out

        run._timed = True  # type: ignore[attr-defined]
        return run


def thread_cpu() -> dict[int, tuple[str, int]]:
    """{thread id: (name, CPU nanoseconds so far)} of this process's threads (Linux; {} elsewhere)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = (f.read().strip(), ns)
        except (OSError, ValueError):  # the thread ended meanwhile
            pass
    return out


def by_thread_name(before: dict[int, tuple[str, int]],
                   after: dict[int, tuple[str, int]]) -> collections.Counter:
    """CPU seconds per thread name between two thread_cpu() snapshots; the main thread as "main"."""
    spent: collections.Counter = collections.Counter()
    for tid, (name, ns) in after.items():
        spent["main" if tid == os.getpid() else name] += (ns - before.get(tid, (name, 0))[1]) / 1e9
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()

    import torch

    import hf_tpu  # noqa: F401 - registers the tpu device

    torch.set_float32_matmul_precision("highest")
    seq = MODELS[args.model][3]
    cpu = build(args.model)
    tpu = copy.deepcopy(cpu).to("tpu")
    ids = torch.randint(0, cpu.config.vocab_size, (1, seq))
    ids_t = ids.to("tpu")
    clock = Clock()
    totals: dict[str, list[float]] = {"cpu": [], "tpu": []}
    mains: dict[str, list[float]] = {"cpu": [], "tpu": []}
    threads: dict[str, collections.Counter] = {"cpu": collections.Counter(), "tpu": collections.Counter()}
    with torch.no_grad():
        for i in range(args.repeats + 3):  # three warm-ups: compiles, plans, caches
            if i == 2:
                clock.wrap_programs()
            for side, model, x in (("cpu", cpu, ids), ("tpu", tpu, ids_t)):
                clock.side = side if i >= 3 else None
                before = thread_cpu()
                t, m = time.process_time(), time.thread_time()
                with clock.mode():
                    model(x, use_cache=False).logits.cpu()
                if i >= 3:
                    totals[side].append(time.process_time() - t)
                    mains[side].append(time.thread_time() - m)
                    threads[side].update(by_thread_name(before, thread_cpu()))
    clock.side = None
    n = args.repeats
    ms = lambda v: f"{statistics.median(v) * 1e3:.1f} ({min(v) * 1e3:.1f}-{max(v) * 1e3:.1f})"  # noqa: E731
    print(f"\n{args.model} forward 1 x {seq}, no grad, precision highest, torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; CPU-ms per forward (median, min-max of "
          f"{n}) under the timing mode: cpu {ms(totals['cpu'])}  tpu {ms(totals['tpu'])}; main thread only: "
          f"cpu {ms(mains['cpu'])}  tpu {ms(mains['tpu'])}")
    for side in ("cpu", "tpu"):
        print(f"  {side} CPU-ms per forward by thread: " + ", ".join(
            f"{k} {v * 1e3 / n:.1f}" for k, v in threads[side].most_common() if v * 1e3 / n >= 0.05))
    print("\nEach cell: CPU-ms of all threads / of the main thread.\n")
    print("| op class | tpu ops/fwd | cpu CPU-ms | tpu CPU-ms | tpu XLA CPU-ms | tpu dispatch CPU-ms | tpu/cpu "
          "| tpu/cpu main thread |")
    print("|---|---|---|---|---|---|---|---|")
    tot = [0.0] * 6
    for c in [c for c, _ in CLASSES] + ["other"]:
        a, b, x = (clock.ops["cpu"][c] * 1e3 / n, clock.ops["tpu"][c] * 1e3 / n, clock.xla[c] * 1e3 / n)
        am, bm, xm = (clock.ops_main["cpu"][c] * 1e3 / n, clock.ops_main["tpu"][c] * 1e3 / n,
                      clock.xla_main[c] * 1e3 / n)
        if not (a or b or x):
            continue
        tot = [u + v for u, v in zip(tot, (a, b, x, am, bm, xm), strict=True)]
        ratio, ratio_main = f"{b / a:.2f}" if a else "-", f"{bm / am:.2f}" if am else "-"
        print(f"| {c} | {clock.calls['tpu'][c] / n:.0f} | {a:.1f} / {am:.1f} | {b:.1f} / {bm:.1f} | "
              f"{x:.1f} / {xm:.1f} | {b - x:.1f} / {bm - xm:.1f} | {ratio} | {ratio_main} |")
    a, b, x, am, bm, xm = tot
    print(f"| all ops | | {a:.1f} / {am:.1f} | {b:.1f} / {bm:.1f} | {x:.1f} / {xm:.1f} | "
          f"{b - x:.1f} / {bm - xm:.1f} "
          f"| {b / a:.2f} | {bm / am:.2f} |")
    top = sorted(clock.xla_ops.items(), key=lambda kv: -kv[1])[:8]
    print("\ntpu XLA CPU-ms per forward by op: " + ", ".join(f"{k.removeprefix('aten::')} {v * 1e3 / n:.1f}"
                                                         for k, v in top))


if __name__ == "__main__":
    main()
