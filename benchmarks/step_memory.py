"""Where a training step's host memory goes, phase by phase, on one device (run it once per device).

  python benchmarks/step_memory.py --device {cpu,tpu} [--compiled] [--model gpt2] [--steps 3] [--tiny] [--sample]

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

`--sample` also watches the process from a thread (RSS every millisecond) and, each time RSS reaches a new
high, takes glibc's account and the live JAX arrays by kind (parameters, optimizer state, gradients, the rest:
activations, autocast copies; arrays no tensor holds, a program's temporaries, are not listed) with the phase the main thread is in: its last such line is the
breakdown at the process's peak (printed at the end, with each phase's own peak).
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


def report(phase: str, device: str, everything: bool = False) -> None:
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    live = 0.0
    extra = ""
    if device != "cpu":
        from hf_tpu import memory

        live = memory.allocated() / GB  # the arrays tensors hold (not jax.live_arrays(): Sampler's comment)
        if everything:
            import jax

            extra = f"  all JAX arrays {sum(a.nbytes for a in jax.live_arrays()) / GB:5.2f}"
    m = _mallinfo()
    heap = (f"  glibc in use {m.uordblks / GB:5.2f}  free in heap {m.fordblks / GB:5.2f}  mmapped {m.hblkhd / GB:5.2f}"
            if m is not None else "")
    print(f"{phase:18s} rss {rss:5.2f}  peak {peak:5.2f}  tensors' arrays {live:5.2f}{extra}{heap}  (GB)", flush=True)


class Sampler:
    """RSS watched from a thread; at each new high (by more than `step` bytes) a snapshot of glibc's account
    and of the live JAX arrays by kind. `phase` is set by the main thread."""

    def __init__(self, device: str, kinds: Any, step: float = 8e6, deep: str = "") -> None:
        import threading

        self.device, self.kinds, self.step, self.deep = device, kinds, step, deep
        self.phase = "start"
        self.high = 0
        self.last: str = ""
        self.log: list[str] = []
        self.deep_high = 0
        self.by_phase: dict[str, float] = {}
        self._stop = threading.Event()
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            rss = self._rss()
            phase = self.phase
            if rss > self.by_phase.get(phase, 0):
                self.by_phase[phase] = rss
            if rss > self.high + self.step:
                self.high = rss
                self.last = self._snapshot(rss, phase)
            if phase == self.deep and rss > self.deep_high + 2 * self.step:  # the phase's own rises
                self.deep_high = rss
                self.log.append(self._snapshot(rss, phase))
            time.sleep(0.001)

    def _snapshot(self, rss: int, phase: str) -> str:
        m = _mallinfo()
        heap = (f"glibc in use {m.uordblks / GB:5.2f} free in heap {m.fordblks / GB:5.2f} "
                f"mmapped {m.hblkhd / GB:5.2f} heap size {m.arena / GB:5.2f}" if m is not None else "")
        live = ""
        if self.device != "cpu":
            # hf_tpu's own account of the arrays tensors hold (memory.py), not jax.live_arrays(): listing those
            # holds every array for a moment and changes when the step's arrays are freed (and so glibc's heap)
            from hf_tpu import memory

            held = {k: v[1] for k, v in list(memory._live.items())}
            sums: dict[str, float] = {}
            for k, kind in self.kinds().items():
                if k in held:
                    sums[kind] = sums.get(kind, 0) + held.pop(k)
            sums["other"] = sum(held.values())
            live = (f"tensors' arrays {sum(sums.values()) / GB:5.2f} ("
                    + ", ".join(f"{k} {v / GB:.2f}" for k, v in sorted(sums.items())) + ")")
            if phase == self.deep:  # every live JAX array too (changes what follows: see above)
                import jax

                arrays = jax.live_arrays()
                live += f"; all JAX arrays {sum(a.nbytes for a in arrays) / GB:5.2f} ({len(arrays)})"
                del arrays
        return f"[{phase}] rss {rss / GB:5.2f}  {live}  {heap}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        print("".join(f"\n  {line}" for line in self.log))
        print(f"\nat the peak: {self.last}")
        print("each phase's highest RSS: " + ", ".join(f"{k} {v / GB:.2f}" for k, v in self.by_phase.items()))


def _kinds(model: Any, opt: Any) -> Any:
    """id(JAX array) -> 'params' | 'grads' | 'optimizer' for the tensors of `model` and `opt` now."""
    from hf_tpu import tensor

    def arr(t: Any) -> Any:
        try:
            return tensor.payload(t).buf._array
        except Exception:
            return None

    def kinds() -> dict[int, str]:
        out: dict[int, str] = {}
        for p in model.parameters():
            out[id(arr(p))] = "params"
            if p.grad is not None:
                out[id(arr(p.grad))] = "grads"
        for st in list(opt.state.values()):
            for v in list(st.values()):
                if hasattr(v, "device") and v.device.type != "cpu":
                    out[id(arr(v))] = "optimizer"
        return out

    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="tpu", choices=("cpu", "tpu"))
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 (a smoke test of the script)")
    ap.add_argument("--compiled", action="store_true", help="the forward through torch.compile(backend='tpu')")
    ap.add_argument("--sample", action="store_true", help="the breakdown at the RSS peak (module docstring)")
    ap.add_argument("--deep", default="", help="with --sample: in this phase ('step 1 backward') every live JAX "
                    "array is summed too, not only the arrays tensors hold")
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
    sampler = Sampler(dev, _kinds(model, opt), deep=args.deep.replace("_", " ")) if args.sample else None

    def phase(name: str) -> None:
        if sampler is not None:
            sampler.phase = name

    for i in range(args.steps):
        phase(f"step {i} forward")
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        report(f"step {i} forward", dev, bool(args.deep))
        phase(f"step {i} backward")
        loss.backward()
        report(f"step {i} backward", dev, bool(args.deep))
        phase(f"step {i} optimizer")
        opt.step()
        report(f"step {i} optimizer", dev, bool(args.deep))
        phase(f"step {i} zero_grad")
        opt.zero_grad(set_to_none=True)
        loss.item()
        report(f"step {i} zero_grad", dev, bool(args.deep))
    if sampler is not None:
        sampler.stop()


if __name__ == "__main__":
    main()
