"""Where a training step's host memory goes, phase by phase, on one device (run it once per device).

  python benchmarks/step_memory.py --device {cpu,tpu} [--compiled] [--model gpt2] [--steps 3] [--tiny]

finetune_step.py's step (forward with labels under bfloat16 autocast, backward, AdamW(fused=True) step,
zero_grad), one process. After each phase it prints the process's RSS and peak RSS (ru_maxrss), the bytes of
live JAX arrays (tpu: the tensors' numbers, and nothing else), and glibc's own account (mallinfo2): bytes in use
from its heap, free bytes it keeps in its heap, and bytes in its own mmaps (large blocks, returned to the kernel
when freed). RSS less those is the libraries and the runtime. In this session's GPT-2 run (the note of issue 31)
the tpu process's extra ~0.9 GB at the step's peak was ~0.2 GB of JAX/XLA runtime, ~0.7 GB more free heap
that glibc kept (0.86 against CPU's 0.18 GB: see host_malloc.py's mmap threshold) and ~0.25 GB of other
allocations (compiled programs, caches). Not a test; RSS does not depend on the machine's load.

`--compiled` runs the forward through torch.compile(backend="tpu") (forward and backward one XLA program
each). GPT-2 124M (the note of issue 31, session 8): the process peak (3.8 GB) is reached in the backward of
a steady step, not while compiling (executable cache warm; cold, the first step's compile adds ~0.2 GB).
Then live JAX arrays are parameters 0.46 + AdamW state 0.93 + the forward's saved activations 0.89 + the
gradients 0.46 GB, all at once (the compiled backward frees its saved activations only when its one program
returns, eager frees them layer by layer), and glibc holds ~0.95 GB of free heap beside them.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_DEFER_AND_FUSE", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GB = 2**30


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo() -> Any:
    try:
        f = ctypes.CDLL(None).mallinfo2
    except AttributeError:  # not glibc (or glibc < 2.33)
        return None
    f.restype = MallInfo2
    return f()


def report(phase: str, device: str) -> None:
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    live = 0.0
    if device != "cpu":
        import jax

        live = sum(a.nbytes for a in jax.live_arrays()) / GB
    m = _mallinfo()
    heap = (f"  glibc in use {m.uordblks / GB:5.2f}  free in heap {m.fordblks / GB:5.2f}  mmapped {m.hblkhd / GB:5.2f}"
            if m is not None else "")
    print(f"{phase:18s} rss {rss:5.2f}  peak {peak:5.2f}  live JAX arrays {live:5.2f}{heap}  (GB)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="tpu", choices=("cpu", "tpu"))
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 (a smoke test of the script)")
    ap.add_argument("--compiled", action="store_true", help="the forward through torch.compile(backend='tpu')")
    args = ap.parse_args()

    import torch
    import transformers

    import finetune_step

    dev = args.device
    report("start", dev)
    if dev != "cpu":
        import hf_tpu  # noqa: F401 - registers the tpu device

        torch.ones(1, device=dev).cpu()  # starts JAX's backend
    report("runtime up", dev)
    torch.set_float32_matmul_precision("highest")
    transformers.utils.logging.set_verbosity_error()
    model = finetune_step.build(args.model, args.tiny).to(dev)
    config = model.config
    report("model moved", dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (4, 128)).to(dev)
    fwd = torch.compile(model, backend="tpu") if args.compiled else model
    for i in range(args.steps):
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        report(f"step {i} forward", dev)
        loss.backward()
        report(f"step {i} backward", dev)
        opt.step()
        report(f"step {i} optimizer", dev)
        opt.zero_grad(set_to_none=True)
        loss.item()
        report(f"step {i} zero_grad", dev)


if __name__ == "__main__":
    main()
