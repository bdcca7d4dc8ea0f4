"""The "tpu" backend in a form `torch._dynamo.aot_compile` can save: AOTAutograd with a serializable compiler
whose output (`TpuOutputCode`) keeps the functional ATen graph, never the JAX lowering of it.

Saving the ATen graph is what keeps a warm cache honest: on load `post_compile` lowers the graph again with
today's lowering table (hf_tpu.graph_compiler.to_jax_function), so a changed lowering shows on a warm night, and
JAX's persistent cache (keyed by the lowered program itself) decides whether XLA compiles again.
PyTorch's protocol for this is `SerializableAOTDispatchCompiler` plus an `OutputCode` subclass with
`prepare_for_serialization` and `post_compile`, under `bundled_autograd_cache` (vLLM's
VllmSerializableFunction does the same for Inductor).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._inductor.output_code import OutputCode
from torch.utils import _pytree as pytree


def _graph_example_inputs(gm: torch.fx.GraphModule) -> list[Any]:
    """What the compiler needs of the example inputs (which are tensors, which are static), read from the
    placeholders' metadata: on load AOTAutograd passes no example inputs."""
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


@dataclasses.dataclass
class TpuOutputCode(OutputCode):
    """One AOTAutograd graph (forward or backward) for the tpu backend. Pickles as the ATen graph (through
    torch.fx's GraphPickler, which keeps the nodes' fake-tensor metadata the lowering reads)."""

    _boxed_call = True  # AOTAutograd calls it with one list of inputs, as graph_compiler.compile_graph's program

    gm: torch.fx.GraphModule | None = None
    graph_bytes: bytes | None = None
    backward: bool = False  # a backward graph: compiled in pieces (backward_pieces.py)
    inference: bool = False  # compiled for inference: its weights may be packed (packed_weights.py)
    _run: Callable[[list[Any]], Any] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        # on the instance, not only the class: AOTAutograd wraps the backward in torch._dynamo.disable, whose
        # functools.wraps copies the instance's __dict__ only; without it the backward was called unboxed, its
        # caller's list holding every saved tensor until it returned (backward_pieces frees them as it goes)
        self._boxed_call = True

    def _ensure(self) -> Callable[[list[Any]], Any]:
        if self._run is None:
            if self.gm is None:
                self.gm = _load_graph(self.graph_bytes)
            self._run = self.compile(_graph_example_inputs(self.gm))
        return self._run

    def compile(self, example_inputs: list[Any]) -> Callable[[list[Any]], Any]:
        from hf_tpu import backward_pieces, graph_compiler

        if self.backward:
            return backward_pieces.compile_backward(self.gm, example_inputs)
        return graph_compiler.compile_graph(self.gm, example_inputs, inference=self.inference)

    def __call__(self, *inputs: Any) -> Any:
        # boxed (one list) from AOTAutograd's wrappers; unboxed through SerializableCompiledFunction's
        if len(inputs) == 1 and isinstance(inputs[0], list):
            return self._ensure()(inputs[0])
        return self._ensure()(list(inputs))

    def prepare_for_serialization(self) -> None:
        # called on a shallow copy (BundledOutputCodeLoadable.pre_save): the live graph stays usable
        if self.gm is not None and any(n.op == "call_function" and n.target is torch.ops.higher_order.with_effects
                                       for n in self.gm.graph.nodes):
            # effect tokens (linalg's _linalg_check_errors): such a saved inference graph, loaded in another
            # process, ran without its token input (StopIteration in the lowered graph: compiled linalg.inv on
            # complex64); it stays usable in this process, unsaved (cached._compile: "compiled but not saved")
            raise RuntimeError("a graph with effect tokens (with_effects) is not saved")
        if self.graph_bytes is None:
            self.graph_bytes = _dump_graph(self.gm)
        self.gm = None
        self._run = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        self._ensure()  # lowered by today's backend

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


