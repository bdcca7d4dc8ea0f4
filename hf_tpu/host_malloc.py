"""One glibc malloc arena for the process once the stand-in starts JAX on the host CPU (peak RSS).

Why: glibc gives each thread that allocates its own arena (up to 8 per core), and memory freed into one
arena is reused only by allocations from that arena. On the stand-in, a tpu tensor's numbers are XLA:CPU
buffers allocated by whichever thread runs the program: the main thread in the forward, autograd's device
thread in the backward (PyTorch runs a PrivateUse1 backward on a thread of its own), XLA's pool threads. So
the blocks the forward frees are not reused by the backward, and each arena keeps its free blocks: GPT-2
124M's bfloat16 training step peaked ~0.3 GB higher (3.87-4.00 GB against 3.56-3.68 with one arena; CPU
PyTorch, whose backward runs on the calling thread, 2.83). MALLOC_ARENA_MAX=1 in the environment has the same
effect, but must be set before the process starts; mallopt(M_ARENA_MAX) does it from inside, and counts
only if it runs before the other threads first allocate: glibc latches the limit at the next arena it
would create, and threads keep the arena they already have. JAX starts ~14 threads that allocate as its
backend comes up, so limit_arenas() runs just before JAX is imported (runtime.add_fast_compile_flags).

HF_TPU_MALLOC_ARENA_MAX=<n> picks another limit; 0 leaves glibc's default. A MALLOC_ARENA_MAX set by the
user wins (glibc read it at start). Not glibc (musl, macOS): nothing to do.

A fixed mmap threshold (limit_arenas() sets it with the arena limit): glibc serves an allocation of at least
M_MMAP_THRESHOLD bytes with its own mmap, returned to the kernel when freed, and smaller ones from the heap,
whose free blocks it keeps. By default the threshold is dynamic: each freed mmapped block raises it to that
block's size, up to 32 MiB, so after the first few frees every activation, gradient and weight-sized buffer
of a training step (GPT-2's are 0.1-9.4 MB) comes from the heap, and the heap keeps what the step frees: at
the peak of GPT-2's step (AdamW) glibc held 0.86 GB of free heap blocks (mallinfo2 fordblks) beside 1.68 GB
in use, where CPU PyTorch, whose large tensors stay mmapped, held 0.18 GB. Setting the threshold fixes it
(glibc stops adjusting it). HF_TPU_MALLOC_MMAP_THRESHOLD=<bytes> sets it (a MALLOC_MMAP_THRESHOLD_ set by the
user wins). It is off by default (0: glibc's dynamic threshold) because the memory costs time: every large
buffer is then a fresh mapping, faulted in page by page. Measured on a 4-layer GPT-2 training step (bf16
autocast, AdamW fused, 4 x 128, one process each, loaded machine): 1 MiB cut peak RSS 2.29 -> 1.98 GB and
raised the step's CPU-seconds 2.92 -> 4.06 (minor faults 423k -> 736k per step). For a process short of
memory, not a default.

Transparent huge pages, which only the environment can ask for: GLIBC_TUNABLES=glibc.malloc.hugetlb=1
(glibc >= 2.35, read when the process starts; no mallopt sets it) makes glibc madvise its heap and its
mmapped blocks MADV_HUGEPAGE, so a block is faulted in 2 MiB at a time (with the kernel's THP mode
`madvise` or `always`). Measured on GPT-2 124M's training step (bf16 autocast, AdamW fused, 4 x 128, one
process each, 5 steps, losses identical; session 8, note of issue 31): the reliable gain is page faults and
their time: tpu compiled ~120-345k -> under 6k minor faults per steady step (CPU-s/step 3.0-4.0 -> 2.7-3.1),
tpu eager ~360k -> 8k, CPU PyTorch ~260k -> 7k (CPU-s ~3.2 -> ~2.4; load-dependent figures). Peak RSS
moved little and not reliably: tpu compiled 3.83, 3.84 GB without, 3.58, 3.79 GB with; eager 3.65 -> 3.64;
CPU 2.90 -> 2.86. With the 1 MiB threshold as well, tpu compiled peaked at 3.51 GB (one run), ~150k faults. hf-tpu cannot set it for its own process;
benchmarks/finetune_step.py --hugetlb runs every mode (CPU too) with it.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "HF_TPU_MALLOC_ARENA_MAX"
MMAP_ENV = "HF_TPU_MALLOC_MMAP_THRESHOLD"
MMAP_THRESHOLD = 0  # off by default: the module docstring's measurement
_M_ARENA_MAX = -8  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_applied: int | None = None  # the limit set by limit_arenas(), None when it set none
_mmap_applied: int | None = None  # the mmap threshold set, None when none was


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):  # no such name: not glibc
        return False


def limit_arenas() -> int | None:
    """Set glibc's M_ARENA_MAX as ENV says (default 1), once; returns the limit set, or None when none was
    (disabled, the user's MALLOC_ARENA_MAX, not glibc, mallopt refused)."""
    global _applied
    if _applied is not None:
        return _applied
    try:
        limit = int(os.environ.get(ENV, "1"))
    except ValueError:
        raise ValueError(f"{ENV} must be a whole number (0 leaves glibc's default), not "
                         f"{os.environ[ENV]!r}") from None
    if not _is_glibc():
        return None
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _fix_mmap_threshold(mallopt)
    if limit <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return None
    if mallopt(_M_ARENA_MAX, limit) != 1:  # mallopt returns 1 on success
        return None
    _applied = limit
    return limit


def _fix_mmap_threshold(mallopt: Any) -> None:
    """Set glibc's M_MMAP_THRESHOLD as MMAP_ENV says (module docstring), unless the user set glibc's own."""
    global _mmap_applied
    try:
        value = int(os.environ.get(MMAP_ENV, str(MMAP_THRESHOLD)))
    except ValueError:
        raise ValueError(f"{MMAP_ENV} must be a number of bytes (0 leaves glibc's dynamic threshold), not "
                         f"{os.environ[MMAP_ENV]!r}") from None
    if value > 0 and "MALLOC_MMAP_THRESHOLD_" not in os.environ and mallopt(_M_MMAP_THRESHOLD, value) == 1:
        _mmap_applied = value


def mmap_threshold_applied() -> int | None:
    """The mmap threshold limit_arenas() set in this process, or None."""
    return _mmap_applied


def applied() -> int | None:
    """The arena limit limit_arenas() set in this process, or None."""
    return _applied


TRIM_ENV = "HF_TPU_MALLOC_TRIM"
_trim_installed = False


def trim_before_backward() -> bool:
    """Give glibc's free heap pages back to the kernel (malloc_trim(0)) as each backward pass on tpu starts
    and after each optimizer step on tpu;
    once per process, as HF_TPU_MALLOC_TRIM says (default 1; 0: off). Returns whether it is installed.

    Why: a training step's peak RSS is reached early in the backward (the LM head's and the loss's gradients,
    or a compiled backward program allocating every gradient while its saved inputs are still held), and at
    that moment glibc still keeps, resident, the heap blocks the forward's temporaries freed (0.2-0.5 GB for
    GPT-2 124M: step_memory.py --sample). malloc_trim(0) returns their whole pages (madvise), so they count
    again only when reused. Measured on GPT-2 124M's step (bf16 autocast, AdamW fused, 4 x 128, one process
    each, loaded machine): peak RSS eager 3.60 -> 3.27 GB, compiled 3.50 -> 3.31 GB; CPU-s per step 2.40 ->
    2.49 and 2.06 -> 1.93 (within the load's noise: the pages refaulted are those the backward reuses).
    The same after every optimizer step whose parameters are on tpu (a global step post-hook): eager's peak
    then came at the next forward's start, the freed blocks of the backward and the step still resident;
    eager GPT-2 step, alternating single runs, loaded machine: peak RSS 3.31, 3.27 -> 3.21, 2.98 GB, CPU-s per
    step 2.16, 2.21 -> 2.29, 2.31 (refaulted pages).
    Wraps torch.autograd.backward (Tensor.backward calls it); torch.autograd.grad is left as it is. Only for
    glibc, and only where tpu buffers live in this heap (runtime.add_fast_compile_flags calls this when JAX
    runs on the host CPU)."""
    global _trim_installed
    if _trim_installed:
        return True
    if os.environ.get(TRIM_ENV, "1") == "0" or not _is_glibc():
        return False
    import ctypes
    import functools

    import torch
    import torch.autograd

    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if _on_tpu(tensors):
            malloc_trim(0)
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        # and after each optimizer step on tpu: eager GPT-2's whole-run peak came at the next forward's start,
        # with the step's and the backward's freed blocks (0.67 GB) still resident (step_memory.py --sample)
        if any(p.device.type == "tpu" for g in optimizer.param_groups for p in g["params"][:1]):
            malloc_trim(0)

    register_optimizer_step_post_hook(after_step)
    _trim_installed = True
    return True


def _on_tpu(tensors: Any) -> bool:
    import torch

    if isinstance(tensors, torch.Tensor):
        return tensors.device.type == "tpu"
    try:
        return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)
    except TypeError:
        return False
