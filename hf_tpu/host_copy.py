"""Copies between host (CPU tensors, numpy) and tpu buffers (JAX arrays): the one place that decides how many
copies a transfer makes and when XLA:CPU may adopt host memory instead of copying it."""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from typing import Any

import numpy as np
import torch

from hf_tpu import devices, dtypes, float8
from hf_tpu import tensor as T


def from_cpu(t: torch.Tensor, adopt: bool = False, index: int | None = None) -> Any:
    """A CPU tensor's value as a JAX array: one copy (jnp.asarray measured two). The copy is made in numpy
    because on XLA:CPU device_put may alias the numpy buffer, which the CPU tensor could later change.
    `adopt=True` is for a buffer nobody else will touch (a tensor just read from a checkpoint): the array
    then shares its memory where XLA can (XLA:CPU, aligned data), and no copy is made. JAX arrays are
    immutable, so the shared memory is only ever read: the one program that takes donated buffers (the fused
    optimizer step, optim_lowerings.py) gets a new buffer from XLA:CPU for a donated array whose memory is
    not XLA's own (checked: the host memory is left as it was). `index`: the tpu
    device to put it on (with several devices); None leaves it to JAX's default device, uncommitted, so that
    a program with arrays of another device takes it there (a CPU scalar operand)."""
    from hf_tpu import runtime

    jax = runtime.jax()
    dtypes.check(t.dtype)
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # JAX's own numpy bfloat16

        # torch will not hand numpy a bfloat16 array: move the bits, then view them as ml_dtypes' bfloat16
        host = t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    elif t.dtype in float8.DTYPES:  # likewise float8
        host = float8.to_host(t.contiguous())
    else:
        host = t.contiguous().numpy()
    where = T.jax_device(index) if devices.MULTI and index is not None else None
    if adopt:
        return jax.device_put(host, where, may_alias=True)
    if host.nbytes >= OWNED_BYTES and host.ctypes.data % XLA_ALIGN == 0:
        # Large tensors (a model's weights moved with .to("tpu")) are copied into a buffer XLA:CPU owns: XLA
        # copies the aliased host memory itself (still one copy), and the fused optimizer step can then
        # donate the parameter and write the new one over it. An adopted numpy buffer is not XLA's, so the
        # first step made a second copy of every parameter (GPT-2 124M: 0.46 GB more at that step's peak).
        owned = jax.device_put(jax.device_put(host, where, may_alias=True), where, may_alias=False)
        return owned.block_until_ready()  # the copy has read the torch memory before the tensor can change
    # One copy: into a buffer aligned so that XLA:CPU adopts it instead of copying again (device_put with
    # may_alias=False still aliases a numpy view of torch memory, and reads it asynchronously).
    buf = aligned_empty(host.nbytes).view(host.dtype).reshape(host.shape)
    np.copyto(buf, host, casting="no")
    return jax.device_put(buf, where, may_alias=True)


XLA_ALIGN = 64  # XLA:CPU adopts host memory only at this alignment; it copies anything else
OWNED_BYTES = 1 << 20  # from_cpu copies tensors this large into XLA's own buffers (small ones: adopted numpy)


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 host buffer of `nbytes` at XLA:CPU's adoption alignment."""
    raw = np.empty(nbytes + XLA_ALIGN, np.uint8)
    start = -raw.ctypes.data % XLA_ALIGN
    return raw[start:start + nbytes]


