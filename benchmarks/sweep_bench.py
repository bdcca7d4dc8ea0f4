"""Sweep throughput, measured side by side in one run: entries per minute on the smoke zoo for eager and
compiled, --jobs 1 and --jobs 2, cold and warm compile cache (a fresh HF_TPU_CACHE_DIR, then the same one
again). Each configuration is a real `hf-tpu sweep` subprocess (worker start-up included), timed wall-clock.

    HF_HUB_OFFLINE=1 python benchmarks/sweep_bench.py                    # smoke zoo, all configurations
    HF_HUB_OFFLINE=1 python benchmarks/sweep_bench.py --limit 10 --configs eager-j1,compiled-cold-j1

Also prints the projection for the full built-in zoo, eager plus compiled (issue 5's targets: at most 60
minutes cold and 30 minutes warm on a 2-core machine). Not a test: the figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name -> (modes, jobs, cache): "cold" = a fresh HF_TPU_CACHE_DIR (which later "warm" runs reuse)
CONFIGS = {
    "eager-j1": ("eager", 1, "warm"),
    "eager-j2": ("eager", 2, "warm"),
    "compiled-cold-j1": ("compiled", 1, "cold"),
    "compiled-warm-j1": ("compiled", 1, "warm"),
    "compiled-cold-j2": ("compiled", 2, "cold"),
    "compiled-warm-j2": ("compiled", 2, "warm"),
    "both-warm-j2": ("eager,compiled", 2, "warm"),
}


def run_config(name: str, zoo: str, extra: list[str], work: Path, caches: dict[str, Path]) -> dict:
    modes, jobs, cache = CONFIGS[name]
    if cache == "cold" or "current" not in caches:
        caches["current"] = Path(tempfile.mkdtemp(prefix="hf-tpu-cache-", dir=work))
    cache_dir = caches["current"]
    out = work / name
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TPU_CACHE_DIR": str(cache_dir)}
    cmd = [sys.executable, "-m", "harness", "sweep", "--zoo", zoo, "--modes", modes, "--jobs", str(jobs),
           "--out", str(out), "--progress", "none", *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        return {"config": name, "error": p.stderr.strip().splitlines()[-1:] or ["?"], "wall_s": wall}
    meta = json.loads((out / "run.json").read_text())
    n = meta["entries"]
    h = meta["headline"]
    return {"config": name, "modes": modes, "jobs": jobs, "cache": cache, "entries": n, "wall_s": wall,
            "entries_per_min": 60.0 * n / wall, "crash_free": f"{h['crash_free']}/{h['counted']}",
            "numerics_match": f"{h['passed']}/{h['ran']}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default="smoke")
    ap.add_argument("--limit", type=int, default=None, help="only the first N entries of the zoo")
    ap.add_argument("--match", default=None)
    ap.add_argument("--shard", default=None, metavar="i/N", help="a spread-out sample: shard i of N of the zoo")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated among " + ", ".join(CONFIGS))
    ap.add_argument("--full-zoo-size", type=int, default=None, help="entries in the full zoo (default: counted)")
    ap.add_argument("--keep", action="store_true", help="keep the sweep outputs and caches")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}")
    extra = (["--limit", str(args.limit)] if args.limit else []) + (["--match", args.match] if args.match else []) \
        + (["--shard", args.shard] if args.shard else [])
    full = args.full_zoo_size
    if full is None:
        try:
            sys.path.insert(0, str(REPO))
            from harness.zoo import load_zoo

            full = len(load_zoo("full"))
        except Exception:  # noqa: BLE001
            full = 0
    work = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    results, caches = [], {}
    print(f"sweep benchmark: zoo {args.zoo} {' '.join(extra)}, "
          f"{os.cpu_count()} CPUs, outputs in {work}", flush=True)
    for name in names:
        r = run_config(name, args.zoo, extra, work, caches)
        results.append(r)
        if "error" in r:
            print(f"  {name:18s} FAILED after {r['wall_s']:.0f} s: {r['error'][0]}", flush=True)
        else:
            print(f"  {name:18s} {r['entries']:4d} entries in {r['wall_s']:7.1f} s = {r['entries_per_min']:6.1f}"
                  f" entries/min   crash-free {r['crash_free']}, numerics-match {r['numerics_match']}", flush=True)
    ok = {r["config"]: r for r in results if "error" not in r}
    print("\nentries/min side by side:")
    print(f"  {'config':18s} {'modes':15s} {'jobs':>4s} {'cache':>5s} {'entries/min':>11s}")
    for r in ok.values():
        print(f"  {r['config']:18s} {r['modes']:15s} {r['jobs']:4d} {r['cache']:>5s} {r['entries_per_min']:11.1f}")
    if full:
        print(f"\nprojection for the full zoo ({full} entries), eager + compiled, --jobs 2:")
        for cache in ("cold", "warm"):
            e, c = ok.get("eager-j2"), ok.get(f"compiled-{cache}-j2")
            if e and c:
                # an eager+compiled sweep runs the baseline once; eager-only plus compiled-only counts it twice,
                # so this projection is an upper bound
                minutes = full / e["entries_per_min"] + full / c["entries_per_min"]
                print(f"  {cache}: <= {minutes:.0f} min (target {'60' if cache == 'cold' else '30'})")
        if "both-warm-j2" in ok:
            print(f"  warm, measured eager+compiled: {full / ok['both-warm-j2']['entries_per_min']:.0f} min")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
