"""A language model's loss step alone: cross-entropy forward and backward over 4 x 128 rows of logits (bfloat16,
cast to float32 as Transformers' loss does), on CPU eager, tpu compiled and tpu eager; the median of 5 timed
calls after 3 warm-up ones, wall and CPU milliseconds. Not a test: run it alone.

  python benchmarks/cross_entropy_step.py [--vocab 50257]      (GPT-2's; Qwen3's is 151936)

Measured (2026-12-07, Qwen3's vocabulary, a helper's jobs at nice 19 beside, two alternating pairs of processes
each): eager cross_entropy with its max and log-sum-exp taken from PyTorch's log_softmax kernel (the handler
of torch_dot_ffi) instead of XLA's row reductions, 505 and 510 ms against 578 and 462: no gain above the
noise, so the eager loss keeps XLA's reductions.
"""

from __future__ import annotations

import argparse
import time

import torch


def run(device: str, compiled: bool, vocab: int) -> str:
    import hf_tpu  # noqa: F401 - registers the tpu device

    torch.manual_seed(0)
    logits = (torch.randn(4, 128, vocab) * 3).bfloat16().to(device).requires_grad_()
    labels = torch.randint(0, vocab, (4, 128)).to(device)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(x.float().view(-1, vocab), y.view(-1))

    fn = torch.compile(loss_of, backend="tpu") if compiled else loss_of
    times = []
    for _ in range(8):
        t, c = time.perf_counter(), time.process_time()
        fn(logits, labels).backward()
        logits.grad.float().sum().item()  # the gradient is finished
        logits.grad = None
        times.append((time.perf_counter() - t, time.process_time() - c))
    wall, cpu = sorted(times[3:])[2]
    return f"{device} {'compiled' if compiled else 'eager'}: wall {wall * 1e3:.0f} ms, CPU {cpu * 1e3:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()
    torch.set_float32_matmul_precision("highest")
    for device, compiled in (("cpu", False), ("tpu", True), ("tpu", False)):
        print(run(device, compiled, args.vocab), flush=True)


if __name__ == "__main__":
    main()
