"""Where a real-size eager forward spends its time, per op class, on tpu (Strict eager) against CPU eager.

  python benchmarks/profile_forward.py [--model gpt2] [--seq 64] [--repeats 5] [--threads 0]

One process builds the model (seeded, offline, precision "highest"), keeps a CPU copy and a tpu copy, warms
both up, then records `--repeats` forwards (no grad, no cache) of each under torch.profiler. ATen ops are
grouped into classes (matmul, attention, normalisation, elementwise, embedding/indexing, layout/views,
other) by their self time, so a composite op (linear) is counted where its kernel (addmm) runs.

On tpu each op runs synchronously (the script sets HF_TPU_CPU_ASYNC_DISPATCH=0), so an op's self time is its
whole cost: hf-tpu's Python dispatch plus the XLA program. The XLA part is measured separately: every
cached eager program (dispatch's plans, hf_tpu/plans.py) is wrapped in a timer for the profiled forwards,
and the rest of the op's self time is dispatch (argument inspection, plan lookup, wrapping the result).
"Outside ops" is the forward's wall time not inside any ATen op: the model's own Python, equal work on both
sides (more on tpu only by the profiler's own per-op cost).

Not a test: the figures depend on the machine's load. Run it alone; the note of issue 31 has the table.
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
from profile_classes import op_class, per_class, print_table, wait  # noqa: E402


class ProgramTimer:
    """Wraps every cached eager program (plans.table) so that its calls' wall time is added up per op."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self._undo: list[tuple[Any, Any]] = []

    def install(self) -> None:
        from hf_tpu import plans

        for key, plan in plans.table.items():
            name = "aten::" + str(key[0]).removeprefix("aten.").split(".")[0]  # aten.addmm.default -> aten::addmm
            self._undo.append((plan, plan.program))
            plan.program = self._timed(plan.program, name)

    def _timed(self, prog: Any, name: str) -> Any:
        def run(*arrays: Any) -> Any:
            t = time.perf_counter()
            out = prog(*arrays)
            wait(out)
            self.seconds[name] += time.perf_counter() - t
            self.calls[name] += 1
            return out

        return run

    def remove(self) -> None:
        for plan, prog in self._undo:
            plan.program = prog
        self._undo.clear()


def profile(model: Any, ids: Any, repeats: int) -> tuple[dict[str, list[float]], float]:
    """{class: [self ms per forward, op calls per forward]}, and the mean wall ms of a forward (profiled;
    the mean, as the op times are totals over the forwards)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    walls = []
    with torch.no_grad(), tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            t = time.perf_counter()
            model(ids, use_cache=False).logits.cpu()
            walls.append(time.perf_counter() - t)
    return per_class(prof, repeats, CLASSES), statistics.fmean(walls) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    args = ap.parse_args()

    import torch

    import hf_tpu  # noqa: F401 - registers the tpu device

    torch.set_float32_matmul_precision("highest")
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = build(args.model)
    tpu = copy.deepcopy(cpu).to("tpu")
    ids = torch.randint(0, cpu.config.vocab_size, (1, args.seq))
    ids_t = ids.to("tpu")
    with torch.no_grad():
        for _ in range(3):  # compiles, plans, caches
            cpu(ids, use_cache=False)
            tpu(ids_t, use_cache=False).logits.cpu()
        plain = {"cpu": [], "tpu": []}
        for _ in range(args.repeats):  # unprofiled wall time, alternating
            for name, m, x in (("cpu", cpu, ids), ("tpu", tpu, ids_t)):
                t = time.perf_counter()
                m(x, use_cache=False).logits.cpu()
                plain[name].append((time.perf_counter() - t) * 1e3)
    cpu_cls, cpu_wall = profile(cpu, ids, args.repeats)
    timer = ProgramTimer()
    timer.install()
    try:
        tpu_cls, tpu_wall = profile(tpu, ids_t, args.repeats)
    finally:
        timer.remove()
    xla_cls: dict[str, float] = collections.defaultdict(float)
    for name, s in timer.seconds.items():
        xla_cls[op_class(name, CLASSES)] += s * 1e3 / args.repeats

    print(f"\n{args.model} forward 1 x {args.seq}, no grad, precision highest, torch threads "
          f"{torch.get_num_threads()}; {args.repeats} forwards each, ms per forward")
    print(f"unprofiled wall: cpu {statistics.median(plain['cpu']):.1f}  tpu {statistics.median(plain['tpu']):.1f}"
          f"  tpu/cpu {statistics.median(plain['tpu']) / statistics.median(plain['cpu']):.2f}  "
          f"(median of {args.repeats}, alternating; spread cpu {min(plain['cpu']):.1f}-{max(plain['cpu']):.1f}, "
          f"tpu {min(plain['tpu']):.1f}-{max(plain['tpu']):.1f})\n")
    tot = print_table(cpu_cls, tpu_cls, xla_cls, CLASSES, "ops/fwd", 1)
    print(f"| outside ops (model Python) | | {cpu_wall - tot[0]:.1f} | {tpu_wall - tot[1]:.1f} | | | |")
    print(f"| forward (profiled wall) | | {cpu_wall:.1f} | {tpu_wall:.1f} | | | {tpu_wall / cpu_wall:.2f} |")


if __name__ == "__main__":
    main()
