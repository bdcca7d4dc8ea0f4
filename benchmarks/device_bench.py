"""Device benchmark: every figure measured side by side in this one run, printed as ratios.

  python benchmarks/device_bench.py [--ops 1000] [--repeats 20]

1. eager dispatch: N x `a + b` on 16-element tensors on tpu, CPU and torchax's own eager mode
   (targets: tpu under 50 us per op, and no slower than torchax);
2. a tiny Llama forward (hidden 64, 2 layers): tpu eager, tpu compiled and CPU eager, steady state
   (target: compiled within 1.5x of CPU eager);
3. compiling that model in a new process with a cold and then a warm compilation cache
   (target: warm at least 5x faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _per_op_us(a: torch.Tensor, b: torch.Tensor, n: int, sync) -> float:
    for _ in range(50):
        c = a + b
    sync(c)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            c = a + b
        sync(c)
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def bench_dispatch(n: int) -> dict[str, float]:
    a, b = torch.randn(16), torch.randn(16)
    out = {"cpu": _per_op_us(a, b, n, lambda c: None)}
    out["tpu"] = _per_op_us(a.to("tpu"), b.to("tpu"), n, lambda c: c.cpu())
    from hf_tpu.torchax_compat import _tolerant_torch

    with _tolerant_torch():
        import torchax

        env = torchax.default_env()
    with env:
        ax, bx = env.to_xla(a), env.to_xla(b)
        out["torchax"] = _per_op_us(ax, bx, n, lambda c: c._elem.block_until_ready())
    return out


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _steady(fn, repeats: int) -> float:
    fn()
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def bench_llama(repeats: int) -> dict[str, float]:
    cpu = tiny_llama()
    dev = tiny_llama().to("tpu")
    ids = torch.randint(0, 1000, (1, 16))
    ids_t = ids.to("tpu")
    compiled = torch.compile(dev, backend="tpu")
    with torch.no_grad():
        return {
            "cpu_eager": _steady(lambda: cpu(ids, use_cache=False).logits, repeats),
            "tpu_eager": _steady(lambda: dev(ids_t, use_cache=False).logits.cpu(), max(3, repeats // 5)),
            "tpu_compiled": _steady(lambda: compiled(ids_t, use_cache=False).logits.cpu(), repeats),
        }


COMPILE_ONCE = r"""
import json, sys, time, torch
sys.path.insert(0, %r)
from device_bench import tiny_llama
import hf_tpu
m = tiny_llama().to("tpu")
ids = torch.randint(0, 1000, (1, 16)).to("tpu")
f = torch.compile(m, backend="tpu")
t = time.perf_counter()
with torch.no_grad():
    f(ids, use_cache=False).logits.cpu()
print(json.dumps({"first_call_s": time.perf_counter() - t, **hf_tpu.compile_stats()}))
"""


def bench_cache() -> dict[str, dict]:
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as cache:
        runs = {}
        for name in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", COMPILE_ONCE % here], capture_output=True, text=True,
                               env={**os.environ, "HF_TPU_CACHE_DIR": cache}, check=True)
            runs[name] = json.loads(r.stdout.strip().splitlines()[-1])
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)  # CPU eager is the baseline: one thread, as each harness worker runs

    d = bench_dispatch(args.ops)
    print(f"eager dispatch, {args.ops} x a+b (16 elements), best of 3:")
    print(f"  cpu {d['cpu']:.1f} us/op | tpu {d['tpu']:.1f} us/op | torchax {d['torchax']:.1f} us/op")
    print(f"  tpu/torchax = {d['tpu'] / d['torchax']:.2f}x (target <= 1.0), tpu {'<' if d['tpu'] < 50 else '>='} 50 us target")

    ll = bench_llama(args.repeats)
    print("tiny Llama forward (hidden 64, 2 layers, 16 tokens), steady state:")
    print(f"  cpu eager {ll['cpu_eager'] * 1e3:.2f} ms | tpu eager {ll['tpu_eager'] * 1e3:.2f} ms | "
          f"tpu compiled {ll['tpu_compiled'] * 1e3:.2f} ms")
    print(f"  compiled/cpu = {ll['tpu_compiled'] / ll['cpu_eager']:.2f}x (target <= 1.5), "
          f"eager/cpu = {ll['tpu_eager'] / ll['cpu_eager']:.1f}x")

    c = bench_cache()
    cold, warm = c["cold"]["first_call_s"], c["warm"]["first_call_s"]
    print("compile of the tiny Llama in a new process (first call, Dynamo + AOT + XLA):")
    print(f"  cold {cold:.2f} s (cache hits {c['cold']['cache_hits']}) | warm {warm:.2f} s "
          f"(cache hits {c['warm']['cache_hits']}) | cold/warm = {cold / warm:.1f}x (target >= 5)")
    print(f"  of which XLA trace+compile: cold {c['cold']['xla_s']:.2f} s | warm {c['warm']['xla_s']:.2f} s | "
          f"cold/warm = {c['cold']['xla_s'] / max(c['warm']['xla_s'], 1e-9):.1f}x; AOTAutograd "
          f"{c['cold']['aot_s']:.2f} s / {c['warm']['aot_s']:.2f} s (not cached across processes)")


if __name__ == "__main__":
    main()
