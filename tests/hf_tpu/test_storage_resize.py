"""`untyped_storage().resize_` on tpu storages, against CPU (issue 30: FSDP2 frees each unsharded parameter
with `resize_(0)` after use and re-allocates it with `resize_(its bytes)` before the next all-gather writes
it). The resize goes through the C++ hooks' resizePrivateUse1Bytes (hf_tpu/native) to the buffer's JAX
array (hf_tpu/storage_ops.resize_storage)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import hf_tpu
from hf_tpu import native


def _sequence(device: str, dtype: torch.dtype) -> list:
    """Resizes and writes whose results are defined on CPU (no read of freed or never-written bytes)."""
    torch.manual_seed(0)
    t = torch.randn(3, 4).to(dtype).to(device)
    col = t.t()[1]  # a strided view: it reads the storage through its geometry
    s = t.untyped_storage()
    item = t.element_size()
    seen = []
    s.resize_(12 * item)  # its own size: nothing changes
    seen += [s.size(), t.to("cpu", copy=True), col.to("cpu", copy=True)]
    s.resize_(20 * item)  # grown: the first 12 elements are kept, the tensor and its view still read them
    seen += [s.size(), t.to("cpu", copy=True), col.to("cpu", copy=True)]
    t.mul_(3)  # (pending in fused mode when the storage is freed)
    s.resize_(0)  # freed
    seen.append(s.size())
    s.resize_(12 * item)  # allocated again (contents undefined until written)
    t.copy_(torch.arange(12.0).reshape(3, 4).to(dtype))
    seen += [s.size(), t.to("cpu", copy=True), col.to("cpu", copy=True), (t * 2).to("cpu", copy=True)]
    col.mul_(-1)  # a write through the view lands in the re-allocated storage
    seen += [t.to("cpu", copy=True)]
    t.add_(1)  # (pending in fused mode when the storage shrinks)
    s.resize_(6 * item)  # shrunk: the first half of the elements is kept
    seen += [s.size(), t.view(-1)[:6].to("cpu", copy=True)]
    return seen


def test_the_cpp_hooks_serve_tpu():
    assert native.status()["loaded"], native.status()


@pytest.mark.parametrize("fuse", [False, True], ids=["strict", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_storage_resize_as_on_cpu(dtype, fuse):
    """In fused mode the writes are still pending when the storage is resized or freed."""
    cpu = _sequence("cpu", dtype)
    with hf_tpu.defer_and_fuse() if fuse else contextlib.nullcontext():
        tpu = _sequence("tpu", dtype)
    assert len(cpu) == len(tpu)
    for i, (c, t) in enumerate(zip(cpu, tpu, strict=True)):
        if isinstance(c, torch.Tensor):
            assert torch.equal(c, t), (i, c, t)
        else:
            assert c == t, (i, c, t)


def test_reading_a_freed_tpu_storage_raises():
    """CPU reads freed memory (and may crash); tpu says what happened."""
    t = torch.ones(4, device="tpu")
    view = t[1:]
    t.untyped_storage().resize_(0)
    for read in (lambda: t + 1, lambda: view.cpu()):
        with pytest.raises(RuntimeError, match="resized to 0 bytes"):
            read()


def test_freeing_a_storage_frees_its_device_memory():
    """resize_(0) releases the JAX array (what FSDP2 frees it for); resize_ back allocates it again."""
    acc = torch.accelerator
    t = torch.ones(1000, device="tpu")
    t.cpu()
    base = acc.memory_allocated()
    t.untyped_storage().resize_(0)
    assert acc.memory_allocated() == base - 4000
    t.untyped_storage().resize_(4000)
    t.fill_(2.0)
    assert acc.memory_allocated() == base and torch.equal(t.cpu(), torch.full((1000,), 2.0))


def test_fsdp2_unsharded_parameter_pattern_as_on_cpu():
    """FSDP2's own sequence (torch/distributed/fsdp/_fully_shard/_fsdp_param.py): an `empty` all-gather
    output, alloc_storage, the all-gather written through a (world, -1) view, the parameter an as_strided view of the
    output, free_storage after use, and again: the parameter reads each step's values."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import alloc_storage, free_storage

    def run(device: str) -> list[torch.Tensor]:
        out = torch.empty(2 * 6, device=device)
        param = torch.as_strided(out, (3, 4), (4, 1), storage_offset=0)
        seen = []
        for step in range(2):
            alloc_storage(out)
            shards = torch.arange(12.0).reshape(2, 6) + 100 * step
            out.view(2, -1).copy_(shards.to(device))
            seen.append((param @ torch.ones(4, 2, device=device)).cpu())
            free_storage(out)
            seen.append(torch.tensor(out.untyped_storage().size()))
        return seen

    for c, t in zip(run("cpu"), run("tpu"), strict=True):
        assert torch.equal(c, t), (c, t)


def test_a_resize_that_splits_an_element_raises():
    """A tpu storage holds whole elements (a JAX array): CPU's byte-level sizes that split one are refused."""
    t = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="not a whole number of elements"):
        t.untyped_storage().resize_(6)
