"""One process of test_executable_cache.py: a fixed set of eager ops on tpu (matmul, pointwise, reductions, a
view read inside its consumer's program, cat), compared with CPU. Prints, as the last line of JSON: op programs
traced (op_jit.traces), XLA compiles (not counting JAX's own cache hits), the executable cache's stats, the largest difference from CPU,
and a digest of the tpu outputs' bits. CHILD_PRECISION sets the matmul precision; CHILD_INJECT=1 replaces
gelu's lowering (x -> 2 * gelu(x)) for the whole process, as the sweep's canary does. CHILD_SOURCES=<text>
stands for another hf_tpu (a commit): the executable cache's digest of the sources becomes <text>;
CHILD_CHANGE_GELU=1 changes gelu's lowering in the package's own table (x -> 2 * gelu(x)), as a commit
changing that lowering would: the program's ident stays, its lowered program changes. CHILD_KIND picks
another case (graph_main, optim_main, strided_main)."""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import torch

import hf_tpu
from hf_tpu import executable_cache, op_jit, runtime


def ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    h = torch.nn.functional.gelu(x @ w + 1.5)
    return [h, h.softmax(-1).sum(0), torch.nn.functional.layer_norm(x, (16,)) * 2 - x.mean(),
            torch.add(x, x.t().t(), alpha=0.5), x.t() @ x, torch.cat([x, x * 3], 0).amax(1)]


class _QAHead(torch.nn.Module):
    """A question-answering head's shape of graph: a projection split into start and end logits, views at
    storage offsets 0 and 1 (a loaded graph's nodes do not keep storage offsets: the case that named the
    same graph differently in the process that saved it and in the next), and a rotary-style half slice."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.qa = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        h = torch.cat([-h[..., 8:], h[..., :8]], -1) + h  # rotate_half
        start, end = self.qa(h).split(1, dim=-1)
        return start.squeeze(-1).logsumexp(-1).sum() + end.squeeze(-1).square().mean()


class _ScalarConst(torch.nn.Module):
    """A tensor made in forward (GroundingDino's text-length constant's shape of graph): the graph holds it as
    a constant (get_attr), on tpu as Dynamo made it and on CPU as the graph cache gives it back."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.where(h > 0, h, torch.tensor(6.0, device=x.device)).square().mean()


class _Strided(torch.nn.Module):
    """as_strided through views (Longformer's chunking's shape of graph, test_compile_cache's OFFSET_SCRIPT):
    the lowering reads the storage of `h`, two views and three storage offsets away."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.w
        y = h[:, 2:].as_strided((3, 2), (8, 1), 3)  # elements 3.. of h's storage, through a slice
        z = h[:, 5:].as_strided((4, 3), (8, 1), 0)  # before the slice's own first element
        return y.sum() + (y * y).sum() + (z * z).sum()


def _offset_graphs() -> list[float]:
    """Two graphs alike but for the storage offset of the input their as_strided reads (a view of a
    40-element buffer at offsets 2 and 0: absolute offset 5 is the view's element 3, then its element 5),
    compiled by graph_compiler and run on the same tpu values; the largest difference of each from CPU."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hf_tpu import graph_compiler

    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x.as_strided((3, 4), (8, 1), 5) * 2,)  # an output tuple, as compile_graph's callers give

    buf = torch.randn(40, generator=torch.Generator().manual_seed(2))
    errs = []
    for off in (2, 0):
        view = buf[off:off + 32]
        gm = make_fx(f, tracing_mode="fake")(view)
        assert next(iter(gm.graph.nodes)).meta["val"].storage_offset() == off  # the case is exercised
        out = graph_compiler.compile_graph(gm, [view.to("tpu")])([view.to("tpu")])
        errs.append(float((out[0].cpu() - f(view)[0]).abs().max()))
    return errs


def strided_main() -> None:
    """CHILD_KIND=strided: _Strided compiled through the graph cache (forward and backward), then
    _offset_graphs; prints graph programs traced, the executable cache's and graph cache's stats, the largest
    difference from CPU of each, and a digest of _Strided's tpu results."""
    from hf_tpu import counters

    hf_tpu.set_matmul_precision("highest")
    torch.manual_seed(0)
    model = _Strided()
    x = torch.randn(4, 8)
    res = {}
    for dev in ("cpu", "tpu"):
        m = __import__("copy").deepcopy(model).to(dev)
        loss = (torch.compile(m, backend="tpu") if dev == "tpu" else m)(x.to(dev))
        loss.backward()
        res[dev] = [loss.detach().cpu().reshape(1), m.w.grad.cpu().reshape(-1)]
    err = max(float((a - b).abs().max()) for a, b in zip(res["tpu"], res["cpu"], strict=True))
    bits = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in res["tpu"])).hexdigest()
    module_traces = counters.count("graph_traces")
    offset_errs = _offset_graphs()
    print(json.dumps({"traces": module_traces, "offset_traces": counters.count("graph_traces") - module_traces,
                      "stats": executable_cache.stats(), "graph_cache": hf_tpu.compile_cache.stats(), "err": err,
                      "offset_errs": offset_errs, "bits": bits}))


