"""Eager mode at real size: tpu against CPU eager, side by side in one run, each model in its own process.

  python benchmarks/eager_bench.py [--rounds 3] [--repeats 5] [--models gpt2,qwen3-wide,tiny-llama]
                                   [--fused] [--compiled] [--train]

For each model and round, one fresh process per device builds the model from its config (seeded, offline),
moves it with `.to(device)`, and runs the forward (no grad, no cache) once to warm up and then `--repeats`
times. It reports the median steady-state forward time and the process's peak RSS (build, move and
forwards included). Rounds alternate CPU and tpu so that a busy machine slows both alike; the printed
ratios are the median over rounds, with their spread (min-max). The "paired" line times CPU, tpu (and
fused) forwards alternately in one process, pair by pair, which is steadier on a shared machine. Precision is "highest", so the tpu and
CPU do the same arithmetic.

With `--cpu-seconds` the paired ratios are of CPU-seconds (the process's user+sys time per forward, all
threads) instead of wall time: on a loaded machine wall time measures the load, CPU-seconds the work. The
paired process then runs with OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP threads otherwise spin after each
parallel region (libgomp's default), which costs nothing on an idle core but counts as CPU-seconds, and on a
busy machine inflated CPU eager's CPU-seconds up to ~25x for a tiny Llama's matmuls (3.3 CPU-ms per forward
passive, 218 spinning, measured this session); it changes no result. Targets (issue: the device at real size):

  GPT-2 124M (default GPT2Config, 1 x 64 tokens)        time tpu/CPU <= 1.5, peak RSS tpu/CPU <= 1.3
  Qwen3-0.6B widths, 2 layers (187M params, 1 x 64)     peak RSS tpu/CPU <= 1.3
  tiny Llama (hidden 64, 2 layers, 1 x 16)              time tpu/CPU <= 5
  per-op dispatch, 1,000 x `a + b` (16 elements)        no slower than 57 us

With `--fused`, each model also runs in fused eager mode (TORCH_TPU_DEFER_AND_FUSE=1) and the ratios
Strict/fused (steady state and first call) and fused/CPU are printed. Targets (issue: fused eager mode):
fused at least 5x faster than Strict on the tiny Llama; GPT-2 124M fused no slower than CPU eager.

With `--compiled`, each model also runs as `torch.compile(model, backend="tpu")` (its own processes, and a
compiled forward in the paired process). With `--train`, each model (not the tiny Llama) also takes training
steps (forward with labels, backward, AdamW(fused=True), bfloat16 autocast, batch 4 x 128) on CPU, tpu eager
and tpu compiled, through finetune_step.py, `--rounds` processes each. The summary table at the end puts
everything side by side against CPU eager. Targets (issue 31, default threads): inference eager <= 1.1x CPU
time, compiled <= 0.9x; training step eager <= 1.2x, compiled <= 1.0x; peak RSS <= 1.1x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}, 64),
    "qwen3-wide": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        vocab_size=151936, tie_word_embeddings=True, num_hidden_layers=2), 64),
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, max_position_embeddings=128), 16),
}


def build(model: str):  # noqa: ANN201 - a Transformers model
    """The model of MODELS[model] on CPU in eval mode, seeded (the profile scripts build theirs here)."""
    import torch
    import transformers

    cfg, cls, kwargs, _ = MODELS[model]
    torch.manual_seed(0)
    return getattr(transformers, cls)(getattr(transformers, cfg)(**kwargs)).eval()


# Both child scripts start alike: the arguments, precision, threads, seed, and the model built on CPU.
PRELUDE = r"""
import copy, json, os, resource, statistics, sys, time
import torch, transformers
torch.set_float32_matmul_precision("highest")
cfg_name, cls_name, kwargs, seq, threads, *rest = json.loads(sys.argv[1])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
cpu = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**kwargs)).eval()
"""

ONE_RUN = PRELUDE + r"""
device, repeats = rest
dev = device.split("-")[0]  # tpu-fused, tpu-compiled: the tpu
model = cpu.to(dev)
ids = torch.randint(0, model.config.vocab_size, (1, seq)).to(dev)
if device == "tpu-compiled":
    model = torch.compile(model, backend="tpu")
times = []
with torch.no_grad():
    for i in range(repeats + 2):
        t = time.perf_counter()
        model(ids, use_cache=False).logits.cpu()
        times.append(time.perf_counter() - t)