def _dump_graph(gm: torch.fx.GraphModule) -> bytes:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx._graph_pickler import GraphPickler, Options

    # A tpu tensor's data lives in JAX, which torch's storage pickling cannot see: constants the graph
    # reads (get_attr) are pickled as CPU tensors (the compiler accepts either) and put back afterwards.
    swapped: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    with unset_fake_temporarily():
        for mod in gm.modules():
            for table in (mod._buffers, mod._parameters, mod.__dict__):
                for name, value in list(table.items()):
                    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
                        swapped.append((table, name, value))
                        cpu = value.detach().cpu()
                        table[name] = (torch.nn.Parameter(cpu, value.requires_grad)
                                       if isinstance(value, torch.nn.Parameter) else cpu)
    # Only the metadata the lowering reads is kept, fake tensors as plain records: rebuilding ~1,200 fake
    # tensors took most of a GPT-2 graph's load time (0.9 s). Their storage offsets and which values share a
    # storage are kept too: as_strided's lowering reads both (graph_compiler._as_strided_on_storage).
    storages: dict[Any, int] = {}
    metas = [(n, n.meta) for n in gm.graph.nodes]
    for n, meta in metas:
        n.meta = {k: (pytree.tree_map(lambda v: _TensorRecord.of(v, storages), meta[k]) if k == "val" else meta[k])
                  for k in _KEPT_META if k in meta}
    try:
        return GraphPickler.dumps(gm, Options(ops_filter=None))
    finally:
        for table, name, value in swapped:
            table[name] = value
        for n, meta in metas:
            n.meta = meta


def _load_graph(data: bytes | None) -> torch.fx.GraphModule:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if data is None:
        raise RuntimeError("hf_tpu compile cache: a saved graph has no content")
    gm = GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
    storages: dict[int, Any] = {}  # the record's storage number -> one meta storage, shared as in the trace
    for n in gm.graph.nodes:
        if "val" in n.meta:
            n.meta["val"] = pytree.tree_map(lambda v: v.meta(storages) if isinstance(v, _TensorRecord) else v,
                                            n.meta["val"])
    return gm  # not recompiled: the lowering walks the graph, never runs gm.forward


_KEPT_META = ("val", "stack_trace")


@dataclasses.dataclass(frozen=True)
class _TensorRecord:
    """A node's tensor metadata as saved; loaded as a meta tensor (what the lowering reads: dtype, shape,
    strides, and for as_strided the storage offset and the storage shared with other values). Without the
    last two a loaded graph read the wrong elements: `h[:, 2:].as_strided(size, stride, 3)` (an offset into
    h's storage) was lowered against a slice starting at offset 0 with a storage of its own, and computed
    another loss in the next process (or raised setStorage ... out of bounds), where the saving one was right."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    storage_offset: int
    storage: int  # values with the same number share a storage (numbered in graph order)
    storage_bytes: int

    @classmethod
    def of(cls, v: Any, storages: dict[Any, int]) -> Any:
        """`v`'s record if it is a tensor; `storages` numbers the storages met so far (one dict per graph)."""
        if not isinstance(v, torch.Tensor):
            return v
        from torch.multiprocessing.reductions import StorageWeakRef

        storage = v.untyped_storage()
        number = storages.setdefault(StorageWeakRef(storage), len(storages))
        return cls(tuple(int(d) for d in v.shape), tuple(int(d) for d in v.stride()), v.dtype,
                   int(v.storage_offset()), number, int(storage.nbytes()))

    def meta(self, storages: dict[int, Any]) -> torch.Tensor:
        """The meta tensor, on the storage numbered `self.storage` in `storages` (made here when new)."""
        need = self.storage_offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True)) + 1
        nbytes = max(self.storage_bytes, need * self.dtype.itemsize if math.prod(self.shape) else 0)
        storage = storages.get(self.storage)
        if storage is None or storage.nbytes() < nbytes:
            # a value seen first through a smaller view: the storage is made as large as the largest view needs
            if storage is not None:
                storage.resize_(nbytes)
            else:
                storage = storages[self.storage] = torch.empty(nbytes, dtype=torch.uint8,
                                                               device="meta").untyped_storage()
        return torch.empty(0, dtype=self.dtype, device="meta").set_(storage, self.storage_offset, self.shape,
                                                                     self.stride)


_seeded_records: list[list[str]] = []  # open recording_seeded_ops blocks, innermost last


@contextlib.contextmanager
def recording_seeded_ops() -> Iterator[list[str]]:
    """The names of the random ops (tagged nondeterministic_seeded) in the ATen graphs compiled within the
    block: a graph cached under a draws-only mode must draw nothing itself (cached.DRAWS_ONLY)."""
    seen: list[str] = []
    _seeded_records.append(seen)
    try:
        yield seen
    finally:
        _seeded_records.remove(seen)


