"""`tpu_dist`: torch.distributed's backend for tpu tensors on one host (TorchTPU's name for its own).

`init_process_group(backend="tpu_dist")`, `"cpu:gloo,tpu:tpu_dist"`, or no backend at all (PyTorch then
picks gloo for cpu and the backend registered for the accelerator, this one) give a process group whose
collectives take tpu tensors as CUDA's take CUDA tensors: results land in the tpu tensors passed in.

The stand-in's devices are one host's memory, so a collective runs gloo (PyTorch's CPU backend) on CPU
copies: tpu inputs are copied to CPU, gloo runs, and the tensors the collective writes are copied back.
CPU tensors go to gloo unchanged, so one group serves both devices. PyTorch lets a Python backend be a
`ProcessGroup` subclass (its C++ `Backend` cannot be subclassed from Python); such a group replaces the
one `init_process_group` was building, which is why it also serves CPU tensors itself. Each method has a
collective's signature as `torch.distributed` calls it (`group.allreduce(tensors, opts)`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

NAME = "tpu_dist"
_Gloo = torch._C._distributed_c10d.ProcessGroupGloo


def _flat(tensors: Any) -> list[torch.Tensor]:
    """The tensors in a tensor, a list of them or a list of lists."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    return [t for x in tensors for t in _flat(x)]


def _to_cpu(tensors: Any) -> Any:
    """The same structure with every tpu tensor replaced by a CPU copy (CPU tensors kept as they are)."""
    if isinstance(tensors, torch.Tensor):
        return tensors.detach().cpu() if tensors.device.type == "tpu" else tensors
    return [_to_cpu(x) for x in tensors]


def _done(result: Any) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


class TpuProcessGroup(dist.ProcessGroup):
    """A process group of `size` processes on one host whose collectives take tpu and CPU tensors."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = _Gloo(store, rank, size, timeout=timeout)
        # object collectives (all_gather_object, ...) pick the group's device: CPU, served by gloo
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return NAME

    def _run(self, method: str, args: tuple, written: Iterable[Any]) -> dist.Work:
        """gloo's `method` on CPU copies of args; then each tpu tensor in `written` gets its copy's value."""
        written = [t for t in _flat(list(written)) if t.device.type == "tpu"]
        if not any(t.device.type == "tpu" for t in _flat([a for a in args if _is_tensors(a)])):
            return getattr(self._gloo, method)(*args)  # CPU tensors only: gloo itself, asynchronous
        copies: dict[int, torch.Tensor] = {}

        def cpu(a: Any) -> Any:
            if not _is_tensors(a):
                return a
            c = _to_cpu(a)
            for t, ct in zip(_flat(a), _flat(c), strict=True):
                copies[id(t)] = ct
            return c

        cpu_args = tuple(cpu(a) for a in args)
        getattr(self._gloo, method)(*cpu_args).wait()
        with torch.no_grad():
            for t in written:
                t.copy_(copies[id(t)])
        return _done(written)

    # -------------------------------------------------------------------- collectives, as dist calls them
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run("allreduce", _with(tensors, opts or dist.AllreduceOptions()), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run("allreduce_coalesced", _with(tensors, opts or dist.AllreduceCoalescedOptions()), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        return self._run("broadcast", (tensors, opts), tensors if self.rank() != opts.rootRank else [])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run("allgather", _with((outputs, inputs), opts or dist.AllgatherOptions()), outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._run("_allgather_base", _with((output, input), opts or dist.AllgatherOptions()), [output])

    _allgather_base = all_gather_single  # the name before torch 2.13

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        return self._run("reduce_scatter", _with((outputs, inputs), opts or dist.ReduceScatterOptions()), outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._run("_reduce_scatter_base", _with((output, input), opts or dist.ReduceScatterOptions()),
                         [output])

    _reduce_scatter_base = reduce_scatter_single

    # Functional collectives (torch.distributed._functional_collectives: DTensor's redistribute, FSDP2's
    # full_tensor) gather and reduce-scatter through these coalesced forms: C++ calls them on the group, and
    # calls the single-tensor forms above only from Python. Gloo has no coalesced form: one call per pair.
    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        opts = opts or dist.AllgatherOptions()
        for o, i in zip(outputs, inputs, strict=True):
            self._run("_allgather_base", (o, i, opts), [o]).wait()
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # the name before torch 2.13

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        for o, i in zip(outputs, inputs, strict=True):
            self._run("_reduce_scatter_base", (o, i, opts), [o]).wait()
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceOptions()
        return self._run("reduce", (tensors, opts), tensors if self.rank() == opts.rootRank else [])

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._run("gather", _with((outputs, inputs), opts or dist.GatherOptions()), outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        return self._run("scatter", _with((outputs, inputs), opts or dist.ScatterOptions()), outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> dist.Work:
        return self._run("alltoall_base", (output, input, output_splits, input_splits,
                                           opts or dist.AllToAllOptions()), [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """`dist.all_to_all` (the list form), which calls the group's own `alltoall`."""
        return self._run("alltoall", (outputs, inputs, opts or dist.AllToAllOptions()), outputs)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        return self._run("send", (tensors, dst, tag), [])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        return self._run("recv", (tensors, src, tag), tensors)

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._gloo.barrier(opts or dist.BarrierOptions())


def _is_tensors(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return True
    return isinstance(a, (list, tuple)) and bool(a) and all(_is_tensors(x) for x in a)


def _with(args: Any, opts: Any) -> tuple:
    return (*(args if isinstance(args, tuple) else (args,)), opts)


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> TpuProcessGroup:
    return TpuProcessGroup(store, rank, size, timeout)


def register(create: Callable[..., Any] = _create) -> None:
    """Make `tpu_dist` a torch.distributed backend for device type `tpu` (and the default one for it), and
    let a `gloo` group take tpu tensors (below)."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, create, devices=["tpu"])
    _route_tpu_in_backend_config()


def _route_tpu_in_backend_config() -> None:
    """Upstream (PyTorch): `init_process_group("gloo")` maps only cpu and cuda to gloo (gloo serves CUDA
    tensors by staging them through host memory), so a tpu tensor in that group fails with "No backend
    type associated with device type tpu". Fix: where gloo serves cpu and nothing is named for tpu, tpu
    gets tpu_dist, which is that same staging for tpu tensors. Whenever tpu_dist is in a group, it is
    created first: its group replaces the one being built and serves CPU tensors with its own gloo, so
    creating gloo for cpu before it would only be a rendezvous thrown away."""
    config = dist.distributed_c10d.BackendConfig
    if getattr(config.__init__, "_hf_tpu_patched", False):
        return
    orig = config.__init__

    def __init__(self: Any, backend: Any) -> None:  # noqa: N807 - BackendConfig's own
        orig(self, backend)
        m = self.device_backend_map
        if "tpu" not in m and m.get("cpu") == dist.Backend.GLOO:
            m["tpu"] = dist.Backend(NAME)
        if m.get("tpu") == NAME:
            self.device_backend_map = {"tpu": m["tpu"], **{k: v for k, v in m.items() if k != "tpu"}}

    __init__._hf_tpu_patched = True  # type: ignore[attr-defined]
    config.__init__ = __init__
