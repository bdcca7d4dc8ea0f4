"""Strict eager's float32 dots against weights packed once (hf_tpu/packed_eager.py): a weight two dots in a row
read, and nothing else between, is packed and its array dropped; products then come from the packed copy within
float32's error of CPU; a tied weight (read by its gather every forward) is never packed; a read-back weight
keeps its bits (and XLA's dot from then on); a write is seen by the next forward; training and other
precisions and fused mode keep XLA's dot; a copy is freed only after the queued dots that read it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_tpu
from hf_tpu import packed_weights, runtime
from hf_tpu import tensor as T
from tests.hf_tpu.packed_models import Model, close, pair

pytestmark = pytest.mark.skipif(not packed_weights.ENABLED or not packed_weights.available(),
                                reason="no MKL packed GEMM in this PyTorch (ARM), or HF_TPU_PACKED_WEIGHTS=0")


@pytest.fixture(autouse=True)
def _highest() -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


PACKED = ("up", "down", "conv_w")  # the tied head stays XLA's


def _weights(m: Model) -> dict[str, torch.Tensor]:
    return {"up": m.up.weight, "down": m.down.weight, "conv_w": m.conv_w}


def _dropped(t: torch.Tensor) -> bool:
    return T.payload(t).buf._array is None and packed_weights._entries.get(T.payload(t).buf) is not None


def test_second_forward_packs_and_later_ones_compute_from_the_copies() -> None:
    cpu, tpu, ids = pair()
    ids_t = ids.to("tpu")
    with torch.no_grad():
        want = cpu(ids)
        counts = []
        for _ in range(4):
            before = packed_weights.calls()
            close(tpu(ids_t), want)
            counts.append(packed_weights.calls() - before)
    # the first forward watches, the second packs (each weight at its dot) and computes from the copies
    assert counts == [0, len(PACKED), len(PACKED), len(PACKED)]
    for name, w in _weights(tpu).items():
        assert _dropped(w), f"{name}: its array was kept"
    emb = T.payload(tpu.emb.weight).buf
    assert packed_weights._entries.get(emb) is None, "the tied embedding was packed"
    # read back (state_dict, .cpu()): the weights' own bits
    for name, value in tpu.state_dict().items():
        assert torch.equal(value.cpu().view(torch.int32), cpu.state_dict()[name].view(torch.int32)), name


def test_a_weight_read_back_keeps_its_array_and_xlas_dot() -> None:
    cpu, tpu, ids = pair()
    ids_t = ids.to("tpu")
    with torch.no_grad():
        want = cpu(ids)
        for _ in range(2):
            tpu(ids_t)
        assert torch.equal(tpu.up.weight.cpu(), cpu.up.weight)  # rebuilt from the copy: read elsewhere
        counts = []
        for _ in range(3):
            before = packed_weights.calls()
            close(tpu(ids_t), want)
            counts.append(packed_weights.calls() - before)
    assert counts == [len(PACKED) - 1] * 3
    assert T.payload(tpu.up.weight).buf._array is not None
    assert packed_weights._entries.get(T.payload(tpu.up.weight).buf) is None, "its copy was kept"


def test_a_write_is_seen_by_the_next_forward() -> None:
    cpu, tpu, ids = pair()
    ids_t = ids.to("tpu")
    with torch.no_grad():
        for _ in range(3):
            tpu(ids_t)
        new = torch.randn_like(cpu.up.weight)
        cpu.up.weight.copy_(new)
        tpu.up.weight.copy_(new.to("tpu"))  # replaces the array: packed again
        cpu.conv_w.mul_(2)
        tpu.conv_w.mul_(2)  # a read-modify-write of a dropped array: rebuilt, then XLA's dot
        counts = []
        for _ in range(3):  # XLA's dot (up watched again), then up packed again, then from the new copy
            before = packed_weights.calls()
            close(tpu(ids_t), cpu(ids))
            counts.append(packed_weights.calls() - before)
    assert counts == [1, 2, 2]  # down throughout; up from the second forward; conv_w no more
    assert _dropped(tpu.up.weight)
    assert torch.equal(tpu.conv_w.cpu(), cpu.conv_w)


def test_training_keeps_xlas_dot() -> None:
    cpu, tpu, ids = pair()
    cpu.train()
    tpu.train()
    # a Linear on an input that needs no gradient: its backward (the weight's gradient, grad.t() @ x) never
    # reads the weight, so only the gradient check keeps it from being packed
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 512)
    lin_t = torch.nn.Linear(256, 512).to("tpu")
    lin_t.load_state_dict(lin.state_dict())
    x = torch.randn(64, 256)
    before = packed_weights.calls()
    for _ in range(3):  # gradients accumulate: no optimizer step reads the weights between the forwards
        tpu(ids.to("tpu")).pow(2).mean().backward()
        cpu(ids).pow(2).mean().backward()
        lin_t(x.to("tpu")).pow(2).mean().backward()
        lin(x).pow(2).mean().backward()
    assert packed_weights.calls() == before
    for name, w in {**_weights(tpu), "lin": lin_t.weight}.items():
        assert not _dropped(w), name
    torch.testing.assert_close(tpu.up.weight.grad.cpu(), cpu.up.weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lin_t.weight.grad.cpu(), lin.weight.grad, rtol=1e-4, atol=1e-5)


def test_other_precisions_keep_xlas_dot() -> None:
    torch.set_float32_matmul_precision("medium")
    _, tpu, ids = pair()
    before = packed_weights.calls()
    with torch.no_grad():
        for _ in range(3):
            tpu(ids.to("tpu"))
    assert packed_weights.calls() == before
    assert not _dropped(tpu.up.weight)


def test_fused_mode_keeps_xlas_dot() -> None:
    cpu, tpu, ids = pair()
    before = packed_weights.calls()
    with torch.no_grad(), hf_tpu.defer_and_fuse():
        for _ in range(3):
            close(tpu(ids.to("tpu")), cpu(ids))
    assert packed_weights.calls() == before
    assert not _dropped(tpu.up.weight)


def test_a_copy_is_freed_only_after_the_queued_dots_reading_it() -> None:
    jax = runtime.jax()
    torch.manual_seed(0)
    w = torch.randn(512, 256)
    b = torch.randn(512)
    wt, bt = w.to("tpu"), b.to("tpu")
    x = torch.randn(64, 256)
    with torch.no_grad():
        for _ in range(2):  # watched, then packed
            torch.nn.functional.linear(x.to("tpu"), wt, bt)
        assert _dropped(wt)

        def late(a: Any, m: Any) -> Any:  # a, once a chain of large products is done (~0.5 s here)
            s = m
            for _ in range(6):
                s = s @ m
            return a + 0 * s[: a.shape[0], : a.shape[1]]

        # an input made by one long program (run asynchronously), so that the dot reading the copy stays queued
        m = jax.numpy.ones((2048, 2048), "float32") / 2048
        xt = T.wrap(jax.jit(late)(T.value(x.to("tpu")), m))
        before = packed_weights.calls()
        y = torch.nn.functional.linear(xt, wt, bt)
        packed_weights.forget(T.payload(wt).buf)  # frees the copy now: must wait for y's program first
        close(y, torch.nn.functional.linear(x, w, b))
    assert packed_weights.calls() == before + 1