def graph_main() -> None:
    """CHILD_KIND=graph: _QAHead (CHILD_MODEL=const: _ScalarConst) compiled with torch.compile(backend="tpu") through the graph cache, one
    training step (forward and backward graphs); prints graph programs traced (counters' graph_traces) and
    got (compilations: traced or loaded),
    the executable cache's stats, the graph cache's, the largest difference from CPU and a digest of the tpu
    results' bits."""
    from hf_tpu import counters

    hf_tpu.set_matmul_precision("highest")
    torch.manual_seed(0)
    model = _ScalarConst() if os.environ.get("CHILD_MODEL") == "const" else _QAHead()
    x = torch.randn(4, 8, 16)
    res = {}
    for dev in ("cpu", "tpu"):
        m = __import__("copy").deepcopy(model).to(dev)
        f = torch.compile(m, backend="tpu") if dev == "tpu" else m
        loss = f(x.to(dev))
        loss.backward()
        res[dev] = [loss.detach().cpu().reshape(1)] + [p.grad.cpu().reshape(-1) for p in m.parameters()]
    err = max(float((a - b).abs().max()) for a, b in zip(res["tpu"], res["cpu"], strict=True))
    bits = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in res["tpu"])).hexdigest()
    print(json.dumps({"traces": counters.count("graph_traces"), "programs": counters.count("compilations"),
                      "stats": executable_cache.stats(), "graph_cache": hf_tpu.compile_cache.stats(), "err": err,
                      "bits": bits}))


def optim_main() -> None:
    """CHILD_KIND=optim: 3 steps of AdamW(fused=True) on tpu (a learning-rate schedule, parameters of
    repeated shapes: several chunk programs, the parameters donated from the second step on) and the same on
    CPU; prints the step programs traced (optim_lowerings.traces), the executable cache's stats, the largest
    difference from CPU and a digest of the tpu parameters' bits."""
    from hf_tpu import optim_lowerings
    from hf_tpu.precision import cpu_reference

    hf_tpu.set_matmul_precision("highest")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3))
    res, donated = {}, []
    for dev in ("cpu", "tpu"):
        m = __import__("copy").deepcopy(model).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1,
                                **({"fused": True} if dev == "tpu" else {"foreach": True}))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        g = torch.Generator().manual_seed(1)
        for step in range(3):
            with cpu_reference() if dev == "cpu" else __import__("contextlib").nullcontext():
                m(torch.randn(4, 6, generator=g).to(dev)).pow(2).mean().backward()
                if dev == "tpu":
                    from hf_tpu import tensor as T

                    old = T.payload(next(m.parameters())).buf.array
                opt.step()
                if dev == "tpu" and step:
                    donated.append(old.is_deleted())
                sched.step()
                opt.zero_grad()
        res[dev] = [p.detach().cpu().reshape(-1) for p in m.parameters()]
    err = max(float((a - b).abs().max()) for a, b in zip(res["tpu"], res["cpu"], strict=True))
    bits = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in res["tpu"])).hexdigest()
    print(json.dumps({"traces": optim_lowerings.traces, "stats": executable_cache.stats(), "err": err,
                      "bits": bits, "donated": donated}))


def _as_another_commit() -> None:
    """CHILD_SOURCES and CHILD_CHANGE_GELU (module docstring), applied before any program is made."""
    if os.environ.get("CHILD_SOURCES"):
        from hf_tpu import executable_keys

        executable_keys._digest_sources = lambda root: os.environ["CHILD_SOURCES"]
        executable_keys.environment.cache_clear()
    if os.environ.get("CHILD_CHANGE_GELU") == "1":
        from hf_tpu import lowering

        gelu = torch.ops.aten.gelu.default
        before = lowering.find(gelu)
        lowering.find.cache_clear()
        lowering._HAND[gelu] = lambda *a, **k: 2 * before(*a, **k)


def main() -> None:
    hf_tpu.set_matmul_precision(os.environ.get("CHILD_PRECISION", "highest"))
    jax = runtime.jax()
    compiles, loaded = [], []  # XLA compile events (JAX's own cache hits fire one too), JAX's cache hits
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, d, **_: compiles.append(event) if event.endswith("backend_compile_duration") else None)
    jax.monitoring.register_event_listener(
        lambda event, **_: loaded.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    inject = None
    if os.environ.get("CHILD_INJECT") == "1":
        from hf_tpu import hooks

        gelu = torch.ops.aten.gelu.default
        inject = hooks.override_lowerings(lambda op, fn: (lambda *a, **k: 2 * fn(*a, **k)) if op is gelu else None)
        inject.__enter__()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [t.cpu() for t in ops(x.to("tpu"), w.to("tpu"))]
    ref = ops(x, w)
    err = max(float((a - b).abs().max()) for a, b in zip(out, ref, strict=True))
    bits = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in out)).hexdigest()
    print(json.dumps({"traces": op_jit.traces, "compiles": len(compiles) - len(loaded), "stats": executable_cache.stats(),
                      "err": err, "bits": bits,
                      "warnings": [str(w.message) for w in caught if "executable cache" in str(w.message)]}))


if __name__ == "__main__":
    _as_another_commit()
    {"graph": graph_main, "optim": optim_main, "strided": strided_main}.get(os.environ.get("CHILD_KIND", ""), main)()
