"""Compile cache benchmark: a new process's `torch.compile(model, backend="tpu")`, from the call to
torch.compile to the first output on the host, with every cache location fresh (cold) and then warm.

    HF_HUB_OFFLINE=1 python benchmarks/compile_cache_bench.py [--models llama,gpt2] [--repeats 3]

Models (built offline from their configs, random weights): a tiny Llama (hidden 64, 2 layers) and GPT-2
124M (the default GPT2Config: 12 layers, hidden 768). Each run is its own Python process. "cold": fresh
directories for JAX's XLA cache and hf_tpu's graph cache (HF_TPU_CACHE_DIR; graphs go to its `graphs/`
subdirectory) and for torch's own caches (TORCHINDUCTOR_CACHE_DIR); "warm": the same directories again.
"nocache": HF_TPU_COMPILE_CACHE=0 with a warm XLA cache (what a second process cost before the graph
cache). Prints each run, then per model the median and the spread (min-max) and the cold/warm ratio
(target: at least 5x), in wall-clock and in the process's CPU seconds (all threads), which a loaded
machine distorts less. Not a test: the figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import torch
import hf_tpu

which = sys.argv[1]
torch.manual_seed(0)
if which == "llama":
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    model, vocab = LlamaForCausalLM(cfg).eval(), 1000
else:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model, vocab = GPT2LMHeadModel(cfg).eval(), cfg.vocab_size
ids = torch.randint(0, vocab, (1, 32))
with torch.no_grad():
    expected = model(input_ids=ids).logits
model = model.to("tpu")
ids_t = ids.to("tpu")
torch.tpu.synchronize() if hasattr(torch, "tpu") and hasattr(torch.tpu, "synchronize") else None
with torch.no_grad():
    t, c = time.perf_counter(), time.process_time()
    compiled = torch.compile(model, backend="tpu")
    logits = compiled(input_ids=ids_t).logits.cpu()
    first, cpu = time.perf_counter() - t, time.process_time() - c
err = (logits - expected).abs().max().item() / max(1e-6, expected.abs().max().item())
s = hf_tpu.compile_stats()
print(json.dumps({"first_s": first, "cpu_s": cpu, "rel_err": err, "graphs": s["graphs"], "tiers": s["tiers"]}))
"""


def run(model: str, env_extra: dict[str, str]) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra}
    p = subprocess.run([sys.executable, "-c", CHILD, model], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{model} run failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def fresh_env(work: Path) -> dict[str, str]:
    d = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
    return {"HF_TPU_CACHE_DIR": str(d / "hf_tpu"), "TORCHINDUCTOR_CACHE_DIR": str(d / "torch"),
            "HF_TPU_GRAPH_CACHE_DIR": str(d / "hf_tpu" / "graphs"), "HF_TPU_SHARED_CACHE_DIR": ""}


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):6.2f} s  (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--repeats", type=int, default=3, help="cold runs (each with fresh caches) and warm runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compile-cache-bench-"))
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            res = results.setdefault(model, {"cold": [], "warm": [], "nocache": []})
            for i in range(args.repeats):
                env = fresh_env(work)
                for kind in ("cold", "warm", "nocache"):
                    extra = dict(env, HF_TPU_COMPILE_CACHE="0") if kind == "nocache" else env
                    r = run(model, extra)
                    res[kind].append(r)
                    t = r["tiers"]
                    print(f"{model:6s} #{i + 1} {kind:7s} first output {r['first_s']:6.2f} s "
                          f"(CPU {r['cpu_s']:6.2f} s)   dynamo graphs "
                          f"{r['graphs']}  host hits {t['host']['hits']}  xla hits {t['xla']['hits']}/"
                          f"{t['xla']['hits'] + t['xla']['misses']}  rel err {r['rel_err']:.1e}", flush=True)
        print("\nnew-process torch.compile -> first output:")
        for model, res in results.items():
            cold = [r["first_s"] for r in res["cold"]]
            warm = [r["first_s"] for r in res["warm"]]
            nocache = [r["first_s"] for r in res["nocache"]]
            ratios = [c / w for c, w in zip(cold, warm, strict=True)]
            print(f"  {model:6s} cold    {spread(cold)}")
            print(f"  {model:6s} warm    {spread(warm)}")
            print(f"  {model:6s} no graph cache, warm XLA cache {spread(nocache)}")
            print(f"  {model:6s} cold/warm {statistics.median(cold) / statistics.median(warm):.1f}x "
                  f"(per pair: {', '.join(f'{x:.1f}' for x in ratios)}; target >= 5x)")
            cc = [r["cpu_s"] for r in res["cold"]]
            cw = [r["cpu_s"] for r in res["warm"]]
            print(f"  {model:6s} CPU seconds (all threads; less sensitive to a loaded machine): cold {spread(cc)}, "
                  f"warm {spread(cw)}, ratio {statistics.median(cc) / statistics.median(cw):.1f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
