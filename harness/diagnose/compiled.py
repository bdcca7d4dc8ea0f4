"""Compiled mode: watch the `tpu` backend build its programs (hf_tpu.hooks.observe_graphs wraps the graph compiler while the
model runs), keep each ATen graph and its real inputs, and on failure or divergence go through the graph node
by node: the first node without a lowering, whose lowering fails to trace, or whose result differs from
PyTorch's CPU kernel on the same inputs. The module comes from the node's `nn_module_stack`."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.diagnose.ops import OpCall, TensorDiff, clone_cpu, compare_trees, flat_tensors, not_comparable, op_name
from harness.sweep import emulate


@dataclass
class Graph:
    gm: torch.fx.GraphModule
    inputs: list | None = None  # CPU copies of the first call's inputs
    error: BaseException | None = None


@dataclass
class NodeFinding:
    node: str
    op: str
    module: str
    module_class: str
    call: OpCall  # the op with CPU inputs (real values when known, else meta-built zeros)
    why: str  # missing_lowering | trace_error | differs
    detail: str = ""
    diffs: list[TensorDiff] = field(default_factory=list)


_FRAME_RE = re.compile(r"^L\['[^']*'\]\.?")
_MODULES_RE = re.compile(r"\._modules\['([^']*)'\]")


def module_of(node: torch.fx.Node) -> tuple[str, str]:
    """(module path, class name) of the innermost module a graph node was traced in."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    path = _MODULES_RE.sub(r".\1", str(path))
    path = _FRAME_RE.sub("", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path).strip(".")
    path = re.sub(r"^(model|self)\.", "", path)
    return path, getattr(cls, "__name__", str(cls))


@contextlib.contextmanager
def watch() -> Any:
    """Wrap the tpu backend's graph compiler while the block runs; yields the list of Graphs it saw."""
    from hf_tpu import hooks

    graphs: list[Graph] = []

    def compiler(real, gm, example_inputs):
        g = Graph(gm)
        graphs.append(g)
        try:
            fn = real(gm, example_inputs)
        except Exception as exc:
            g.error = exc
            raise

        def call(args):
            if g.inputs is None:
                g.inputs = [clone_cpu(a) for a in args]
            try:
                return fn(args)
            except Exception as exc:
                g.error = exc
                raise

        call._boxed_call = True  # type: ignore[attr-defined]
        return call

    with hooks.observe_graphs(compiler):
        yield graphs


