"""Where a compiled inference forward's time goes: XLA's own per-thunk profile of torch.compile(backend="tpu").

  python benchmarks/profile_compiled.py [--model gpt2] [--repeats 10]

One process builds the model (eager_bench.py's MODELS: seeded, offline, precision "highest", default threads),
moves it to tpu, compiles it, warms it up and times `--repeats` forwards with their `.logits.cpu()` (wall and
process CPU-ms). Then it records as many more under JAX's profiler (jax.profiler.trace) and reads the trace
with jax.profiler.ProfileData: XLA:CPU's thunk executor records one event per thunk (a fusion, a dot, a
custom call) on the thread that ran it, and the optimised HLO of the graph's program (dumped by XLA itself:
--xla_dump_to) names what each fusion computes. Printed, per forward:

  - the forward, the XLA program (the wait in graph_compiler), the logits' `.cpu()`, and the Python around
    them (Dynamo's guards, AOTAutograd's wrappers, graph_compiler's argument and output handling);
  - the program's thunks by class: each dot by its output shape, each other fusion by the set of HLO ops it
    fuses (`elt:` elementwise, `reduce:` with a reduction), ms and count per forward.

A dot's thunk time is its wall time on the thread that ran it; YNNPACK runs each dot's tasks over XLA's whole
pool, so the classes' ms add up to about the program's wall time (independent thunks may overlap), not its
CPU time. The profiler costs wall time of its own, most in Python (the logits' `.cpu()`: ~5 ms traced, ~2
untraced for GPT-2); the untraced figures come first. Not a test; issue 31's note quotes it.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_DUMP = tempfile.mkdtemp(prefix="profile_compiled_")
# before JAX starts: XLA reads its flags once. Only the graph programs' HLO (jax.jit of graph_compiler's
# with_precision), after optimisation.
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={_DUMP}",
                                    "--xla_dump_hlo_as_text", "--xla_dump_hlo_module_re=.*with_precision.*"]).strip()

from eager_bench import MODELS, build  # noqa: E402


def fusion_classes(hlo: str) -> dict[str, str]:
    """Instruction name -> its class, for the entry computation of an optimised HLO module's text."""
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^(%\S+) .*?\{\n(.*?)\n\}", hlo, re.S | re.M)}
    classes = {}
    for line in hlo[hlo.index("\nENTRY"):].splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\(.*?\)(.*)", line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        called = re.search(r"calls=(%[^,\s]+)", rest)
        if op == "fusion" and called:
            ops = set(re.findall(r"= \S+ ([\w-]+)\(", bodies.get(called.group(1), "")))
            ops -= {"parameter", "constant", "bitcast", "broadcast"}
            if "dot" in ops:
                op = f"dot {shape.split('{')[0]}"
            else:
                op = ("reduce:" if "reduce" in ops else "elt:") + ",".join(sorted(ops))
        elif op == "dot":
            op = f"dot {shape.split('{')[0]}"
        classes[name] = op
    return classes


def thunk_times(trace_dir: str) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:
    """(ms per thunk name, calls per thunk name, ms per Python event name) summed over the trace."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
    ms: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    python: dict[str, float] = collections.defaultdict(float)
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if line.name == "python":
                    python[ev.name] += ev.duration_ns / 1e6
                elif line.name.startswith("tf_XLAEigen") and not ev.name.startswith(
                        ("ThunkExecutor", "end:", "SlinkyThreadPool", "ThreadpoolListener")):
                    ms[ev.name] += ev.duration_ns / 1e6
                    calls[ev.name] += 1
    return ms, calls, python


def _python_ms(python: dict[str, float], pattern: str) -> float:
    """The largest total among the Python events whose name ends as `pattern` (a regex; line numbers vary)."""
    return max((v for k, v in python.items() if re.search(pattern + "$", k)), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    import torch

    torch.set_float32_matmul_precision("highest")
    import hf_tpu  # noqa: F401 - the device
    from hf_tpu import runtime

    jax = runtime.jax()
    model = build(args.model)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, MODELS[args.model][3])).to("tpu")
    compiled = torch.compile(model.to("tpu"), backend="tpu")

    def forward() -> Any:
        return compiled(ids, use_cache=False).logits.cpu()

    walls, cpus = [], []
    with torch.no_grad():
        for _ in range(3):
            forward()
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            forward()
            walls.append((time.perf_counter() - t) * 1e3)
            cpus.append((time.process_time() - c) * 1e3)
        trace_dir = tempfile.mkdtemp(prefix="profile_compiled_trace_")
        with jax.profiler.trace(trace_dir):
            for _ in range(args.repeats):
                forward()
    n = args.repeats
    ms, calls, python = thunk_times(trace_dir)
    hlo_files = sorted(glob.glob(f"{_DUMP}/*with_precision*cpu_after_optimizations.txt"))
    classes: dict[str, str] = {}
    for f in hlo_files:  # a later module's names win: the steady-state program is the last compiled
        classes.update(fusion_classes(open(f).read()))
    by_class: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name, t in ms.items():
        cls = classes.get(name, re.sub(r"\.\d+$", "", name))
        by_class[cls][0] += t / n
        by_class[cls][1] += calls[name] / n
    program = _python_ms(python, r"api\.py:\d+ block_until_ready") / n
    call = _python_ms(python, r"graph_compiler\.py:\d+ call") / n or program
    copy = _python_ms(python, r"host_copy\.py:\d+ copy_to_cpu") / n
    whole = _python_ms(python, r"eval_frame\.py:\d+ __call__") / n
    print(f"{args.model}: compiled forward + .logits.cpu(), {n} forwards: wall {statistics.median(walls):.1f} ms "
          f"({min(walls):.1f}-{max(walls):.1f}), process CPU {statistics.median(cpus):.1f} ms, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"traced, ms per forward: XLA program {program:.1f}; `.cpu()` {copy:.1f}; Python outside the program "
          f"{max(whole - program, 0.0):.1f} (graph_compiler.call {call - program:.1f})")
    total = sum(v[0] for v in by_class.values())
    print(f"thunks, ms per forward ({total:.1f} in all; {len(hlo_files)} graph program(s) in {_DUMP}):")
    for cls, (t, c) in sorted(by_class.items(), key=lambda kv: -kv[1][0]):
        if t >= 0.005:
            print(f"  {t:8.2f}  {100 * t / total:5.1f}%  {c:6.1f} x  {cls}")


if __name__ == "__main__":
    main()
