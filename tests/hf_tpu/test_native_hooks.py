"""What a user does around training and serving, on tpu as on CPU/CUDA (issue 25, item 5): pinned memory and
the DataLoader, torch.Generator("tpu"), events and streams, the device guard, torch.accelerator's
synchronize and memory figures. These go through the C++ hooks (hf_tpu/native); with PyTorch's Python
hooks every one of them raised."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import pytest
import torch

from hf_tpu import native
from hf_tpu.precision import cpu_reference


def test_the_cpp_hooks_serve_tpu():
    """Everything below relies on them: if the build broke, say so here, not as a dozen PyTorch errors."""
    assert native.status()["loaded"], native.status()


# ------------------------------------------------------------------------------------------- pinned memory
def test_pin_memory_and_is_pinned_as_on_cpu():
    t = torch.arange(12.0).reshape(3, 4)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned() and p.device.type == "cpu"
    assert torch.equal(p, t) and p.data_ptr() != t.data_ptr()
    assert p[1:].is_pinned()  # a view inside a pinned block is pinned, as with CUDA's host allocator
    assert p.pin_memory().data_ptr() == p.data_ptr()  # pinning pinned memory is a no-op
    e = torch.empty(5, pin_memory=True)
    assert e.is_pinned()
    moved = p.to("tpu", non_blocking=True)
    assert moved.device.type == "tpu" and torch.equal(moved.cpu(), t)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_pin_memory_trains_as_on_cpu(num_workers, highest):
    """Trainer's DataLoader pins memory when an accelerator is present: it crashed on its first batch.
    The batches are pinned (num_workers=1: pinned by DataLoader's pin-memory thread), equal to unpinned
    ones, and a few SGD steps on tpu fed by them give CPU's losses."""
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    pinned = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, num_workers=num_workers)
    plain = torch.utils.data.DataLoader(data, batch_size=4)

    def train(device: str, loader) -> list[float]:
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in loader:
            if device == "tpu":
                assert x.is_pinned() and y.is_pinned()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    with cpu_reference():
        want = train("cpu", plain)
    got = train("tpu", pinned)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


# -------------------------------------------------------------------------------------------- generators
@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_generator_semantics_match_cpu(device):
    """The properties a user relies on, checked the same way on a CPU and a tpu generator."""
    g = torch.Generator(device)
    assert g.device.type == device and g.initial_seed() == torch.Generator("cpu").initial_seed()

    def draw() -> torch.Tensor:
        return torch.randn(1000, device=device, generator=g).cpu()

    g.manual_seed(7)
    a, b = draw(), draw()
    assert not torch.equal(a, b)
    g.manual_seed(7)
    assert torch.equal(draw(), a) and torch.equal(draw(), b)  # reseeding repeats the stream
    state = g.get_state()
    c = draw()
    g.set_state(state)
    assert torch.equal(draw(), c)  # get_state/set_state round-trip
    fresh = torch.Generator(device).manual_seed(7)
    assert torch.equal(torch.randn(1000, device=device, generator=fresh).cpu(), a)
    assert abs(a.mean().item()) < 0.15 and abs(a.std().item() - 1) < 0.1  # standard normal, not garbage
    other = torch.Generator(device).manual_seed(8)
    assert not torch.equal(torch.randn(1000, device=device, generator=other).cpu(), a)
    assert g.seed() == g.initial_seed()  # a fresh nondeterministic seed, reported back
    with pytest.raises(RuntimeError):
        g.set_state(torch.zeros(3, dtype=torch.uint8))  # not a state: refused on both


def test_tpu_generator_feeds_every_random_op():
    g = torch.Generator("tpu")
    ops = {
        "rand": lambda: torch.rand(8, device="tpu", generator=g),
        "randint": lambda: torch.randint(0, 100, (8,), device="tpu", generator=g),
        "randperm": lambda: torch.randperm(8, device="tpu", generator=g),
        "normal_": lambda: torch.empty(8, device="tpu").normal_(generator=g),
        "uniform_": lambda: torch.empty(8, device="tpu").uniform_(generator=g),
        "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.5, device="tpu"), generator=g),
        "multinomial": lambda: torch.multinomial(torch.ones(8, device="tpu"), 4, generator=g),
    }
    for name, op in ops.items():
        g.manual_seed(3)
        first = op().cpu()
        assert g.get_offset() == 1, name  # one key per op, as Philox's offset advances per kernel
        g.manual_seed(3)
        assert torch.equal(op().cpu(), first), name


