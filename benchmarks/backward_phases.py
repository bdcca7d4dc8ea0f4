"""A compiled training step's phases, one process per setting of the backward's pieces (hf_tpu/backward_pieces.py):
forward, backward and optimizer wall and CPU-seconds, the backward's minor page faults, each piece's CPU-ms, and
the process's peak RSS.

  python benchmarks/backward_phases.py [--model gpt2] [--steps 6] [--settings pieces,whole]

GPT-2 124M (finetune_step.py's model, AdamW(fused=True), bfloat16 autocast, 4 x 128) under
torch.compile(backend="tpu"); "pieces" is the default plan, "whole" sets HF_TPU_BACKWARD_PIECE_BYTES so that
every backward is one program. Printed per setting: medians over the steps after the first two (compiles),
min-max in brackets. Not a test: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import torch, transformers
import hf_tpu
from hf_tpu import backward_pieces
from finetune_step import build
torch.set_float32_matmul_precision("highest")
transformers.utils.logging.set_verbosity_error()
pieces = []
run_piece = backward_pieces._Runner.call_module
def timed(self, target, args, kwargs):
    c = time.process_time()
    out = run_piece(self, target, args, kwargs)
    pieces.append(time.process_time() - c)
    return out
backward_pieces._Runner.call_module = timed
model = build(sys.argv[1]).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
fwd = torch.compile(model, backend="tpu")
ids = torch.randint(0, model.config.vocab_size, (4, 128)).to("tpu")
def now():
    return time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(int(sys.argv[3])):
    pieces.clear()
    t0 = now()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = fwd(input_ids=ids, labels=ids).loss
    loss.item()
    t1 = now()
    loss.backward()
    next(p for p in model.parameters() if p.grad is not None).grad.sum().item()  # the backward has finished
    t2 = now()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    t3 = now()
    print(json.dumps({"fwd": [t1[0] - t0[0], t1[1] - t0[1]], "bwd": [t2[0] - t1[0], t2[1] - t1[1]],
                      "opt": [t3[0] - t2[0], t3[1] - t2[1]], "bwd_faults": t2[2] - t1[2], "pieces": pieces,
                      "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}), flush=True)
"""

SETTINGS = {"pieces": {}, "whole": {"HF_TPU_BACKWARD_PIECE_BYTES": str(10**11)}}


def _span(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--settings", default="pieces,whole")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    print("| setting | forward s / CPU-s | backward s / CPU-s | backward page faults | optimizer CPU-s | "
          "pieces (CPU-ms each, last step) | peak RSS GB |\n|---|---|---|---|---|---|---|")
    for name in args.settings.split(","):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **SETTINGS[name]}
        proc = subprocess.run([sys.executable, "-c", CHILD, args.model, here, str(args.steps)],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"| {name} | failed: {proc.stderr[-500:]!r} |")
            continue
        steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")][2:]
        col = lambda key, i: [s[key][i] for s in steps]  # noqa: E731
        print(f"| {name} | {_span(col('fwd', 0))} / {_span(col('fwd', 1))} | {_span(col('bwd', 0))} / "
              f"{_span(col('bwd', 1))} | {_span([s['bwd_faults'] / 1e3 for s in steps], '{:.0f}')}k | "
              f"{_span(col('opt', 1))} | {len(steps[-1]['pieces']) or 1}: "
              f"{' '.join(f'{p * 1e3:.0f}' for p in steps[-1]['pieces'])} | {steps[-1]['rss_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
