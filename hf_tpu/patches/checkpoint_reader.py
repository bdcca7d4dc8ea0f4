"""Checkpoint tensors onto tpu without a host copy (the `tpu_direct_materialize` patch): a CPU tensor XLA
can adopt is handed over as it is; a view of a memory-mapped checkpoint XLA cannot adopt (misaligned)
becomes a lazy tpu tensor that reads its bytes from the file (pread into an aligned buffer) on first use."""

from __future__ import annotations

import functools
import os
import sys
import weakref
from typing import Any


def cpu_to_tpu(t: Any, adopt: bool, index: int | None = None) -> Any:
    """`t` as a tensor of tpu:`index` (None: the current device); with `adopt`, the device array may share
    `t`'s memory (t must not be used again)."""
    from hf_tpu import host_copy
    from hf_tpu import tensor as T

    if index is None:
        index = T.op_index()  # "tpu": the current device, as t.to("tpu") would
    if adopt and t.data_ptr() % host_copy.XLA_ALIGN:
        # A checkpoint's tensors sit wherever its header ends (safetensors aligns to 8 bytes), so XLA would
        # copy this one out of the mapping now, pulling the file's pages into this process's RSS beside
        # the copy. Instead the tensor reads its bytes from the file (pread, into an aligned buffer XLA
        # adopts) on first use: loading costs nothing, as it does for a CPU tensor over the mapping.
        where = mapped_range(t)
        if where is not None:
            return T.wrap_lazy(tuple(t.shape), t.dtype, functools.partial(read_range, *where, t.dtype,
                                                                          tuple(t.shape)), index)
    return T.wrap(host_copy.from_cpu(t, adopt=adopt, index=index), t.dtype)


class OpenFile:
    """A checkpoint file held open (its inode stays readable even if the path is replaced) while any
    lazily read tensor still needs it."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


_open_files: weakref.WeakValueDictionary[tuple[int, int], OpenFile] = weakref.WeakValueDictionary()


def _open_file(path: str) -> OpenFile:
    """One open file per (device, inode), shared by the lazy tensors that read it; closed after the last."""
    st = os.stat(path)
    f = _open_files.get((st.st_dev, st.st_ino))
    if f is None:
        f = _open_files[(st.st_dev, st.st_ino)] = OpenFile(path)
    return f


def mapped_range(t: Any) -> tuple[OpenFile, int, int] | None:
    """(open file, offset, nbytes) of a contiguous CPU tensor that is a view of a memory-mapped file; None
    if `t` is not such a view. Hand-written because neither safetensors nor torch says which file and
    offset a tensor maps (/proc/self/maps does, on Linux)."""
    nbytes = t.numel() * t.element_size()
    if not t.is_contiguous() or nbytes == 0 or not sys.platform.startswith("linux"):
        return None
    addr = t.data_ptr()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, _, offset, _, inode, *path = line.split()
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr and addr + nbytes <= hi:
                    break
            else:
                return None
        if inode == "0" or not path or not path[0].startswith("/"):
            return None  # anonymous memory: nothing to read again
        return _open_file(path[0]), addr - lo + int(offset, 16), nbytes
    except (OSError, ValueError):  # only memory is at stake: XLA copies instead
        return None


def read_range(f: OpenFile, pos: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """The bytes [pos, pos + nbytes) of `f` as a device array of `dtype` and `shape`, read with pread into
    a 64-byte-aligned host buffer that XLA:CPU adopts (one copy of the data, outside the page cache)."""
    import torch

    from hf_tpu import host_copy

    buf = host_copy.aligned_empty(nbytes)
    view = memoryview(buf)
    while view.nbytes:
        n = os.preadv(f.fd, [view], pos)
        if n <= 0:
            raise OSError(f"hf_tpu: checkpoint file ended early while reading {nbytes} bytes at offset {pos}")
        view, pos = view[n:], pos + n
    return host_copy.from_cpu(torch.from_numpy(buf).view(dtype).reshape(shape), adopt=True)