def to_cpu(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """A JAX array's value as a new CPU tensor of `dtype`."""
    a = np.asarray(array)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    if dtype in float8.DTYPES:
        return float8.from_host(a, dtype)
    return torch.from_numpy(np.array(a, copy=True)).to(dtype)


# From this many bytes up, `.cpu()` copies with PyTorch's copy_ (split over its intra-op threads) instead of
# numpy's single-threaded copyto. glibc serves blocks over 32 MiB (its largest mmap threshold) with a fresh
# mapping every time, so such a copy is mostly page faults, which two threads take in about half the time.
# Measured on this 2-core machine, a compiled Qwen3-wide forward's 64 x 151,936 float32 logits (39 MB), the
# `.cpu()` alone, paired, 24 rounds on a loaded machine: wall 0.55x, CPU-seconds 0.95x (copyto 19.9 CPU-ms);
# in isolation, min of 30: 24.7 -> 12.4 ms. Below it a block is often reused from the heap (no faults), and
# copy_ lost: GPT-2's 12.9 MB logits took 2.2 CPU-ms with copyto and 6.2 with copy_ (OpenMP's threads
# waking and spinning), 1.4x the wall time.
PARALLEL_COPY_BYTES = 32 << 20


# MADV_HUGEPAGE (linux/mman.h): back the range with 2 MiB pages where transparent huge pages are "madvise" or
# "always" (a no-op where they are "never").
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def advise_huge_pages(dst: torch.Tensor) -> None:
    """Ask Linux for huge pages under a large CPU tensor about to be written (a `.cpu()` destination of
    PARALLEL_COPY_BYTES or more). glibc maps such a block fresh on every allocation, so each 4 KiB page is
    faulted in and zeroed by the copy's first write; with 2 MiB pages the faults are 512x fewer. Measured on
    this host (transparent huge pages "madvise"), a fresh 64 x 151,936 float32 `.cpu()` (a compiled Qwen3-wide
    forward's logits), median of 15 alternating: 15.4 -> 8.4 ms wall and CPU-ms; in the compiled forward with
    its `.cpu()`, paired in one process beside another busy process: the copy 18.2-18.4 -> 12.0-12.4 ms, the
    whole 0.975-0.983x wall and CPU-seconds. By hand (ctypes' madvise)
    because PyTorch's only switch, THP_MEM_ALLOC_ENABLE, is read once at start-up and changes every
    allocation of the process, CPU eager's too; this advises just the pages the copy writes (whole pages
    inside the tensor's storage) and changes no value. Errors (another OS, an old kernel) are ignored."""
    if sys.platform != "linux":
        return
    start = dst.data_ptr()
    end = start + dst.numel() * dst.element_size()
    page = mmap.PAGESIZE
    start, end = -(-start // page) * page, end // page * page
    if end > start:
        _madvise()(start, end - start, _MADV_HUGEPAGE)


def copy_to_cpu(array: Any, src_dtype: torch.dtype, dst: torch.Tensor) -> None:
    """Write a JAX array (of a tpu tensor of `src_dtype`) into the CPU tensor `dst`, with no intermediate
    copy where dtypes and layout allow: np.asarray of an XLA:CPU array is a view of its memory (DLPack's
    too, for a large copy: PARALLEL_COPY_BYTES). `array` holds dst's numbers in row-major order, in dst's
    shape or another of the same size (tensor.row_major): the reshape is then of a numpy or CPU tensor view,
    free, where on the device it would be a copy."""
    shape = tuple(dst.shape)
    if src_dtype == dst.dtype and dst.is_contiguous() and array.size == dst.numel() \
            and not dst.is_conj() and not dst.is_neg():
        if array.nbytes >= PARALLEL_COPY_BYTES and src_dtype not in float8.DTYPES:
            advise_huge_pages(dst)
            src = torch.from_dlpack(array)
            dst.detach().copy_(src if src.shape == shape else src.view(shape))  # same bits: a plain copy
            return
        a = np.asarray(array)
        if a.shape != shape:
            a = a.reshape(shape)  # row-major and contiguous: a view
        try:
            d = (dst.view(torch.int16) if dst.dtype == torch.bfloat16 else dst).detach().numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks
            d = None
        if d is not None:
            np.copyto(d, a.view(np.int16) if dst.dtype == torch.bfloat16 else a, casting="no")
            return
    host = to_cpu(array, src_dtype)
    dst.copy_(host.reshape(shape) if host.numel() == dst.numel() else host)  # else: broadcast by copy_
