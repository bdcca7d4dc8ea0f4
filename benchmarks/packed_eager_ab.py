"""Strict eager with and without packed weights (hf_tpu/packed_eager.py), paired with CPU eager in one process.

  python benchmarks/packed_eager_ab.py [--model gpt2] [--rounds 12] [--quiet]

One process builds the model of eager_bench.MODELS on CPU and two tpu copies; each round runs one forward (no
grad, no cache, precision "highest", `.logits.cpu()`) of CPU eager, tpu Strict eager with packing off, and tpu
Strict eager with packing on (its own copy: its weights are packed, their arrays dropped), in an order reversed
every round. It prints, per variant, the median wall and CPU-seconds (the whole process's, all threads) per
forward and the median (min-max) of the per-round ratios to CPU eager, and the logits' largest difference from
CPU's. The first three rounds (programs compiled, weights watched, then packed) are not counted. `--quiet`
starts a round only once the host's other work leaves both cores >= 85% idle for half a second (up to 2 min).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _idle() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def wait_quiet(limit: float = 120.0) -> bool:
    """True once the host's CPUs were >= 85% idle over half a second; False after `limit` seconds."""
    t0 = time.time()
    while time.time() - t0 < limit:
        i0, s0 = _idle()
        time.sleep(0.5)
        i1, s1 = _idle()
        if (i1 - i0) / max(1, s1 - s0) >= 0.85:
            return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--quiet", action="store_true", help="start each round on an idle host only")
    args = ap.parse_args()

    import torch

    torch.set_float32_matmul_precision("highest")
    import hf_tpu  # noqa: F401 - the tpu device
    from benchmarks.eager_bench import MODELS, build
    from hf_tpu import packed_weights

    if not packed_weights.available():
        raise SystemExit("packed weights are unavailable here (no MKL in this PyTorch, or not XLA:CPU)")
    cpu = build(args.model)
    models = {"cpu": cpu, "tpu": copy.deepcopy(cpu).to("tpu"), "tpu-packed": copy.deepcopy(cpu).to("tpu")}
    ids = torch.randint(0, cpu.config.vocab_size, (1, MODELS[args.model][3]))
    inputs = {"cpu": ids, "tpu": ids.to("tpu"), "tpu-packed": ids.to("tpu")}

    def forward(name: str) -> tuple[float, float, torch.Tensor]:
        packed_weights.ENABLED = name == "tpu-packed"  # read by packed_eager on every product
        w, c = time.perf_counter(), time.process_time()
        out = models[name](inputs[name], use_cache=False).logits.cpu()
        return time.perf_counter() - w, time.process_time() - c, out

    names = list(models)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    busy = 0
    calls = packed_weights.calls()
    with torch.no_grad():
        want = cpu(ids, use_cache=False).logits
        for i in range(args.rounds + 3):
            if i >= 3 and args.quiet and not wait_quiet():
                busy += 1
            got = {n: forward(n) for n in (names if i % 2 == 0 else names[::-1])}
            if i >= 3:
                for n in names:
                    times[n].append(got[n][:2])
            diffs = {n: float((got[n][2] - want).abs().max()) for n in names if n != "cpu"}
    calls = packed_weights.calls() - calls
    for n in names:
        wall = [t[0] / c[0] for t, c in zip(times[n], times["cpu"], strict=True)]
        cpu_s = [t[1] / c[1] for t, c in zip(times[n], times["cpu"], strict=True)]
        print(f"{n:11s} wall {statistics.median(t[0] for t in times[n]) * 1e3:7.1f} ms  "
              f"CPU {statistics.median(t[1] for t in times[n]) * 1e3:7.1f} ms  "
              f"vs CPU eager: wall {statistics.median(wall):.3f} ({min(wall):.2f}-{max(wall):.2f})  "
              f"CPU-s {statistics.median(cpu_s):.3f} ({min(cpu_s):.2f}-{max(cpu_s):.2f})")
    print(f"logits max|diff| vs CPU eager: {diffs}; packed products {calls}; rounds started on a busy host {busy}")


if __name__ == "__main__":
    main()
