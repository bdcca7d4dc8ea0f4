"""The device under test, behind one small interface.

`tpu` (the real target) is served by hf_tpu (or torch_tpu); `cpu` runs the "backend" runs on CPU through
Dynamo's `eager` backend (or a checking stand-in), which lets the harness be tested without the device: with
it, the baseline and backend runs are the same computation, so every difference is the harness's own.
"""

from __future__ import annotations

import contextlib
import sys

BACKEND_PHASE = False  # True while the runner executes a backend (not baseline/reference) run


@contextlib.contextmanager
def backend_phase():
    global BACKEND_PHASE
    old, BACKEND_PHASE = BACKEND_PHASE, True
    try:
        yield
    finally:
        BACKEND_PHASE = old


def on_backend(tensor=None) -> bool:
    """For test entries: is this call a backend run (on `tpu`, or the cpu stand-in's backend phase)?"""
    if tensor is not None and getattr(getattr(tensor, "device", None), "type", "cpu") != "cpu":
        return True
    return BACKEND_PHASE


class Device:
    """What the runner needs from a device under test."""

    name = "tpu"
    compile_backend = "tpu"

    def setup(self) -> None:
        import hf_tpu  # noqa: F401  (also autoloaded by `import torch`)

    def check(self) -> None:
        """Raise with a clear message when the device cannot be used at all."""
        import torch

        self.setup()
        torch.ones(2, device=self.name).cpu()

    def warmup(self, compiled: bool = True) -> None:
        """Pay one-time costs (Dynamo's import, JAX start-up) before the worker says it is ready, so that
        they never count against an entry's timeout."""
        import torch

        if compiled:
            import torch._dynamo  # noqa: F401
        torch.manual_seed(0)  # seeds every device: starts JAX under hf_tpu
        (torch.ones(2, device=self.name) + 1).cpu()

    def backend_label(self) -> str:
        try:
            import hf_tpu

            info = hf_tpu.backend_info()
            backend, platform = str(info.get("backend", "hf_tpu")), str(info.get("platform", ""))
            if "jax_version" in info and "jax" not in backend:
                backend += "-jax"  # e.g. hf_tpu-jax-cpu: the JAX stand-in on XLA:CPU
            return backend if not platform or platform in backend else f"{backend}-{platform}"
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({type(exc).__name__})"

    def set_precision(self, precision: str) -> None:
        import torch

        try:
            import hf_tpu

            hf_tpu.set_matmul_precision(precision)
        except (ImportError, AttributeError):
            torch.set_float32_matmul_precision(precision)

    def reset_stats(self) -> None:
        dynamo = sys.modules.get("torch._dynamo")  # never imported by an eager-only sweep
        if dynamo is not None:
            dynamo.utils.counters.clear()
        try:
            import hf_tpu

            hf_tpu.reset_compile_stats()
            hf_tpu.reset_fallback_ops()
        except (ImportError, AttributeError):
            pass

    def stats(self) -> dict:
        """compilations, graph_breaks and fallback_ops since reset_stats()."""
        out = {"compilations": None, "graph_breaks": _dynamo_graph_breaks(), "fallback_ops": {}}
        try:
            import hf_tpu

            cs = hf_tpu.compile_stats()
            out["compilations"] = int(cs.get("compilations", 0))
            out["graph_breaks"] = max(int(cs.get("graph_breaks", 0)), out["graph_breaks"])
            out["fallback_ops"] = dict(hf_tpu.fallback_ops())
        except (ImportError, AttributeError):
            pass
        return out

    def synchronize(self) -> None:
        import torch

        mod = getattr(torch, self.name, None)
        sync = getattr(mod, "synchronize", None)
        if sync is not None:
            sync()


def _dynamo_counters():
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo.utils.counters if dynamo is not None else {"graph_break": {}, "stats": {}}


def _dynamo_graph_breaks() -> int:
    return int(sum(_dynamo_counters()["graph_break"].values()))


class CpuStandIn(Device):
    """The harness's own control: "backend" runs on CPU through Dynamo. Not a device under test."""

    name = "cpu"

    def __init__(self) -> None:
        self.compile_backend = standin_backend

    def setup(self) -> None:
        pass

    def check(self) -> None:
        pass

    def backend_label(self) -> str:
        return "cpu-standin"

    def set_precision(self, precision: str) -> None:
        pass  # CPU float32 stays float32

    def reset_stats(self) -> None:
        counters = _dynamo_counters()
        if hasattr(counters, "clear"):
            counters.clear()

    def stats(self) -> dict:
        c = _dynamo_counters()
        return {
            "compilations": int(c["stats"].get("unique_graphs", 0)),
            "graph_breaks": _dynamo_graph_breaks(),
            "fallback_ops": {},
        }

    def synchronize(self) -> None:
        pass


def standin_backend(gm, example_inputs):
    """Dynamo backend of the cpu stand-in: runs the graph as is, but refuses `torch.cosh`, so that the
    test zoo has an entry whose compilation fails (a missing lowering at compile time)."""
    import torch

    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (torch.cosh, torch.ops.aten.cosh.default):
            exc = NotImplementedError("no lowering for aten::cosh.default (cpu stand-in)")
            exc.op = "aten::cosh.default"  # type: ignore[attr-defined]
            raise exc
    return gm.forward


def get_device(name: str) -> Device:
    if name == "tpu":
        return Device()
    if name == "cpu":
        return CpuStandIn()
    raise ValueError(f"unknown device {name!r} (expected tpu or cpu)")