def _meta_tensor(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.zeros(v.shape, dtype=v.dtype) if v.dtype != torch.bool else torch.zeros(v.shape, dtype=torch.bool)
    return v


def _cpu_env_inputs(g: Graph) -> list:
    if g.inputs is not None:
        return list(g.inputs)
    return [_meta_tensor(n.meta.get("val")) for n in g.gm.graph.nodes if n.op == "placeholder"]


def locate_in_graphs(graphs: list[Graph], precision: str, tol, want_op: str = "", compare_values: bool = False) -> NodeFinding | None:
    """Walk each graph on CPU (PyTorch kernels) and, per node, run hf_tpu's lowering on the same inputs."""
    for g in graphs:
        try:
            f = _walk(g, precision, tol, want_op, compare_values)
        except Exception:  # noqa: BLE001  (a graph the walker cannot replay on CPU: the next one may tell)
            continue
        if f is not None:
            return f
    return None


def _walk(g: Graph, precision: str, tol, want_op: str, compare_values: bool) -> NodeFinding | None:
    from hf_tpu import lowering
    from hf_tpu import precision as hp

    env: dict[torch.fx.Node, Any] = {}
    it = iter(_cpu_env_inputs(g))
    for n in g.gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it, None)
            continue
        if n.op == "get_attr":
            env[n] = clone_cpu(getattr(g.gm, n.target))  # lifted constants may live on tpu
            continue
        if n.op == "output":
            return None
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
        args, kwargs = _on_cpu(args), _on_cpu(kwargs)  # factories name device=tpu: their CPU twin runs on CPU
        if n.op != "call_function":
            continue
        if not isinstance(n.target, torch._ops.OpOverload):
            env[n] = n.target(*args, **kwargs)
            continue
        name = op_name(n.target)
        module, cls = module_of(n)
        call = OpCall(0, n.target, clone_cpu(args), clone_cpu(kwargs), module=module)
        try:
            with emulate.matmul_precision(precision):  # the sweep's oracle: float32, tpu rounding applied
                cpu_out = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001  (meta-built zeros can be invalid inputs: no CPU result)
            val = n.meta.get("val")
            cpu_out = _meta_tensor(val) if isinstance(val, torch.Tensor) else None
        env[n] = cpu_out
        fn = lowering.find(n.target)
        if fn is None:
            # a decomposition's node: the backend's error names the user's ATen op (meta["original_aten"])
            orig = n.meta.get("original_aten")
            orig_name = op_name(orig) if isinstance(orig, torch._ops.OpOverload) else ""
            orig_name = "" if orig_name == name else orig_name
            if not want_op or want_op in (name, orig_name):
                found = orig_name or name
                return NodeFinding(n.name, found, module, cls, call, "missing_lowering",
                                   f"no JAX lowering for {found} in a compiled graph"
                                   + (f" (nor for {name}, its decomposition's op)" if orig_name else ""))
            continue
        try:
            jargs, jkwargs = torch.fx.node.map_arg((args, kwargs), lambda a: a)
            jargs, jkwargs = _to_jax((jargs, jkwargs))
            with hp.forced(precision):
                res = fn(*jargs, **jkwargs)
        except Exception as exc:  # noqa: BLE001
            if not want_op or want_op == name or not compare_values:
                return NodeFinding(n.name, name, module, cls, call, "trace_error",
                                   f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            continue
        # an `empty_like` the graph then fills differs by its garbage (Aimv2's backward graph was diagnosed so)
        if compare_values and cpu_out is not None and flat_tensors(cpu_out) and not not_comparable(n.target):
            out_cpu = _from_jax(res, cpu_out)
            diffs = compare_trees(cpu_out, out_cpu, None, tol) if out_cpu is not None else []
            if diffs and not all(d.match for d in diffs):
                call.out = clone_cpu(cpu_out)
                return NodeFinding(n.name, name, module, cls, call, "differs", diffs[0].reason, diffs)
    return None


def _on_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.device) and obj.type != "cpu":
        return torch.device("cpu")
    if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def _to_jax(obj: Any) -> Any:
    from hf_tpu import host_copy

    if isinstance(obj, torch.Tensor):
        return host_copy.from_cpu(obj)
    if isinstance(obj, dict):
        return {k: _to_jax(v) for k, v in obj.items()}
    if isinstance(obj, list):
        # a plain list, not the FX node's immutable_list: some lowerings edit their list arguments in place
        # (torchax's convolution its padding), which immutable_list refuses with a TypeError
        return [_to_jax(v) for v in obj]
    if isinstance(obj, tuple):
        return type(obj)(_to_jax(v) for v in obj)
    return obj


def _from_jax(res: Any, like: Any) -> Any:
    from hf_tpu import host_copy

    if isinstance(like, torch.Tensor):
        if not hasattr(res, "shape"):
            return None
        out = host_copy.to_cpu(res, like.dtype)
        if tuple(out.shape) != tuple(like.shape) and out.numel() == like.numel():
            out = out.reshape(like.shape)
        return out
    if isinstance(like, (list, tuple)) and isinstance(res, (list, tuple)) and len(res) == len(like):
        return type(like)(_from_jax(r, x) for r, x in zip(res, like, strict=True))
    return None


_CONTEXT_RE = re.compile(r"Developer debug context:\s*(.+)")
_EXPLAIN_RE = re.compile(r"Explanation:\s*(.+)")


def short_break(reason: str) -> str:
    """One line for a Dynamo graph-break reason: its title and the op or detail from the debug context."""
    lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
    if not lines:
        return ""
    title = lines[0]
    ctx = _CONTEXT_RE.search(str(reason))
    detail = ctx.group(1).strip() if ctx else ""
    if not detail or len(detail) > 80:
        exp = _EXPLAIN_RE.search(str(reason))
        detail = exp.group(1).strip() if exp else detail
    detail = re.sub(r" at 0x[0-9a-f]+", "", detail)[:120]
    return f"{title}: {detail}" if detail else title


def graph_break_reasons() -> list[str]:
    """Dynamo's graph-break reasons of the last run (one line each, with counts), in the order first seen."""
    try:
        from torch._dynamo.utils import counters

        out: dict[str, int] = {}
        for k, v in counters["graph_break"].items():
            s = short_break(k)
            out[s] = out.get(s, 0) + int(v)
        return [f"{k} (x{v})" if v > 1 else k for k, v in out.items()]
    except Exception:  # noqa: BLE001
        return []