# ------------------------------------------------------------------------------------- events and streams
def test_events_time_the_work_between_them():
    start, end = torch.Event("tpu", enable_timing=True), torch.Event("tpu", enable_timing=True)
    x = torch.randn(256, 256, device="tpu")
    (x @ x).cpu()  # compile outside the timed region
    t0 = time.perf_counter()
    start.record()
    for _ in range(5):
        x = x @ x / 256
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert start.query() and end.query()
    assert 0 < start.elapsed_time(end) <= wall_ms
    untimed = torch.Event("tpu")
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing"):  # as on CUDA
        start.elapsed_time(untimed)
    with pytest.raises(ValueError, match="recorded"):
        torch.Event("tpu", enable_timing=True).elapsed_time(end)


def test_streams_and_device_guard():
    s = torch.Stream("tpu")
    assert s.device.type == "tpu" and s != torch.accelerator.current_stream()
    with s:
        assert torch.accelerator.current_stream() == s
        y = torch.ones(3, device="tpu") * 2
    assert torch.accelerator.current_stream() != s
    ev = s.record_event()
    torch.accelerator.current_stream().wait_event(ev)
    s.synchronize()
    assert s.query() and torch.equal(y.cpu(), torch.full((3,), 2.0))
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match=r"tpu:1 is not a valid device.*HF_TPU_NUM_DEVICES"):
        torch.accelerator.set_device_index(1)


# ------------------------------------------------------------------------------------- torch.accelerator
def test_accelerator_basics():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == 1 and torch.accelerator.is_available()
    x = torch.randn(64, 64, device="tpu")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    with cpu_reference():
        assert torch.allclose(y.cpu(), x.cpu() @ x.cpu(), rtol=2e-2, atol=2e-1)
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total


def test_memory_figures_are_bytes_of_live_tpu_tensors():
    acc = torch.accelerator
    gc.collect()
    base = acc.memory_allocated()
    x = torch.ones(1000, device="tpu")
    assert acc.memory_allocated() - base == x.numel() * x.element_size() == torch.ones(1000).nbytes
    views = (x[::2], x.view(10, 100), x.t() if x.dim() == 2 else x.unsqueeze(0))
    x.add_(1)  # in place: the tensor's new array replaces the old one
    assert acc.memory_allocated() - base == 4000
    y = x.to(torch.float16) * 2
    assert acc.memory_allocated() - base == 4000 + 2000
    del x, y, views
    gc.collect()
    assert acc.memory_allocated() == base
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == base
    held = [torch.zeros(250_000, device="tpu") for _ in range(3)]
    peak = acc.max_memory_allocated()
    assert peak - base >= 3_000_000 and acc.memory_allocated() - base == 3_000_000
    del held
    gc.collect()
    assert acc.memory_allocated() == base and acc.max_memory_allocated() == peak
    model = torch.nn.Linear(256, 128).to("tpu")
    assert acc.memory_allocated() - base == sum(p.numel() * p.element_size() for p in model.parameters())
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == acc.memory_allocated() == torch.tpu.memory_allocated()
    assert acc.memory_reserved() == acc.memory_allocated()  # no cache: nothing reserved beyond live tensors
    acc.empty_cache()
    assert torch.tpu.max_memory_allocated() == acc.max_memory_allocated()


def test_tpu_storage_cannot_be_allocated_directly():
    with pytest.raises(RuntimeError, match="JAX arrays"):
        torch.UntypedStorage(16, device="tpu")


# ------------------------------------------------------------------------------------- without the hooks
@pytest.mark.slow
def test_python_hooks_when_the_cpp_part_is_off():
    """HF_TPU_NATIVE=0 (as when no compiler is found): tpu still works; the hooks above raise PyTorch's
    errors. Shows that the C++ part is what makes them work."""
    code = (
        "import torch; from hf_tpu import native\n"
        "assert not native.status()['loaded']\n"
        "assert torch.equal((torch.ones(3, device='tpu') + 1).cpu(), torch.full((3,), 2.0))\n"
        "for f in (lambda: torch.ones(2).pin_memory(), lambda: torch.Generator('tpu'),\n"
        "          lambda: torch.accelerator.memory_allocated(), lambda: torch.accelerator.synchronize()):\n"
        "    try:\n"
        "        f(); print('worked')\n"
        "    except (RuntimeError, NotImplementedError):\n"
        "        print('raised')\n"
    )
    env = {**os.environ, "HF_TPU_NATIVE": "0"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["raised"] * 4
