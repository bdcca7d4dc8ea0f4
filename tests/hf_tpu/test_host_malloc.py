"""host_malloc.py: the stand-in limits glibc to one malloc arena before JAX's threads allocate, so that memory
freed by one thread (the forward, on the main thread) is reused by another (the backward, on autograd's
device thread) instead of each arena keeping its own free blocks (peak RSS of a training step).

Checked by counting the arenas glibc reports (malloc_info's <heap> entries) in a fresh process after the
first tpu op, a backward and a few threads that allocate: without the limit JAX's threads alone make ~14."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hf_tpu import host_malloc

if not host_malloc._is_glibc():
    pytest.skip("glibc's malloc arenas only", allow_module_level=True)

CHILD = textwrap.dedent("""
    import ctypes, os, tempfile, threading
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]

    def arenas():
        fd, path = tempfile.mkstemp(); os.close(fd)
        fp = libc.fopen(path.encode(), b"w"); libc.malloc_info(0, fp); libc.fclose(fp)
        with open(path) as f:
            text = f.read()
        os.unlink(path)
        return text.count("<heap nr=")

    import torch
    from hf_tpu import host_malloc
    m = torch.nn.Linear(64, 64).to("tpu")
    m(torch.randn(8, 64, device="tpu")).sum().backward()  # autograd's tpu device thread allocates

    def work():
        keep = [bytearray(64 << 10) for _ in range(20)]  # below the mmap threshold: from the thread's arena

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(arenas(), host_malloc.applied())
""")


def _run(**env: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "HF_TPU_MALLOC_ARENA_MAX")}
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                       env={**base, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    count, applied = r.stdout.split()[-2:]
    return int(count), applied


def test_one_arena_by_default() -> None:
    count, applied = _run()
    assert (count, applied) == (1, "1")


def test_env_zero_keeps_glibc_default() -> None:
    # also shows that the count above can see several arenas: without the limit every thread gets its own
    count, applied = _run(HF_TPU_MALLOC_ARENA_MAX="0")
    assert applied == "None" and count > 4, count


def test_users_malloc_arena_max_wins() -> None:
    count, applied = _run(MALLOC_ARENA_MAX="2")
    assert applied == "None" and count == 2, count