# steady state from the third call: the second can still trace (a decomposition traced as one program)
print(json.dumps({"first_s": times[0], "steady_s": statistics.median(times[2:]),
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


# Time ratios also come from one process that alternates a CPU forward and a tpu forward of the same model,
# pair after pair: on a shared machine the load drifts over seconds, and a pair sees the same load, so the
# median of per-pair ratios is steadier than a ratio of two processes' medians (which run at different times).
PAIRED = PRELUDE + r"""
repeats, fused, compiled = rest
import hf_tpu
tpu = copy.deepcopy(cpu).to("tpu")
# the compiled model is a copy of its own: a compiled inference graph drops the arrays of the weights it packs
# (hf_tpu/packed_weights.py), and eager forwards of the same weights would read them back and end the packing
comp = torch.compile(copy.deepcopy(cpu).to("tpu"), backend="tpu") if compiled else None
ids = torch.randint(0, cpu.config.vocab_size, (1, seq))
ids_t = ids.to("tpu")
ratios, fratios, cratios = [], [], []
clock = time.process_time if os.environ.get("EAGER_BENCH_CPU_SECONDS") == "1" else time.perf_counter
def fwd(m, x):
    t = clock()
    m(x, use_cache=False).logits.cpu()
    return clock() - t
with torch.no_grad():
    for i in range(repeats + 2):
        c, t = fwd(cpu, ids), fwd(tpu, ids_t)
        if fused:
            with hf_tpu.defer_and_fuse():
                f = fwd(tpu, ids_t)
        if compiled:
            k = fwd(comp, ids_t)
        if i >= 2:  # the first two: compiles and plans
            ratios.append(t / c)
            if fused:
                fratios.append((t / f, f / c))
            if compiled:
                cratios.append(k / c)
print(json.dumps({"tpu_cpu": statistics.median(ratios),
                  "compiled_cpu": statistics.median(cratios) if compiled else None,
                  "strict_fused": statistics.median(r[0] for r in fratios) if fused else None,
                  "fused_cpu": statistics.median(r[1] for r in fratios) if fused else None}))
"""


def run_paired(model: str, repeats: int, threads: int, fused: bool, compiled: bool = False,
               cpu_seconds: bool = False) -> dict[str, float]:
    """Per-pair ratios of the alternating process; of CPU-seconds (OpenMP threads passive) with cpu_seconds."""
    cfg, cls, kwargs, seq = MODELS[model]
    env = {**os.environ, "TORCH_TPU_DEFER_AND_FUSE": "0"}
    if cpu_seconds:
        env.update(EAGER_BENCH_CPU_SECONDS="1", OMP_WAIT_POLICY="PASSIVE")
    r = subprocess.run([sys.executable, "-c", PAIRED,
                        json.dumps([cfg, cls, kwargs, seq, threads, repeats, fused, compiled])],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{model} paired run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_one(model: str, device: str, repeats: int, threads: int) -> dict[str, float]:
    """device: cpu, tpu (Strict eager), tpu-fused or tpu-compiled."""
    cfg, cls, kwargs, seq = MODELS[model]
    env = {**os.environ, "TORCH_TPU_DEFER_AND_FUSE": "1" if device == "tpu-fused" else "0"}
    r = subprocess.run([sys.executable, "-c", ONE_RUN,
                        json.dumps([cfg, cls, kwargs, seq, threads, device, repeats])],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{model} on {device} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--fused", action="store_true", help="also run fused eager mode")
    ap.add_argument("--compiled", action="store_true", help="also run torch.compile(backend='tpu')")
    ap.add_argument("--train", action="store_true", help="also time training steps (finetune_step.py)")
    ap.add_argument("--cpu-seconds", action="store_true",
                    help="paired ratios of CPU-seconds per forward (OpenMP passive) instead of wall time")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads in every process (0: PyTorch's default). On a busy machine "
                         "CPU eager with spinning OpenMP threads can be many times slower than its quiet self")
    args = ap.parse_args()
    # summary[(model, kind, mode)] = [(seconds, peak GB), ...] over rounds
    summary: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for model in args.models.split(","):
        t_ratio, m_ratio, cpu_s, tpu_s, cpu_gb, tpu_gb = [], [], [], [], [], []
        fused_rows: list[tuple[float, float, float, float]] = []
        paired: list[dict[str, float]] = []
        for _ in range(args.rounds):
            paired.append(run_paired(model, max(args.repeats, 10), args.threads, args.fused, args.compiled,
                                     args.cpu_seconds))
            c = run_one(model, "cpu", args.repeats, args.threads)
            t = run_one(model, "tpu", args.repeats, args.threads)
            summary.setdefault((model, "forward", "cpu"), []).append((c["steady_s"], c["peak_rss_gb"]))
            summary.setdefault((model, "forward", "tpu"), []).append((t["steady_s"], t["peak_rss_gb"]))
            if args.compiled:
                k = run_one(model, "tpu-compiled", args.repeats, args.threads)
                summary.setdefault((model, "forward", "tpu-compiled"), []).append((k["steady_s"], k["peak_rss_gb"]))
            cpu_s.append(c["steady_s"] * 1e3)
            tpu_s.append(t["steady_s"] * 1e3)
            cpu_gb.append(c["peak_rss_gb"])
            tpu_gb.append(t["peak_rss_gb"])
            t_ratio.append(t["steady_s"] / c["steady_s"])
            m_ratio.append(t["peak_rss_gb"] / c["peak_rss_gb"])
            if args.fused:
                f = run_one(model, "tpu-fused", args.repeats, args.threads)
                summary.setdefault((model, "forward", "tpu-fused"), []).append((f["steady_s"], f["peak_rss_gb"]))
                fused_rows.append((t["steady_s"] / f["steady_s"], t["first_s"] / f["first_s"],
                                   f["steady_s"] / c["steady_s"], f["peak_rss_gb"] / t["peak_rss_gb"]))
        print(f"{model:11s} forward ms cpu {spread(cpu_s)}  tpu {spread(tpu_s)}  tpu/cpu {spread(t_ratio)}")
        print(f"{'':11s} paired     tpu/cpu {spread([p['tpu_cpu'] for p in paired])}" + (
              f"  strict/fused {spread([p['strict_fused'] for p in paired])}  fused/cpu "
              f"{spread([p['fused_cpu'] for p in paired])}" if args.fused else "") + (
              f"  compiled/cpu {spread([p['compiled_cpu'] for p in paired])}" if args.compiled else "")
              + ("  (alternating forwards, one process, CPU-seconds, OpenMP passive)" if args.cpu_seconds
                 else "  (alternating forwards, one process)"))
        print(f"{'':11s} peak GB    cpu {spread(cpu_gb)}  tpu {spread(tpu_gb)}  tpu/cpu {spread(m_ratio)}",
              flush=True)
        if fused_rows:
            cols = list(zip(*fused_rows, strict=True))
            print(f"{'':11s} fused      strict/fused steady {spread(list(cols[0]))}  first call "
                  f"{spread(list(cols[1]))}  fused/cpu {spread(list(cols[2]))}  peak fused/strict "
                  f"{spread(list(cols[3]))}", flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.train:
        train(args, summary)
    print_summary(summary)
    from device_bench import bench_dispatch

    per_op = [bench_dispatch(args.ops)["tpu"] for _ in range(args.rounds)]
    print(f"dispatch    {args.ops} x a + b on tpu, us per op: {spread(per_op)}  (target <= 57)")


def train(args: argparse.Namespace, summary: dict) -> None:
    """Training steps of each model through finetune_step.py's child, modes alternating round by round."""
    import finetune_step

    for model in args.models.split(","):
        if model not in finetune_step.MODELS:
            continue
        targs = argparse.Namespace(batch=4, seq=128, warmup=2, steps=args.train_steps, tiny=False, model=model)
        for _ in range(args.rounds):
            for mode in ("cpu", "tpu", "tpu-compiled"):
                r = finetune_step.run_one(mode, targs)
                if r is not None:
                    summary.setdefault((model, "train step", mode), []).append((r["median_s"], r["peak_rss_gb"]))
                    print(f"{model:11s} train step {mode:12s} {r['median_s']:.3f} s (spread in process "
                          f"{r['min_s']:.3f}-{r['max_s']:.3f}), peak {r['peak_rss_gb']:.2f} GB", flush=True)


def print_summary(summary: dict) -> None:
    """One table: every model, kind and mode against CPU eager (medians over rounds, min-max spread)."""
    if not summary:
        return
    print("\n| model | run | mode | time ms (median, min-max) | vs CPU (rounds min-max) | peak RSS GB | vs CPU "
          "(rounds min-max) |")
    print("|---|---|---|---|---|---|---|")
    for (model, kind, mode), rows in summary.items():
        base = summary.get((model, kind, "cpu"))
        secs = [s * 1e3 for s, _ in rows]
        gbs = [g for _, g in rows]
        vt = vm = "-"
        if base and mode != "cpu":
            bt = statistics.median(s for s, _ in base) * 1e3
            bm = statistics.median(g for _, g in base)
            vt, vm = f"{statistics.median(secs) / bt:.2f}x", f"{statistics.median(gbs) / bm:.2f}x"
            if len(rows) > 1 and len(base) == len(rows):  # round i of each mode ran side by side: paired ratios
                tr = [s / b for (s, _), (b, _) in zip(rows, base, strict=True)]
                mr = [g / b for (_, g), (_, b) in zip(rows, base, strict=True)]
                vt += f" ({min(tr):.2f}-{max(tr):.2f})"
                vm += f" ({min(mr):.2f}-{max(mr):.2f})"
        print(f"| {model} | {kind} | {mode} | {statistics.median(secs):.0f} ({min(secs):.0f}-{max(secs):.0f}) | {vt} "
              f"| {statistics.median(gbs):.2f} ({min(gbs):.2f}-{max(gbs):.2f}) | {vm} |", flush=True)


if __name__ == "__main__":
    main()
