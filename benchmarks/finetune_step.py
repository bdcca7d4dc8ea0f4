"""A fine-tuning step at GPT-2 size on tpu (eager and compiled) against CPU eager, side by side in one run.

  python benchmarks/finetune_step.py [--steps 5] [--warmup 2] [--rounds 1] [--modes cpu,tpu,tpu-compiled]
                                     [--batch 4] [--seq 128] [--tiny] [--model gpt2] [--hugetlb]

Each (mode, round) runs in a fresh process: GPT-2 124M built from its default config (or `--model qwen3-wide`:
eager_bench.py's Qwen3-0.6B-wide 2-layer model; seeded, offline, dropout off) on CPU and moved to the device, AdamW(fused=True), and a training step under `torch.autocast(device, bfloat16)`:
forward with labels, backward, optimizer step, zero_grad, the loss read back (`.item()`, so the step is
finished when the clock stops). After `--warmup` steps (the compiled mode traces and compiles its forward and
backward programs there, and the fused AdamW program compiles on the first step), `--steps` steps are timed:
the median step time and its spread (min-max), the median step's CPU-seconds (the process's, all threads:
less sensitive to other processes' load than wall time), and the process's peak RSS (build, move and steps included).
Precision is "highest" for float32 work on every device; the matmuls run in bfloat16 under autocast.
`--tiny` runs a 2-layer, 64-wide GPT-2 (a smoke test of the script). `--hugetlb` starts every mode's
process (CPU's too) with GLIBC_TUNABLES=glibc.malloc.hugetlb=1: glibc's heap and its mmapped blocks on
transparent huge pages (hf_tpu/host_malloc.py: ~50x fewer page faults, peak RSS barely moves; only the environment of
a starting process can ask for it). Targets (issue 25): tpu eager within 1.5x CPU's step time, compiled
faster than CPU eager, peak RSS within 1.3x CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHILD = r"""
import json, resource, statistics, sys, time
import torch, transformers
mode, batch, seq, warmup, steps, tiny, (cfg_name, cls_name, cfg_kwargs) = json.loads(sys.argv[1])
torch.set_float32_matmul_precision("highest")
transformers.utils.logging.set_verbosity_error()
device = "cpu" if mode == "cpu" else "tpu"
kwargs = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=seq) if tiny else cfg_kwargs
torch.manual_seed(0)
config = getattr(transformers, cfg_name)(**kwargs)
for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):  # dropout off: CPU's losses
    if hasattr(config, name):
        setattr(config, name, 0.0)
model = getattr(transformers, cls_name)(config).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
fwd = torch.compile(model, backend="tpu") if mode == "tpu-compiled" else model
ids = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
times, cpu_times, losses = [], [], []
for i in range(warmup + steps):
    t, c = time.perf_counter(), time.process_time()
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = fwd(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
    times.append(time.perf_counter() - t)
    cpu_times.append(time.process_time() - c)
timed = times[warmup:]
print(json.dumps({"mode": mode, "first_s": times[0], "median_s": statistics.median(timed), "min_s": min(timed),
                  "max_s": max(timed), "losses": losses,
                  "cpu_s": statistics.median(cpu_times[warmup:]),
                  "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


MODELS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    # eager_bench.py's Qwen3-0.6B-wide 2-layer model
    "qwen3-wide": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        vocab_size=151936, tie_word_embeddings=True, num_hidden_layers=2)),
}


def build(model: str, tiny: bool = False, seq: int = 128, layers: int = 0):  # noqa: ANN201 - a Transformers model
    """The CPU model of MODELS[model] (with `tiny`, a 2-layer 64-wide GPT-2; `layers`: another depth) in train
    mode, seeded, with dropout off so that every device's losses are CPU's. The profile and memory scripts
    build theirs here; CHILD above builds the same model in its own process."""
    import torch
    import transformers

    cfg_name, cls_name, kwargs = MODELS["gpt2" if tiny else model]
    if tiny:
        kwargs = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=seq)
    if layers:
        kwargs = {**kwargs, "n_layer" if cfg_name == "GPT2Config" else "num_hidden_layers": layers}
    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(**kwargs)
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    return getattr(transformers, cls_name)(config).train()


HUGETLB = "glibc.malloc.hugetlb=1"  # glibc >= 2.35; older glibc ignores an unknown tunable


