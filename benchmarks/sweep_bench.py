"""Sweep throughput, measured side by side in one run: entries per minute for eager and compiled, --jobs 1
and --jobs 2, cold and warm caches (a fresh HF_TPU_CACHE_DIR, which holds the XLA cache, the graph cache and
the sweep timings, then the same one again). Each configuration is a real `hf-tpu sweep` subprocess (worker
start-up included), timed wall-clock.

    HF_HUB_OFFLINE=1 python benchmarks/sweep_bench.py --zoo full --sample 160     # full-zoo projection
    HF_HUB_OFFLINE=1 python benchmarks/sweep_bench.py                    # smoke zoo, all configurations
    HF_HUB_OFFLINE=1 python benchmarks/sweep_bench.py --limit 10 --configs eager-j1,compiled-cold-j1
    HF_HUB_OFFLINE=1 nice python benchmarks/sweep_bench.py --zoo full --shards 1,11,21,31/40 \
        --work reports/tmp-bench --retry-timeouts                 # issue 13's fixed sample, cold then warm

`--shards I,J,.../N` runs the union of those shards of the zoo as one sweep (the same entries as
`hf-tpu sweep --shard I/N` for each I), with the same default configurations as --sample. `--retry-timeouts`
re-runs, after each configuration, the entries that timed out (`hf-tpu sweep --resume --retry timeout`:
on a loaded machine a timeout is the load's, not the entry's), timed apart from the configuration's wall-clock,
so the results are complete. `--work DIR` keeps every output and cache there.

`--sample N` runs a spread-out sample of at least N entries (shard 1 of len(zoo)//N of the id-sorted zoo,
so every library and family is represented) with the both-cold-j2 and both-warm-j2 configurations, and
projects the full built-in zoo's time, eager plus compiled, --jobs 2 (issue 15's targets: at most 120
minutes cold and 60 warm on this 2-core machine). It also sums the per-phase seconds the sweep records
(timings.jsonl: build, baseline, reference, eager, compiled) to show where the time goes. Not a test: the
figures depend on the machine's load (report the spread of repeated runs).
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
    "both-cold-j2": ("eager,compiled", 2, "cold"),
    "both-warm-j2": ("eager,compiled", 2, "warm"),
    # the same warm run without the graph cache (the XLA cache only): what the graph cache saves
    "both-warm-nograph-j2": ("eager,compiled", 2, "warm-nograph"),
}


def run_config(name: str, zoo: str, extra: list[str], work: Path, caches: dict[str, Path],
               retry_timeouts: bool = False) -> dict:
    modes, jobs, cache = CONFIGS[name]
    if cache == "cold" or "current" not in caches:  # a cold run always starts from a fresh directory
        caches["current"] = Path(tempfile.mkdtemp(prefix="hf-tpu-cache-", dir=work))
    cache_dir = caches["current"]
    out = work / name
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TPU_CACHE_DIR": str(cache_dir),
           "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "torch")}
    for var in ("HF_TPU_GRAPH_CACHE_DIR", "HF_TPU_SHARED_CACHE_DIR", "HF_TPU_SWEEP_TIMINGS"):
        env.pop(var, None)  # everything under the one (fresh or reused) cache directory
    env["HF_TPU_COMPILE_CACHE"] = "0" if cache == "warm-nograph" else "1"
    cmd = [sys.executable, "-m", "harness", "sweep", "--zoo", zoo, "--modes", modes, "--jobs", str(jobs),
           "--out", str(out), "--progress", "none", *extra]
    digest = graph_key_digest()
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if graph_key_digest() != digest:
        print(f"  WARNING: hf_tpu sources the graph cache keys on changed during {name}", flush=True)
    if p.returncode != 0:
        return {"config": name, "error": p.stderr.strip().splitlines()[-1:] or ["?"], "wall_s": wall}
    meta = json.loads((out / "run.json").read_text())
    timeouts = _timeouts(out)
    retried = {"timeouts": len(timeouts), "timeouts_after_retry": len(timeouts), "retry_s": 0.0}
    summary = phase_summary(out)  # before the retry appends to timings.jsonl
    if retry_timeouts and timeouts:
        t1 = time.monotonic()
        timeout = extra[extra.index("--timeout"):][:2] if "--timeout" in extra else []
        subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", "--retry", "timeout", "--out", str(out),
                        "--jobs", str(jobs), "--progress", "none", *timeout], cwd=REPO, env=env, capture_output=True,
                       text=True)
        retried.update(retry_s=time.monotonic() - t1, timeouts_after_retry=len(_timeouts(out)),
                       retried_ids=timeouts)
        meta = json.loads((out / "run.json").read_text())
    n = meta["entries"]
    h = meta["headline"]
    return {"config": name, "modes": modes, "jobs": jobs, "cache": cache, "entries": n, "wall_s": wall,
            "entries_per_min": 60.0 * n / wall, "crash_free": f"{h['crash_free']}/{h['counted']}",
            "numerics_match": f"{h['passed']}/{h['ran']}", "out": str(out), **retried, **summary}


# the hf_tpu sources the graph cache keys on (hf_tpu/compile_cache/keys.py): a commit to one of them between the
# cold and the warm configuration makes every saved graph miss, so that "warm" run is graph-cold
def graph_key_digest() -> str:
    from hf_tpu.compile_cache.keys import sources_digest

    return sources_digest(REPO / "hf_tpu")


def _timeouts(out: Path) -> list[str]:
    import csv

    try:
        with open(out / "results.csv") as f:
            return sorted({r["entry_id"] for r in csv.DictReader(f) if r["status"] == "timeout"})
    except OSError:
        return []


def phase_summary(out: Path) -> dict:
    """Seconds per phase summed over the entries (timings.jsonl), the entry seconds' median, p90 and max."""
    phases: dict[str, float] = {}
    cpu_phases: dict[str, float] = {}
    totals: list[float] = []
    cpu = 0.0
    try:
        lines = (out / "timings.jsonl").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        rec = json.loads(line)
        totals.append(rec["seconds"])
        for k, v in rec.get("phases", {}).items():
            if k == "cpu":  # worker CPU seconds, not a wall-clock phase
                cpu += v
            else:
                phases[k] = phases.get(k, 0.0) + v
        for k, v in rec.get("cpu_phases", {}).items():
            cpu_phases[k] = cpu_phases.get(k, 0.0) + v
    if not totals:
        return {}
    totals.sort()
    return {"phases": phases, "cpu_phases": cpu_phases, "cpu_s": cpu, "entry_median_s": totals[len(totals) // 2],
            "entry_p90_s": totals[min(len(totals) - 1, int(0.9 * len(totals)))], "entry_max_s": totals[-1],
            "longest": [json.loads(x)["entry_id"] for x in sorted(lines, key=lambda x: -json.loads(x)["seconds"])[:5]]}


def shards_match(zoo: str, spec: str) -> str:
    """A --match regex selecting exactly the entries of shards I,J,... of N (the sweep's own sharding)."""
    import re

    sys.path.insert(0, str(REPO))
    from harness.sweep.entries import parse_shard, shard
    from harness.zoo import load_zoo

    which, _, n = spec.rpartition("/")
    entries = list(load_zoo(zoo))
    ids = sorted(e.id for i in which.split(",") for e in shard(entries, parse_shard(f"{i}/{n}")))
    return "^(" + "|".join(re.escape(i) for i in ids) + ")$"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default="smoke")
    ap.add_argument("--limit", type=int, default=None, help="only the first N entries of the zoo")
    ap.add_argument("--match", default=None)
    ap.add_argument("--shard", default=None, metavar="i/N", help="a spread-out sample: shard i of N of the zoo")
    ap.add_argument("--sample", type=int, default=None, metavar="N",
                    help="at least N entries spread over the zoo; default configs both-cold-j2,both-warm-j2")
    ap.add_argument("--shards", default=None, metavar="I,J,.../N",
                    help="the union of these shards of N as one sweep (e.g. 1,11,21,31/40: issue 13's sample)")
    ap.add_argument("--retry-timeouts", action="store_true",
                    help="after each configuration, run its timed-out entries again (timed apart)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="the sweep's --timeout per entry and phase (default the sweep's, 300 s): on a loaded machine "
                         "a longer one keeps entries from timing out, whose CPU seconds would be missing from the "
                         "projection")
    ap.add_argument("--phases", default=None,
                    help="the sweep's --phases (e.g. inference,train: issue 27's target is both phases in 120 min warm)")
    ap.add_argument("--work", default=None, help="keep outputs and caches in this directory")
    ap.add_argument("--configs", default=None, help="comma-separated among " + ", ".join(CONFIGS))
    ap.add_argument("--full-zoo-size", type=int, default=None, help="entries in the full zoo (default: counted)")
    ap.add_argument("--cache", default=None, metavar="DIR",
                    help="an existing HF_TPU_CACHE_DIR the warm configurations reuse (e.g. the one a full cold sweep "
                         "filled), instead of the one this run's cold configuration fills")
    ap.add_argument("--keep", action="store_true", help="keep the sweep outputs and caches")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    default = "both-cold-j2,both-warm-j2" if (args.sample or args.shards) else ",".join(
        c for c in CONFIGS if c not in ("both-cold-j2", "both-warm-nograph-j2"))
    names = [c.strip() for c in (args.configs or default).split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}")
    full = args.full_zoo_size
    if full is None:
        try:
            sys.path.insert(0, str(REPO))
            from harness.zoo import load_zoo

            full = len(load_zoo("full"))
        except Exception:  # noqa: BLE001
            full = 0
    if args.sample:
        if not full:
            ap.error("--sample needs the full zoo's size (--full-zoo-size)")
        args.shard = f"1/{max(1, full // args.sample)}"
    if args.shards:
        if args.match or args.shard or args.sample:
            ap.error("--shards cannot be combined with --match, --shard or --sample")
        args.match = shards_match(args.zoo, args.shards)
    extra = (["--limit", str(args.limit)] if args.limit else []) + (["--match", args.match] if args.match else []) \
        + (["--shard", args.shard] if args.shard else []) + (["--phases", args.phases] if args.phases else []) \
        + (["--timeout", f"{args.timeout:g}"] if args.timeout else [])
    if args.work:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        args.keep = True
    else:
        work = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    results, caches = [], {}
    if args.cache:
        if not Path(args.cache, "graphs").is_dir():
            ap.error(f"--cache {args.cache}: no graphs/ inside, not an HF_TPU_CACHE_DIR a sweep has filled")
        caches["current"] = Path(args.cache).resolve()
    shown = [x if len(x) < 80 else f"<{args.shards or 'regex'}>" for x in extra]
    print(f"sweep benchmark: zoo {args.zoo} {' '.join(shown)}, "
          f"{os.cpu_count()} CPUs, outputs in {work}", flush=True)
    for name in names:
        digest = graph_key_digest()
        if CONFIGS[name][2] == "cold":
            caches["digest"] = digest
        elif caches.get("digest") not in (None, digest):
            print(f"  WARNING: hf_tpu's graph-keyed sources changed since the cold run: {name} misses every saved "
                  "graph (Dynamo and AOTAutograd run again); its figure is not a warm one", flush=True)
        r = run_config(name, args.zoo, extra, work, caches, args.retry_timeouts)
        results.append(r)
        if "error" in r:
            print(f"  {name:18s} FAILED after {r['wall_s']:.0f} s: {r['error'][0]}", flush=True)
        else:
            print(f"  {name:18s} {r['entries']:4d} entries in {r['wall_s']:7.1f} s = {r['entries_per_min']:6.1f}"
                  f" entries/min   crash-free {r['crash_free']}, numerics-match {r['numerics_match']}", flush=True)
            if r.get("phases"):
                tot = sum(r["phases"].values()) or 1.0
                shares = ", ".join(f"{k} {v:.0f} s ({100 * v / tot:.0f}%)"
                                   for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1]))
                print(f"  {'':18s} worker-seconds per phase: {shares}")
                if r.get("cpu_phases"):
                    tot = sum(r["cpu_phases"].values()) or 1.0
                    shares = ", ".join(f"{k} {v:.0f} s ({100 * v / tot:.0f}%)"
                                       for k, v in sorted(r["cpu_phases"].items(), key=lambda kv: -kv[1]))
                    print(f"  {'':18s} worker CPU seconds per phase: {shares}")
                if r.get("timeouts"):
                    print(f"  {'':18s} {r['timeouts']} entries timed out"
                          + (f"; run again in {r['retry_s']:.0f} s (not in the wall-clock above): "
                             f"{r['timeouts_after_retry']} still time out" if r.get("retried_ids") else ""))
                print(f"  {'':18s} per entry: median {r['entry_median_s']:.1f} s, p90 {r['entry_p90_s']:.1f} s, "
                      f"max {r['entry_max_s']:.1f} s; longest {', '.join(r['longest'][:3])}", flush=True)
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
        for name, target in (("both-cold-j2", 120), ("both-warm-j2", 60), ("both-warm-nograph-j2", 60)):
            if name in ok:
                r = ok[name]
                print(f"  {name}, measured eager+compiled on {r['entries']} entries: "
                      f"{full / r['entries_per_min']:.0f} min wall-clock (target <= {target})")
                if r.get("cpu_s"):
                    # on a machine with jobs free cores the workers' CPU seconds are the wall-clock floor
                    minutes = r["cpu_s"] * full / r["entries"] / r["jobs"] / 60
                    print(f"  {'':14s} from worker CPU seconds ({r['cpu_s']:.0f} s over {r['entries']} entries, "
                          f"/{r['jobs']} jobs): {minutes:.0f} min on {r['jobs']} free cores")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
