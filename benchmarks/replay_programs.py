"""How much of a Strict-eager forward's time is its XLA programs alone, without hf-tpu's Python (issue 31).

  python benchmarks/replay_programs.py [--model gpt2] [--rounds 8] [--programs 20]

One process builds the model (eager_bench.build: seeded, offline, precision "highest"), moves it to tpu and
warms it up, then records one forward (no grad, no cache): every executable it calls through JAX's compiled
stage (the executable cache's programs: every planned eager op) with its arguments. The record is replayed
with no dispatch at all, each call fed the replay's own outputs where the forward fed an earlier program's:
  stream    the calls back to back, as the forward makes them (JAX's asynchronous dispatch);
  one-by-one  waiting for each call's result before the next.
Rounds alternate forward, stream and one-by-one replays; the table gives the median (min-max) of wall time,
process CPU and the main thread's CPU per forward. Where the stream replay takes the forward's wall time,
the per-op Python is not what the forward waits for: the programs are. `--programs N` prints the N programs
that take longest one by one (ms per forward, calls, argument shapes).

Not a test: wall times depend on the machine's load (the CPU columns less so). Run it alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eager_bench import MODELS, build  # noqa: E402


def record(forward: Any) -> list[tuple[Any, tuple, Any]]:
    """(executable, arguments, result) of every compiled-stage call `forward()` makes, in order."""
    from jax._src import stages

    calls: list[tuple[Any, tuple, Any]] = []
    plain = stages.Compiled.__call__

    def logged(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = plain(self, *args, **kwargs)
        calls.append((self, args, out))
        return out

    stages.Compiled.__call__ = logged
    try:
        forward()
    finally:
        stages.Compiled.__call__ = plain
    return calls


def _leaves(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list | tuple) else [x]


def replay(calls: list[tuple[Any, tuple, Any]], one_by_one: bool,
           per_call: dict[int, float] | None = None) -> None:
    """Run the recorded calls again; an argument the forward got from an earlier call is that call's new
    result (by identity), anything else (weights, inputs) the recorded array."""
    import jax

    made: dict[int, Any] = {}
    last = None
    for exe, args, out in calls:
        t = time.perf_counter()
        res = exe(*[made.get(id(a), a) for a in args])
        if one_by_one:
            jax.block_until_ready(res)
            if per_call is not None:
                per_call[id(exe)] = per_call.get(id(exe), 0.0) + time.perf_counter() - t
        for old, new in zip(_leaves(out), _leaves(res), strict=True):
            made[id(old)] = new
        last = res
    jax.block_until_ready(last)


def timed(fn: Any) -> tuple[float, float, float]:
    """(wall, process CPU, main-thread CPU) of fn(), in ms."""
    t, c, th = time.perf_counter(), time.process_time(), time.thread_time()
    fn()
    return (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3, (time.thread_time() - th) * 1e3


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--programs", type=int, default=0, help="print the N slowest programs, one by one")
    args = ap.parse_args()

    import torch

    torch.set_float32_matmul_precision("highest")
    import hf_tpu  # noqa: F401 - the tpu device

    model = build(args.model).to("tpu")
    ids = torch.randint(0, model.config.vocab_size, (1, MODELS[args.model][3])).to("tpu")

    def forward() -> None:
        model(ids, use_cache=False).logits.cpu()

    with torch.no_grad():
        for _ in range(3):  # compiles and plans
            forward()
        calls = record(forward)
        for _ in range(2):
            replay(calls, False)
        rows: dict[str, list[tuple[float, float, float]]] = {"forward": [], "stream": [], "one-by-one": []}
        per_call: dict[int, float] = {}
        for _ in range(args.rounds):
            rows["forward"].append(timed(forward))
            rows["stream"].append(timed(lambda: replay(calls, False)))
            rows["one-by-one"].append(timed(lambda: replay(calls, True, per_call)))
    print(f"{args.model}: {len(calls)} XLA program calls per forward; {args.rounds} alternating rounds, ms per "
          "forward, median (min-max)")
    print("| run | wall | process CPU | main-thread CPU |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(spread([x[k] for x in r]) for k in range(3)) + " |")
    if args.programs:
        calls_of: dict[int, list[Any]] = {}
        for exe, a, _ in calls:
            calls_of.setdefault(id(exe), [0, [tuple(x.shape) for x in a]])[0] += 1
        print(f"\nslowest programs, one by one (ms per forward; sum {sum(per_call.values()) / args.rounds * 1e3:.1f})")
        for key, seconds in sorted(per_call.items(), key=lambda kv: -kv[1])[:args.programs]:
            n, shapes = calls_of[key]
            print(f"{seconds / args.rounds * 1e3:7.2f}  x{n:<3d} {shapes}")


if __name__ == "__main__":
    main()
