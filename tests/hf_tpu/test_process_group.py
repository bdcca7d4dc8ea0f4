"""tpu tensors in torch.distributed process groups on one host (issue 25, item 7): `tpu_dist`, registered
for device type tpu, in every form init_process_group takes; each collective on tpu tensors must give what
the same collective gives on CPU tensors in the same group. Without tpu_dist each raised "No backend type
associated with device type tpu"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FORMS = ["gloo", "cpu:gloo,tpu:tpu_dist", "tpu_dist", None]


def _collectives(device: str, rank: int, world: int) -> dict[str, object]:
    """Every collective tpu_dist serves, on tensors of `device`; results as CPU tensors."""
    r: dict[str, object] = {}
    t = torch.arange(4.0, device=device) * (rank + 1)
    dist.all_reduce(t)
    r["all_reduce"] = t
    t = torch.arange(4, device=device) + rank
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    r["all_reduce_max_int"] = t
    t = torch.arange(3.0, device=device) + 10 * rank
    dist.broadcast(t, src=world - 1)
    r["broadcast"] = t
    outs = [torch.empty(2, 3, device=device) for _ in range(world)]
    dist.all_gather(outs, torch.full((2, 3), float(rank), device=device))
    r["all_gather"] = torch.stack(outs)
    out = torch.empty(2 * world, device=device)
    dist.all_gather_into_tensor(out, torch.arange(2.0, device=device) + rank)
    r["all_gather_into_tensor"] = out
    out = torch.empty(3, device=device)
    dist.reduce_scatter(out, [torch.full((3,), float(rank * world + i), device=device) for i in range(world)])
    r["reduce_scatter"] = out
    out = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * world, device=device) * (rank + 1))
    r["reduce_scatter_tensor"] = out
    t = torch.ones(2, device=device) * (rank + 2)
    dist.reduce(t, dst=0)
    r["reduce"] = t
    base = torch.zeros(6, device=device)
    view = base[1:5]  # a collective into a view writes through to its base, as on CPU
    view.fill_(rank + 1.0)
    dist.all_reduce(view)
    r["all_reduce_view_base"] = base
    work = dist.all_reduce(t2 := torch.full((2,), 3.0, device=device), async_op=True)
    work.wait()
    r["async_all_reduce"] = t2
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    r["all_gather_object"] = gathered
    dist.barrier()
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in r.items()}


def _compare(rank: int, world: int) -> list[str]:
    """Collectives on tpu against the same on CPU in the current group: the names that differ."""
    cpu, tpu = _collectives("cpu", rank, world), _collectives("tpu", rank, world)
    bad = []
    for name, want in cpu.items():
        got = tpu[name]
        same = (torch.equal(got, want) and got.dtype == want.dtype) if isinstance(want, torch.Tensor) else got == want
        if not same:
            bad.append(f"{name}: tpu {got} cpu {want}")
    return bad


@pytest.mark.parametrize("backend", FORMS)
def test_one_process_group_every_form(backend, tmp_path):
    """One rank, through the whole torch.distributed API: tpu tensors as CPU tensors, in each form."""
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        assert _compare(0, 1) == []
        assert dist.get_backend() == (str(backend) if backend else "undefined")
    finally:
        dist.destroy_process_group()


def _rank_main(rank: int, world: int, directory: str) -> None:
    results = []
    for i, backend in enumerate(FORMS[:2]):
        dist.init_process_group(backend, init_method=f"file://{directory}/init{i}", rank=rank, world_size=world)
        results.append(f"{backend}: {_compare(rank, world)}")
        dist.destroy_process_group()
    Path(directory, f"rank{rank}").write_text("\n".join(results))


@pytest.mark.slow
def test_two_processes_on_one_host(tmp_path):
    """Two spawned processes (init_method file://), in the gloo and cpu:gloo,tpu:tpu_dist forms: each
    collective's result on tpu equals CPU's on both ranks (slow: each process starts torch and JAX)."""
    mp.spawn(_rank_main, args=(2, str(tmp_path)), nprocs=2)
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}").read_text().splitlines()
        assert lines == [f"{b}: []" for b in FORMS[:2]], lines


def test_tpu_dist_is_the_default_backend_for_tpu():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert "tpu" in dist.Backend.backend_capability["tpu_dist"]
