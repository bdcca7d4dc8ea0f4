"""A compiled graph's XLA program is awaited before its call returns on the host CPU (runtime.await_graph_programs),
so XLA:CPU does not keep the finished program's buffer table (inputs, outputs, temporaries) alive until its
thread dispatches again: a compiled backward runs on autograd's device thread, which dispatches nothing more until
the next backward, and GPT-2 124M's training step kept 0.6-1.1 GB of such memory through the optimizer step
(issue 31). Measured with glibc's own account of the bytes it has handed out (mallinfo2) less the bytes live tpu
tensors hold. The wait changes no number (the same program, only waited for)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import host_malloc, runtime

pytestmark = pytest.mark.skipif(not host_malloc._is_glibc(), reason="mallinfo2 is glibc's")

MIB = 1 << 20
N = 2048  # 16 MiB float32 matrices: the retained table (saved product, cumsum, temporaries) is ~4-6 of them

CHILD = r"""
import ctypes, json, time
import torch
import hf_tpu
from hf_tpu import memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2

def unheld():  # bytes glibc has handed out that no live tpu tensor holds
    m = mallinfo2()
    return m.uordblks + m.hblkhd - memory.allocated()

def f(x, w):
    return torch.cumsum(x @ w, 0).sin().sum()  # the product is saved for the backward

fn = torch.compile(f, backend="tpu")
x = torch.randn(N, N, device="tpu", requires_grad=True)
w = torch.randn(N, N, device="tpu", requires_grad=True)
out = []
for step in range(3):  # step 0 traces and compiles; 1 and 2 are measured
    torch.ones(1, device="tpu").cpu()  # the main thread's last program awaited: nothing of it kept
    before = unheld()
    fn(x, w).backward()
    time.sleep(0.5)  # an awaited program's table is let go on XLA's worker thread just after it finishes
    out.append(unheld() - before)
    x.grad = w.grad = None
print(json.dumps(out[1:]))
""".replace("randn(N, N", f"randn({N}, {N}")


def _unheld_growth(env: dict[str, str]) -> list[int]:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not runtime.await_graph_programs(), reason="only on the host CPU with asynchronous dispatch")
def test_a_compiled_step_leaves_no_memory_behind_that_no_tensor_holds() -> None:
    # without the wait the backward program's table (~50-65 MiB) stays in at least one of the two steps, mostly;
    # a clean-clone CI run once saw XLA:CPU let it go anyway (0.01 MiB): then the check cannot tell the two
    # apart, and it is skipped rather than passed
    kept = _unheld_growth({runtime.AWAIT_GRAPHS_ENV: "0"})
    if max(kept) <= 32 * MIB:
        pytest.skip(f"without the wait XLA:CPU kept no table this run ({[round(g / MIB, 2) for g in kept]} MiB)")
    growth = _unheld_growth({})
    assert max(growth) < 12 * MIB, [g / MIB for g in growth]

