"""tpu -> CPU copies (host_copy.copy_to_cpu): a large `.cpu()` is copied by PyTorch's copy_ from a DLPack view of
the XLA buffer (PARALLEL_COPY_BYTES), a small one by numpy; both give CPU's values and a CPU tensor of its own."""

from __future__ import annotations

import os

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import host_copy

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex128]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(6, 5, 4, dtype=torch.complex128 if dtype.is_complex else torch.float64) * 50
    return x.to(dtype)


@pytest.mark.parametrize("threshold", [0, 1 << 62], ids=["copy_", "copyto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_copy_equals_cpu(dtype, threshold, monkeypatch):
    monkeypatch.setattr(host_copy, "PARALLEL_COPY_BYTES", threshold)
    x = _sample(dtype)
    t = x.to("tpu")
    assert torch.equal(t.cpu(), x)
    assert torch.equal(t[2:, 1].cpu(), x[2:, 1])  # a view's value
    assert torch.equal(t.transpose(0, 2).cpu(), x.transpose(0, 2))
    assert t.cpu().dtype == dtype


def test_a_large_copy_takes_copy_and_owns_its_memory(monkeypatch):
    """A 40 MB float32 tensor (a Qwen3 forward's logits) goes through torch.from_dlpack + copy_, and the CPU
    result is a copy: writing to it leaves the tpu tensor as it was."""
    calls = []
    real = torch.from_dlpack

    def spy(x):
        calls.append(tuple(x.shape))
        return real(x)

    monkeypatch.setattr(torch, "from_dlpack", spy)
    x = torch.randn(64, 160_000)
    assert x.nbytes >= host_copy.PARALLEL_COPY_BYTES
    t = x.to("tpu")
    c = t.cpu()
    assert calls == [(64, 160_000)]
    assert torch.equal(c, x)
    c.fill_(0)
    assert torch.equal(t.cpu(), x)
    small = torch.randn(64, 100)
    assert torch.equal(small.to("tpu").cpu(), small)
    assert len(calls) == 2  # the second large copy only: the small one took numpy


def _vm_flags(address: int) -> list[str]:
    """VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _thp_mode() -> str | None:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="no transparent huge pages on this host")
def test_a_large_cpu_copy_asks_for_huge_pages():
    """The destination of a large `.cpu()` (glibc maps it fresh, so every page is faulted in by the copy) is
    advised MADV_HUGEPAGE: its mapping carries the kernel's 'hg' flag. A small one is left alone."""
    x = torch.randn(64, 160_000)
    c = x.to("tpu").cpu()
    assert torch.equal(c, x)
    assert "hg" in _vm_flags(c.data_ptr() + c.nbytes // 2)
    if os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":  # PyTorch's own switch advises every large tensor
        assert "hg" not in _vm_flags(x.data_ptr() + x.nbytes // 2)  # the source, allocated by torch alone
