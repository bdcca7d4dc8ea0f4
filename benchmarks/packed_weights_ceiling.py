"""What pre-packed weights would give an inference forward on this host: the ceiling of the next design for
compiled inference (issue 31).

  python benchmarks/packed_weights_ceiling.py [--models gpt2,qwen3-wide] [--rounds 10]

The compiled tpu forward of GPT-2 and the Qwen3-wide model is its float32 dots (94-97% of the program), and XLA's
dots are about as fast as the MKL GEMMs CPU eager runs (1.02x paired for GPT-2): at 64 tokens both re-pack every
weight on each call (~38% of XLA's dot time). So <= 0.9x of CPU eager needs dots that skip that packing. This
measures it without the device: CPU eager against the same model with every nn.Linear / Conv1D computed from a
weight packed once, by MKL (`torch.ops.mkl._mkl_linear`, what Inductor's freezing uses; keeps the original weight
too) or by oneDNN (`torch.ops.mkldnn._linear_pointwise`; `to_dense()` gives the weight back bit for bit).
Forwards alternate in one process (each round: plain, MKL, oneDNN); ratios are per round against the plain
forward, median (min-max), with the largest difference of the logits from the plain forward's.

Measured 2026-12-07 21:30 UTC (quiet, 10 rounds): MKL-packed GPT-2 0.84x (0.79-0.86), Qwen3-wide 0.75x
(0.70-0.87); oneDNN-packed 0.90x (0.88-0.95) and 0.78x (0.74-0.83); logits within 2.5-6.1e-6. Inside the compiled program (a helper's prototype: an XLA
FFI handler computing MKL's packed GEMM straight into XLA's buffer, the weight's array dropped), GPT-2's
compiled forward went 0.98x -> 0.82-0.85x of CPU eager with the same steady RSS; Qwen3-wide's only with its
tied LM head packed beside the array the embedding reads (0.80x, RSS ~1.10x). Not a test: timings depend on load.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class _Packed:
    """y = x W^T + b from W (out, in) packed once for `rows` rows of x."""

    def __init__(self, w_out_in: Any, bias: Any, rows: int, kind: str) -> None:
        import torch

        w = w_out_in.detach().contiguous()
        self.kind, self.rows, self.out = kind, rows, w.shape[0]
        self.bias = None if bias is None else bias.detach()
        self.w = w
        if kind == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

    def __call__(self, x: Any) -> Any:
        import torch

        x2 = x.reshape(-1, x.shape[-1])
        if self.kind == "mkl":
            y = torch.ops.mkl._mkl_linear(x2, self.packed, self.w, self.bias, self.rows)
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out)


def _pack(model: Any, rows: int, kind: str) -> Any:
    """A copy of `model` whose Linear and Conv1D layers compute from packed weights."""
    import torch
    from transformers.pytorch_utils import Conv1D

    packed = copy.deepcopy(model)

    class Layer(torch.nn.Module):
        def __init__(self, fn: _Packed) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, x: Any) -> Any:
            return self.fn(x)

    def swap(mod: Any) -> None:
        for name, child in list(mod.named_children()):
            if isinstance(child, Conv1D):  # GPT-2's: weight (in, out)
                setattr(mod, name, Layer(_Packed(child.weight.t(), child.bias, rows, kind)))
            elif isinstance(child, torch.nn.Linear):
                setattr(mod, name, Layer(_Packed(child.weight, child.bias, rows, kind)))
            else:
                swap(child)

    swap(packed)
    return packed


def run(model_name: str, rounds: int) -> None:
    import torch

    import eager_bench

    torch.set_float32_matmul_precision("highest")
    model = eager_bench.build(model_name)
    seq = eager_bench.MODELS[model_name][3]
    variants = {"mkl": _pack(model, seq, "mkl"), "onednn": _pack(model, seq, "onednn")}
    ids = torch.randint(0, model.config.vocab_size, (1, seq))

    def forward(m: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        out = m(ids, use_cache=False).logits
        return time.perf_counter() - t, out

    ratios: dict[str, list[float]] = {k: [] for k in variants}
    diffs: dict[str, float] = dict.fromkeys(variants, 0.0)
    with torch.no_grad():
        for i in range(rounds + 2):
            base, want = forward(model)
            for name, m in variants.items():
                t, got = forward(m)
                if i >= 2:  # the first two warm up
                    ratios[name].append(t / base)
                    diffs[name] = max(diffs[name], (got - want).abs().max().item())
    for name, rs in ratios.items():
        print(f"{model_name:11s} {name:7s} packed / plain CPU eager forward: {statistics.median(rs):.3f} "
              f"({min(rs):.3f}-{max(rs):.3f}), logits max |diff| {diffs[name]:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,qwen3-wide")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    for name in args.models.split(","):
        run(name, args.rounds)


if __name__ == "__main__":
    main()
