"""Module level: record every module call's inputs and output (forward pre-hooks and hooks), then find the
first module, in the order calls finish, whose output diverges between CPU and `tpu` while its inputs agree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.diagnose.ops import TensorDiff, clone_cpu, compare_trees


def named_modules(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """All modules of a model, or of a pipeline's components (named `unet.down_blocks.0...`)."""
    if isinstance(model, torch.nn.Module):
        return list(model.named_modules())
    out: list[tuple[str, torch.nn.Module]] = []
    components = getattr(model, "components", None)
    if isinstance(components, dict):
        for cname, comp in components.items():
            if isinstance(comp, torch.nn.Module):
                out += [(f"{cname}.{n}" if n else cname, m) for n, m in comp.named_modules()]
    return out


@dataclass
class ModuleCall:
    name: str
    cls: str
    index: int  # the how-manieth call of this module (shared modules run several times)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    out: Any = None
    order: int = 0  # position in the order calls finished

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.index)


class ModuleRecorder:
    """CPU copies of each module call's inputs and output, in the order calls finish (children before parents)."""

    def __init__(self, modules: list[tuple[str, torch.nn.Module]], keep_io: bool = True, limit: int = 5000) -> None:
        self.calls: list[ModuleCall] = []
        self.open: dict[str, list[ModuleCall]] = {}
        self.counts: dict[str, int] = {}
        self.handles: list[Any] = []
        self.keep_io = keep_io
        self.limit = limit
        for name, mod in modules:
            self.handles.append(mod.register_forward_pre_hook(self._pre(name, type(mod).__name__), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(name)))

    def _pre(self, name: str, cls: str):
        def hook(mod, args, kwargs):
            i = self.counts.get(name, 0)
            self.counts[name] = i + 1
            keep = self.keep_io and len(self.calls) < self.limit
            call = ModuleCall(name, cls, i, clone_cpu(args) if keep else (), clone_cpu(kwargs) if keep else {})
            self.open.setdefault(name, []).append(call)

        return hook

    def _post(self, name: str):
        def hook(mod, args, output):
            stack = self.open.get(name)
            if not stack:
                return
            call = stack.pop()
            if self.keep_io and len(self.calls) < self.limit:
                call.out = clone_cpu(output)
            call.order = len(self.calls)
            self.calls.append(call)

        return hook

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


@dataclass
class Divergence:
    cpu: ModuleCall
    tpu: ModuleCall
    out_diffs: list[TensorDiff]
    modules_compared: int
    downstream: list[str] = field(default_factory=list)  # earlier-finishing modules that diverged on diverged inputs


def first_divergence(cpu_calls: list[ModuleCall], tpu_calls: list[ModuleCall], fp64_calls: list[ModuleCall] | None,
                     tol) -> Divergence | None:
    """The first module call (in finishing order) whose output diverges while its inputs agree."""
    by_key = {c.key: c for c in tpu_calls}
    ref64 = {c.key: c for c in fp64_calls or []}
    downstream: list[str] = []
    compared = 0
    for c in cpu_calls:
        t = by_key.get(c.key)
        if t is None:
            continue
        compared += 1
        f = ref64.get(c.key)
        out = compare_trees(c.out, t.out, f.out if f else None, tol)
        if all(d.match for d in out):
            continue
        ins = compare_trees((c.args, c.kwargs), (t.args, t.kwargs), (f.args, f.kwargs) if f else None, tol)
        if all(d.match for d in ins):
            return Divergence(c, t, out, compared, downstream)
        downstream.append(c.name)
    return None
