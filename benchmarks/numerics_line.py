"""Where the numerics rule draws its line: for each entry, the clean `tpu` eager run and runs with a matmul
fault of growing size (harness.sweep.canary), each judged by the sweep's rule at one precision and dtype.

  python benchmarks/numerics_line.py --precision medium [--dtype bfloat16] [--match REGEX] [--factors 1.01,1.1]

Prints one line per entry (rel rmse = rmse(fp64, tpu) / RMS(fp64), worst tensor, then "~" the agreement
rmse(cpu, tpu) / RMS(fp64); P = pass, F = fail) and a
summary: clean false failures, and per fault factor the share of the entries it changes that the rule fails.
Built, baseline and reference once per entry; the backend runs are side by side in this one process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="highest", choices=("highest", "high", "medium"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--zoo", default="smoke")
    p.add_argument("--match", default=None)
    p.add_argument("--shard", default=None, metavar="I/N", help="the sweep's shard I of N of the selection")
    p.add_argument("--factors", default="1.003,1.01,1.03,1.1")
    p.add_argument("--family", default="matmul", choices=("matmul", "conv", "all"))
    p.add_argument("--no-emulate", action="store_true", help="CPU baseline at full float32 instead of the tpu's "
                   "matmul precision (harness.sweep.emulate; what the sweep did before)")
    args = p.parse_args()

    import torch

    import hf_tpu  # noqa: F401
    from harness.sweep import canary, draws, emulate, numerics
    from harness.sweep.runner import output_tensors, prepare_inputs, prepare_model, to_cpu
    from harness.zoo import load_zoo

    factors = [float(f) for f in args.factors.split(",")]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    low = dtype if dtype != torch.float32 else None
    overrides = numerics.load_overrides(None)
    entries = [e for e in load_zoo(args.zoo) if not args.match or re.search(args.match, e.id)]
    if args.shard:
        from harness.sweep.entries import parse_shard, shard

        entries = shard(entries, parse_shard(args.shard))
    clean_fail, changed, caught = [], dict.fromkeys(factors, 0), dict.fromkeys(factors, 0)
    print(f"# precision {args.precision}, dtype {args.dtype}, fault family {args.family}, factors {factors}")
    print("entry | reference | clean rel rmse | " + " | ".join(f"x{f:g}" for f in factors))
    for e in entries:
        t0 = time.perf_counter()
        tol = numerics.tolerance_for(e.id, args.precision, args.dtype, overrides)
        try:
            b = e.build(0)
            with torch.no_grad():
                torch.manual_seed(0)
                bm = prepare_model(b.model, None, low) if low else b.model
                with emulate.matmul_precision("highest" if args.no_emulate else args.precision), draws.shared_draws(0):
                    ref = to_cpu(output_tensors(b.call(bm, prepare_inputs(b.inputs, None, low))))
                torch.manual_seed(0)
                with emulate.cpu_reference(), draws.shared_draws(0):
                    fp64 = to_cpu(output_tensors(b.call(prepare_model(b.model, None, torch.float64),
                                                    prepare_inputs(b.inputs, None, torch.float64))))
        except Exception as exc:  # noqa: BLE001
            print(f"{e.id} | baseline failed: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
            continue
        valid, _ = numerics.reference_valid(ref, fp64, tol)
        judge = fp64 if valid else None

        def run(fault, b=b):
            torch.set_float32_matmul_precision(args.precision)
            ctx = canary.inject(canary.Fault(args.family, fault)) if fault else contextlib.nullcontext()
            with torch.no_grad(), ctx, draws.shared_draws(0):
                torch.manual_seed(0)
                m = prepare_model(b.model, "tpu", low)
                return to_cpu(output_tensors(b.call(m, prepare_inputs(b.inputs, "tpu", low))))

        try:
            clean = run(None)
            c = numerics.compare_outputs(ref, clean, judge, tol)
            cells = []
            for f in factors:
                faulty = run(f)
                cf = numerics.compare_outputs(ref, faulty, judge, tol)
                outcome = canary.outcome(cf.match, faulty, clean)
                if outcome != "untouched" and c.match:
                    changed[f] += 1
                    caught[f] += outcome == "caught"
                cells.append(f"{'P' if cf.match else 'F'} {cf.rel_rmse:.2g} ~{cf.agree_rmse:.2g}" + (" (untouched)" if outcome == "untouched" else ""))
        except Exception as exc:  # noqa: BLE001
            print(f"{e.id} | tpu failed: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
            continue
        if not c.match:
            clean_fail.append(f"{e.id}: {c.reason[:160]}")
        print(f"{e.id} | {'valid' if valid else 'invalid'} | {'P' if c.match else 'F'} {c.rel_rmse:.2g} ~{c.agree_rmse:.2g} | "
              + " | ".join(cells) + f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
    print(f"\nclean false failures: {len(clean_fail)} {clean_fail}")
    for f in factors:
        pct = 100.0 * caught[f] / changed[f] if changed[f] else float("nan")
        print(f"fault x{f:g}: caught {caught[f]}/{changed[f]} ({pct:.1f}%) of clean-passing entries it changes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
