"""`hf-tpu demo`: a tiny Llama on `tpu`, eager and compiled, checked against CPU."""

from __future__ import annotations

import argparse
import os
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=8, help="new tokens to generate greedily")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="highest")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_tpu

    hf_tpu.set_matmul_precision(args.precision)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    torch.manual_seed(0)
    cpu = LlamaForCausalLM(cfg).eval()
    dev = LlamaForCausalLM(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("tpu")
    ids = torch.randint(0, cfg.vocab_size, (1, 8))
    info = hf_tpu.backend_info()
    print(f"tpu served by {info['backend']} on JAX {info.get('platform')}; matmul precision {args.precision}")
    with torch.no_grad():
        ref = cpu(ids).logits
        t = time.perf_counter()
        eager = dev(ids.to("tpu")).logits.cpu()
        print(f"eager forward:    max |tpu - cpu| = {(eager - ref).abs().max():.2e}  ({time.perf_counter() - t:.1f} s)")
        compiled = torch.compile(dev, backend="tpu")
        t = time.perf_counter()
        comp = compiled(ids.to("tpu")).logits.cpu()
        print(f"compiled forward: max |tpu - cpu| = {(comp - ref).abs().max():.2e}  ({time.perf_counter() - t:.1f} s, "
              f"{hf_tpu.compile_stats()['compilations']} XLA program)")
        gen_cpu = cpu.generate(ids, max_new_tokens=args.tokens, do_sample=False)
        gen_tpu = dev.generate(ids.to("tpu"), max_new_tokens=args.tokens, do_sample=False).cpu()
    same = torch.equal(gen_cpu, gen_tpu)
    print(f"greedy generate of {args.tokens} tokens: {'same tokens as CPU' if same else 'DIFFERENT tokens from CPU'}")
    return 0 if same else 1