def run_one(mode: str, args: argparse.Namespace) -> dict | None:
    """The child's figures, or None when it failed (reported, and the other modes still run: on a shared
    machine a mode can be killed for memory another process holds). `args`: batch, seq, warmup, steps,
    tiny, model."""
    payload = json.dumps([mode, args.batch, args.seq, args.warmup, args.steps, args.tiny,
                          MODELS["gpt2" if args.tiny else getattr(args, "model", "gpt2")]])
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    if getattr(args, "hugetlb", False):
        env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES"), HUGETLB) if t)
    proc = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        why = (f"killed by signal {-proc.returncode}" + (" (SIGKILL: the kernel's out-of-memory killer?)"
                                                          if proc.returncode == -9 else "")
               if proc.returncode < 0 else f"exit status {proc.returncode}")
        print(f"{mode} failed, {why}:\n{proc.stderr[-2000:]}", file=sys.stderr, flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="processes per mode, alternating modes")
    ap.add_argument("--modes", default="cpu,tpu,tpu-compiled")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--hugetlb", action="store_true", help=f"every mode's process with GLIBC_TUNABLES={HUGETLB}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes:
            res = run_one(mode, args)
            if res is None:
                continue
            res["round"] = r
            results[mode].append(res)
            print(f"round {r + 1} {mode}: {res['median_s']:.3f} s/step, {res['cpu_s']:.2f} CPU-s/step "
                  f"(first {res['first_s']:.1f} s), "
                  f"peak RSS {res['peak_rss_gb']:.2f} GB", file=sys.stderr, flush=True)
    failed = [m for m in modes if not results[m]]
    modes = [m for m in modes if results[m]]
    if not modes:
        sys.exit("every mode failed")
    size = "tiny GPT-2" if args.tiny else args.model
    params = results[modes[0]][0]["params_m"]
    print(f"\nFine-tuning step, {size} ({params:.1f}M params), batch {args.batch} x {args.seq}, AdamW(fused=True), "
          f"bfloat16 autocast; {args.warmup} warm-up + {args.steps} timed steps per process, {args.rounds} "
          f"process(es) per mode{'; every process with GLIBC_TUNABLES=' + HUGETLB if args.hugetlb else ''}\n")
    print("| mode | step s (median) | spread (min-max) | CPU-s/step | first step s | peak RSS GB | "
          "vs CPU time (rounds min-max) | vs CPU RSS (rounds min-max) |")
    print("|---|---|---|---|---|---|---|---|")
    base = results.get("cpu") or None
    base_t = statistics.median(r["median_s"] for r in base) if base else None
    base_m = statistics.median(r["peak_rss_gb"] for r in base) if base else None
    for mode in modes:
        rs = results[mode]
        t = statistics.median(r["median_s"] for r in rs)
        lo, hi = min(r["min_s"] for r in rs), max(r["max_s"] for r in rs)
        first = statistics.median(r["first_s"] for r in rs)
        cpu_s = statistics.median(r["cpu_s"] for r in rs)  # the process's CPU-seconds: less load-dependent
        m = statistics.median(r["peak_rss_gb"] for r in rs)
        vt = f"{t / base_t:.2f}x" if base_t else "-"
        vm = f"{m / base_m:.2f}x" if base_m else "-"
        if base and mode != "cpu" and len(rs) > 1:  # each round's ratio to that round's CPU: min-max
            cpu_by_round = {r["round"]: r for r in base}
            pairs = [(r, cpu_by_round[r["round"]]) for r in rs if r["round"] in cpu_by_round]
            if pairs:
                tr = [a["median_s"] / b["median_s"] for a, b in pairs]
                mr = [a["peak_rss_gb"] / b["peak_rss_gb"] for a, b in pairs]
                vt += f" ({min(tr):.2f}-{max(tr):.2f})"
                vm += f" ({min(mr):.2f}-{max(mr):.2f})"
        print(f"| {mode} | {t:.3f} | {lo:.3f}-{hi:.3f} | {cpu_s:.2f} | {first:.1f} | {m:.2f} | {vt} | {vm} |")
    for mode in failed:
        print(f"| {mode} | failed (see stderr) | | | | | | |")
    if base:
        cpu_loss = base[0]["losses"]
        for mode in modes:
            if mode != "cpu":
                d = max(abs(a - b) for a, b in zip(results[mode][0]["losses"], cpu_loss, strict=False))
                print(f"\n{mode}: largest loss difference from CPU over the steps {d:.4f} (bfloat16 autocast)", end="")
        print()


if __name__ == "__main__":
    main()