def seeded_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's random ops: those whose result depends on a generator's state."""
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags]


def _make_output_code(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backward: bool = False,
                      inference: bool = False) -> TpuOutputCode:
    if _seeded_records:
        _seeded_records[-1].extend(seeded_ops(gm))
    code = TpuOutputCode(gm=gm, backward=backward, inference=inference)
    code._run = code.compile(list(example_inputs))
    return code


def serializable_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The tpu backend with a saveable output (for `aot_compile_fullgraph`); same lowering as
    hf_tpu.compile.tpu_backend."""
    from hf_tpu import bounded_frames, counters

    bounded_frames.static_shapes_by_default()
    counters.bump("graphs")
    start = time.perf_counter()
    # AOTAutograd's cache is on by default in PyTorch, in Inductor's directory, keyed without the
    # decompositions a backend applies: left so, it served graphs decomposed under another lowering table
    # (another hf-tpu, or hooks.override_lowerings' fault injection) and they failed on ops only that table
    # lacked. Here, as on the ordinary path, it is hf_tpu's salted directory (aot_cache.py) or off.
    from hf_tpu.compile_cache import aot_cache

    scope = aot_cache.active() if aot_cache.enabled() else torch._functorch.config.patch(enable_autograd_cache=False)
    try:
        with scope:
            return serializable_aot_autograd(gm, example_inputs, **kwargs)
    finally:
        counters.bump_time("aot_s", time.perf_counter() - start)


def serializable_aot_autograd(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """AOTAutograd with hf_tpu's decompositions and a saveable compiler output (TpuOutputCode): what the
    graph cache saves whole, and what AOTAutograd's own cache saves per subgraph (aot_cache.py)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    from hf_tpu import compile_options, graph_compiler, unsafe_view_fix

    # two instances: AOTAutograd wraps the backward compiler's function in place
    fw = SerializableAOTDispatchCompiler(TpuOutputCode, _make_output_code)
    bw = SerializableAOTDispatchCompiler(TpuOutputCode, functools.partial(_make_output_code, backward=True))
    inference = SerializableAOTDispatchCompiler(TpuOutputCode, functools.partial(_make_output_code, inference=True))
    with torch._functorch.config.patch(bundled_autograd_cache=True), unsafe_view_fix.tracing():
        return aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inference,
                            decompositions=graph_compiler.decompositions(),
                            partition_fn=compile_options.partition_fn())(
            gm, example_inputs, **kwargs)


def guard_filter(entries: Sequence[Any]) -> list[bool]:
    """Keep the guards that can be saved: tensor shapes, dtypes, devices, strides and requires_grad, constants,
    grad mode. Identity guards (ID_MATCH on the model object, functions, classes, modules) and globals cannot
    be saved; what they protected is in the cache key instead (the function's code, the model's class and
    config, the versions), and the code Dynamo inlined is checked against its source on load."""
    from torch._dynamo.guards import CheckFunctionManager

    bad = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (e.is_global or e.guard_type in bad or bad.intersection(e.derived_guard_types or ()))
            for e in entries]


def aot_compile(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Dynamo (full graph) + AOTAutograd for `fn(*args, **kwargs)`, as a saveable AOTCompiledFunction.
    Raises on a graph break or anything that cannot be saved."""
    from torch._dynamo.aot_compile import aot_compile_fullgraph
    from torch._dynamo.hooks import Hooks

    with torch._dynamo.config.patch(ignore_logging_functions=_quiet_logging_functions()):
        return aot_compile_fullgraph(fn, (args, kwargs), hooks=Hooks(guard_filter_fn=guard_filter),
                                     backend=serializable_backend, dynamic=False)


# Logger methods below ERROR level, Transformers' own (warning_once, ...) included where it added them
_QUIET_LOGGER_METHODS = ("debug", "info", "warning", "warn", "warning_once", "info_once", "warning_advice")


def _quiet_logging_functions() -> set[Any]:
    """Dynamo's ignore_logging_functions for the full-graph capture, plus logging.Logger's methods below ERROR:
    such a call becomes a no-op of the saved graph, as torch.export makes every logging call. Without it the
    capture failed on the first one (Dynamo breaks the graph there) and the call took the ordinary path, in
    every process: Transformers' loss_function says `logger.warning_once("loss_type=None ...")` for every model
    whose class name maps to no loss type (GPT2LMHeadModel with labels), so GPT-2 124M's compiled training step
    ran Dynamo and AOTAutograd again in each new process (58-113 s). The cost: such advisory messages are not
    printed by a compiled call the cache serves; errors and critical messages still break the graph."""
    import logging

    return set(torch._dynamo.config.ignore_logging_functions) | {
        getattr(logging.Logger, name) for name in _QUIET_LOGGER_METHODS if hasattr(logging.Logger, name)}
