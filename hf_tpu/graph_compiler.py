"""A functional ATen graph (what AOTAutograd hands a backend) -> one jitted XLA program through JAX: each node
lowered by the eager lowering table (lowering.py, backward_lowerings.py) or by a "graph" rule (op_registry), the ops
PyTorch's decompositions do not reach decomposed first. compile.py's `tpu` backend and the graph cache's
serializable backend (compile_cache/serializable.py) both compile through `compile_graph`."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import (backward_lowerings, counters, dtypes, float8, fused, lowering, op_registry, precision, rng,
                    xla_options)
from hf_tpu import decomposed, errors, graph_bool_index, graph_ident, graph_outputs, graph_parity, host_copy
from hf_tpu import meta_kernels
from hf_tpu import tensor as T
from hf_tpu.op_registry import lowers
from hf_tpu.torchax_compat import load_op_table

COMPILED_GRAPH = "torch.compile graph"  # names a compiled graph's call in fused.stats()['materialised_by']


# ------------------------------------------------------------------------------------ graph -> JAX
# Ops that lower differently inside a compiled graph than in eager. torch._assert_async (Gemma4 vision checks
# its patch counts): an XLA program cannot raise on a value it computes, so the check is dropped from the
# program, as XLA backends do; eager still runs it.
@lowers(torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg, torch.ops.aten._assert_scalar.default,
        torch.ops.aten.sym_constrain_range.default, torch.ops.aten.sym_constrain_range_for_size.default, kind="graph")
def _no_check(*_: Any, **__: Any) -> None:
    return None


# torch.compile's full-graph capture (the graph cache's aot_compile path) keeps `.item()` in the graph when the
# value only feeds runtime asserts (Flaubert: `assert lengths.max().item() <= slen`): the value stays a 0-d
# array inside the program, the comparisons on it are traced, and the assert on it is dropped as above.
lowers(torch.ops.aten._local_scalar_dense.default, kind="graph")(lambda x: x)


@lowers(torch.ops.aten.view_as_complex.default, kind="graph")
def _view_as_complex(x: Any) -> Any:
    """As eager's (view_ops.view_as_complex): float16 pairs are declared unsupported (docs/device.md), where
    torchax's lowering raised a bare TypeError from jax.lax.complex."""
    import jax.numpy as jnp

    if x.dtype == jnp.float16:
        raise errors.Unsupported(torch.ops.aten.view_as_complex.default, "float16 pairs view as complex32 "
                                 "(torch.chalf), a dtype XLA does not have",
                                 "Convert to float32 first (x.float()) for a complex64 view.")
    return x[..., 0] + 1j * x[..., 1]
_GRAPH = op_registry.table("graph")
_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def _custom_op_body(target: Any) -> Callable[..., Any] | None:
    """A torch.library custom op with one Python body for every device (PyTorch's own, such as
    F.linear_cross_entropy's chunked torch_nn ops, or a user's): Dynamo keeps it whole in the graph, and no
    lowering knows it; eager runs the body on tpu tensors op by op, so here the body is traced into the
    program the same way (its sub-ops through their lowerings: decomposed.as_lowering). Per-device bodies
    only (a CPU body may call numpy) or a mutable schema: None, and the op has no lowering."""
    opdef = graph_ident.custom_opdef(target)
    if opdef is None or target._schema.is_mutable:
        return None
    body = opdef._backend_fns.get(None)
    return None if body is None else decomposed.as_lowering(target, body)


def _lower_node_target(target: Any, node: torch.fx.Node | None = None) -> Callable[..., Any]:
    fn = _GRAPH.get(target) or backward_lowerings.find(target) or lowering.find(target) or _custom_op_body(target)
    if fn is None:
        # A node made by a decomposition (decompositions() decomposes only ops we cannot lower) carries the
        # ATen op of the user's program in meta["original_aten"]: name that one, the op to write a lowering
        # for, and the decomposition's op that had none either.
        original = node.meta.get("original_aten") if node is not None else None
        if isinstance(original, torch._ops.OpOverload) and errors.op_name(original) != errors.op_name(target):
            raise lowering.NoLowering(original, f" (in a compiled graph; its decomposition's {errors.op_name(target)} has none "
                                                "either)")
        raise lowering.NoLowering(target, " (in a compiled graph)")
    return fn


def _mutable(obj: Any) -> Any:
    """FX keeps a node's list/dict arguments as immutable_list/immutable_dict; lowerings written for eager
    calls may change their arguments in place (torchax's convolution does `padding *= n`), so each call
    gets plain, fresh containers."""
    if isinstance(obj, list):
        return [_mutable(x) for x in obj]
    if type(obj) is tuple:
        return tuple(_mutable(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _mutable(v) for k, v in obj.items()}
    return obj


def _as_strided_on_storage(fn: Callable[..., Any], val: Any, input_offset: int) -> Callable[..., Any]:
    """as_strided indexes its input's storage, laid out by the input's traced strides and storage offset; a graph
    value is a logical (row-major) array. Longformer's chunking takes overlapping windows of a permuted tensor:
    read as if row-major, the windows held the wrong elements. The input is put back where its strides place it
    in a flat storage first (a scatter), then the strided read is made from there. `val` is the storage's
    value (graph_ident.storage_source); `input_offset` the as_strided input's own storage offset, PyTorch's
    default for the read (`a[1:].as_strided(size, stride)` starts at a[1:]'s first element, not a's)."""
    import numpy as np

    shape, stride, off = tuple(val.shape), tuple(val.stride()), int(val.storage_offset())
    contiguous = all(st == c for st, c, n in zip(stride, torch._prims_common.make_contiguous_strides_for(shape),
                                                 shape, strict=True) if n > 1)
    if (contiguous and off == 0 and input_offset == 0) or math.prod(shape) == 0:
        return fn
    index = np.full(shape, off, dtype=np.int64)
    for d, (n, st) in enumerate(zip(shape, stride, strict=True)):
        index = index + (np.arange(n) * st).reshape((n,) + (1,) * (len(shape) - d - 1))
    base, span = int(index.min()), int(index.max()) + 1
    flat = index.reshape(-1) - base

    def on_storage(x: Any, size: Any, strides: Any, storage_offset: int | None = None) -> Any:
        jnp = T._jnp()
        storage = jnp.zeros((span - base,), x.dtype).at[flat].set(x.reshape(-1))
        # the offset is absolute in the storage (default: the input's own); the flat storage starts at `base`
        start = (input_offset if storage_offset is None else int(storage_offset)) - base
        return fn(storage, size, strides, start)

    return on_storage


def _integral_promotion(n: torch.fx.Node) -> Any:
    """The JAX dtype a node's array inputs are cast to first, or None: eager's rule (op_dtypes.
    integral_promotion) on the graph's metadata. Integer or bool inputs of an op whose result is floating
    (special_bessel_j1 on bool) reach the lowering as they are in a graph, and JAX's float functions reject
    them ("sign does not accept dtype bool")."""
    vals = [a.meta.get("val") for a in pytree.tree_leaves((n.args, n.kwargs)) if isinstance(a, torch.fx.Node)]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    if not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors):
        return None
    out = n.meta.get("val")
    out = out[0] if isinstance(out, (tuple, list)) and out else out
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    return dtypes.to_jax(out.dtype)


def _promoted(fn: Callable[..., Any], want: Any) -> Callable[..., Any]:
    def cast(x: Any) -> Any:
        return x.astype(want) if hasattr(x, "astype") and hasattr(x, "shape") else x

    return lambda *a, **k: fn(*pytree.tree_map(cast, a), **pytree.tree_map(cast, k))


def to_jax_function(gm: torch.fx.GraphModule,
                    wrap_node: Callable[[torch.fx.Node, Callable[..., Any]], Callable[..., Any]] | None = None,
                    return_infos: bool = True) -> Callable[..., Any]:
    """A function over JAX arrays that computes `gm` (functional ATen) with our lowerings; `wrap_node`
    may wrap a node's lowering (bounded.py masks padded positions that way). With linalg error checks in the
    graph (_is_error_check) and `return_infos`, it returns (outputs, the checks' infos) and names the checks in
    its `error_checks`; without, the checks are skipped (padded graphs: their outputs are unpadded as a whole)."""
    graph_parity.refuse_dynamos_addcdiv(gm)
    nodes = list(gm.graph.nodes)
    fns: dict[torch.fx.Node, Callable[..., Any]] = {}
    strided_from: dict[torch.fx.Node, torch.fx.Node] = {}  # as_strided node -> the view chain's base node
    for n in nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            try:
                fns[n] = _lower_node_target(n.target, n)  # fail at compile time, naming the op
            except lowering.NoLowering:
                if _declared_dtype(n) is None:
                    raise
                fns[n] = _refuse_dtype(_declared_dtype(n))
            fns[n] = graph_bool_index.static_boolean_index(n, fns[n])  # x[mask] at the graph's recorded size
            promote = _integral_promotion(n)
            if promote is not None:
                fns[n] = _promoted(fns[n], promote)
            base = graph_ident.storage_source(n)  # as_strided: the storage it reads (also in the graph's name)
            if base is not None:
                strided_from[n] = base
                fns[n] = _as_strided_on_storage(fns[n], base.meta["val"], int(n.args[0].meta["val"].storage_offset()))
            if wrap_node is not None:
                fns[n] = wrap_node(n, fns[n])

    checks = [n for n in nodes if _is_error_check(n)]
    returned = checks if return_infos else []
    # the graph's constants as JAX arrays made now, not while the program is traced: JAX inlines a scalar array
    # made inside the trace where it is used but makes one made before a constant at the program's top, and a
    # graph Dynamo made holds its constants on tpu (arrays made already) where one loaded from the graph cache
    # holds them on CPU (serializable._dump_graph): the same graph lowered to two modules (GroundingDino's
    # `_tensor_constant0`), so another JAX cache key and another lowered key (executable_keys.py)
    # (outside any fake mode: AOTAutograd calls the backend with its FakeTensorMode active, and the constants are
    # real tensors)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    consts = {}
    with unset_fake_temporarily():
        for n in nodes:
            if n.op == "get_attr":
                attr = getattr(gm, n.target)
                consts[n] = host_copy.from_cpu(attr) if attr.device.type == "cpu" else T.value(attr)

    def run(*inputs: Any) -> Any:
        jnp = T._jnp()
        env: dict[torch.fx.Node, Any] = {}
        infos: list[Any] = []
        it = iter(inputs)
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "get_attr":
                env[n] = consts[n]
            elif n.op == "call_function":
                args, kwargs = _mutable(torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a]))
                if n in strided_from:
                    args = (env[strided_from[n]], *args[1:])
                if n in fns:
                    res = fns[n](*args, **kwargs)
                    val = n.meta.get("val")
                    # lowerings may promote differently from PyTorch: keep PyTorch's dtype
                    if isinstance(val, torch.Tensor) and hasattr(res, "dtype"):
                        want = dtypes.to_jax(val.dtype)
                        if res.dtype != want:
                            res = float8.cast(res, want)
                        # (not with symbolic sizes: int() of one is the traced hint, not the padded bound)
                        if not any(isinstance(d, torch.SymInt) for d in val.shape) and \
                                tuple(res.shape) != tuple(val.shape) and res.size == val.numel():
                            res = jnp.reshape(res, tuple(val.shape))
                    env[n] = res
                elif n in checks:  # the token passes through; the info is checked after the program ran
                    infos.append(args[2])
                    env[n] = (args[0],)
                else:  # operator.getitem, SymInt arithmetic
                    env[n] = n.target(*args, **kwargs)
            elif n.op == "output":
                out = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
                return (out, infos) if returned else out
        raise AssertionError("graph without output")

    run.error_checks = [(n.args[3], bool(n.kwargs.get("is_matrix", True))) for n in returned]  # type: ignore[attr-defined]
    return run


def _declared_dtype(n: torch.fx.Node) -> torch.dtype | None:
    """A dtype declared unsupported (dtypes.DECLARED: uint64, complex32) among the node's results, or None."""
    vals = pytree.tree_leaves(n.meta.get("val"))
    return next((v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype in dtypes.DECLARED), None)


def _refuse_dtype(dtype: torch.dtype) -> Callable[..., Any]:
    """A node without a lowering that makes a declared-unsupported dtype (hash_tensor's uint64) raises eager's
    DeclaredUnsupportedDtype when the program is traced, on the graph's first call, as view_as_complex's float16
    refusal does: raised while the backend compiles, Dynamo would wrap it in BackendCompilerFailed (before:
    NoLowering there)."""
    def refuse(*_: Any, **__: Any) -> Any:
        dtypes.check(dtype)
        raise AssertionError(f"{dtype} is in dtypes.DECLARED")  # check raised: unreachable

    return refuse


def _is_error_check(n: torch.fx.Node) -> bool:
    """A with_effects node running aten._linalg_check_errors (PyTorch makes it an effectful op: linalg.inv,
    solve, cholesky, lu_factor, ... check their _ex form's `info` with it). A program cannot raise on a value it
    computes, so the graph returns the info and `call` checks it on the host once the program has run, with
    CPU's messages (before: the higher-order op was called on a JAX tracer and raised a TypeError)."""
    return (n.op == "call_function" and n.target is torch.ops.higher_order.with_effects
            and len(n.args) >= 4 and n.args[1] is torch.ops.aten._linalg_check_errors.default)


def _check_errors(checks: list[tuple[str, bool]], infos: list[Any]) -> None:
    for (api, is_matrix), info in zip(checks, infos, strict=True):
        torch.ops.aten._linalg_check_errors(host_copy.to_cpu(info, dtypes.to_torch(info.dtype)), api,
                                            is_matrix=is_matrix)


_NO_META = object()  # a pytree leaf standing for an output node without a traced value


def _padded_plan(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None) -> Any:
    """A bounded-dynamism plan (bounded.py) when the graph has dynamic sizes and can be padded, else None:
    static shapes, one program per size."""
    from hf_tpu import bounded

    if not bounded.has_dynamic_sizes(example_inputs):
        return None
    try:
        return bounded.PaddedGraph(gm, example_inputs, options or {})
    except bounded.Unsupported as exc:
        bounded.log.warning("hf_tpu: bounded dynamism: static shapes for this graph (%s)", exc)
        counters.bump("static_dynamic_graphs")
        return None


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None,
                  inference: bool = False) -> Callable[..., Any]:
    """`options`: TorchTPU's compile options (compile_options.py); the bucket ones shape bounded dynamism.
    `inference`: a graph AOTAutograd compiled for inference (no backward reads its inputs), whose float32
    weights may be packed (packed_weights.py)."""
    from hf_tpu import packed_weights, runtime

    jax = runtime.jax()  # installs the persistent-cache listener (counters.py) too
    # the nodes' lowerings are looked up now: a program is shared only if they are the package's own now
    # and when it is traced (graph_ident checks then)
    own = graph_ident.own_lowerings()
    plan = _padded_plan(gm, example_inputs, options)
    packing = packed_weights.for_graph(gm) if inference and plan is None else None
    if plan is None:
        fn = to_jax_function(gm, packing.wrap_node if packing is not None else None)
    else:  # one program per bucket: the real sizes are its first (traced) argument
        fn = plan.wrap(to_jax_function(gm, plan.wrap_node, return_infos=False))
        counters.bump("padded_graphs")
    error_checks = getattr(fn, "error_checks", [])
    static = tuple(i + (plan is not None) for i, ex in enumerate(example_inputs) if not isinstance(ex, torch.Tensor))
    # the output node itself has no "val": its arguments (the returned nodes) do
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_vals = torch.fx.node.map_arg(out_node.args[0], lambda a: a.meta.get("val", _NO_META))
    out_leaves = pytree.tree_leaves(out_vals)
    # outputs that are inputs are handed back as they came in, not copied by the program (graph_outputs.py).
    # Decided from the graph alone: a graph loaded from the cache (meta example inputs) must trace the same
    # program as the one that saved its executable under the same ident.
    forwarded = {} if plan is not None else graph_outputs.forwarded_inputs(gm)
    if forwarded and len(pytree.tree_leaves(out_node.args[0])) == len(out_leaves):
        fn = graph_outputs.without_forwarded(fn, forwarded, bool(error_checks))
    else:
        forwarded = {}
    out_dtypes = [v.dtype if isinstance(v, torch.Tensor) else None for v in out_leaves]
    # a scalar output (an `.item()` value the graph returns) comes back as a Python number, as Dynamo expects
    out_scalar = [isinstance(v, _SYMBOLIC_SCALARS) for v in out_leaves]
    # each output goes to the device PyTorch traced it on, not the inputs' device: a graph may have no tpu
    # inputs at all (Qwen2-VL's vision position ids: torch.arange(h, device="tpu") from .tolist() values)
    out_on_tpu = [v.device.type != "cpu" if isinstance(v, torch.Tensor) else None for v in out_leaves]
    jitted: dict[str, Any] = {}
    # A graph that draws random numbers (dropout in training) takes its JAX key as an argument, drawn from
    # the tpu generator on every call: a key drawn while tracing would be a constant of the program, and every
    # call would repeat the same dropout mask.
    random = any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                 and lowering.is_random(n.target) for n in gm.graph.nodes)

    def traced(*args: Any) -> Any:
        counters.bump("compilations")  # runs once per XLA program JAX builds for this graph
        counters.bump("graph_traces")
        if not random:
            return fn(*args)
        before = rng.get_state()
        rng.set_state((args[-1], before[1]))  # the graph's draws split the key passed in
        try:
            return fn(*args[:-1])
        finally:
            rng.set_state(before)

    def get(prec: str, keyed: tuple[int, ...]) -> Any:
        if (prec, keyed) not in jitted:
            def with_precision(*args: Any) -> Any:
                with precision.forced(prec):
                    return traced(*args)

            # a whole graph: XLA's default optimisation, never the eager ops' fast compile (xla_options.py);
            # named for the executable cache when it can be (graph_ident.py: a graph cache hit then lowers nothing)
            ident = None if static or plan is not None or random or not own else graph_ident.graph_ident(gm, prec)
            if ident is not None and keyed:  # inputs handed over as packed weights' keys: another program
                ident = f"{ident}|packed={','.join(map(str, keyed))}"
            jitted[prec, keyed] = xla_options.jit_full(with_precision, ident=ident, static_argnums=static)
        return jitted[prec, keyed]

    wait = runtime.await_graph_programs()

    def call(args: list[Any]) -> list[Any]:
        on_tpu = any(T.is_tpu(a) for a in args)
        fused.current_op = COMPILED_GRAPH  # what a pending input's graph runs for (fused mode's stats)
        # packed weights' keys first: T.value of a weight whose array was dropped would rebuild it
        keys = packing.keys(args) if packing is not None else {}
        jargs = []
        for i, a in enumerate(args):
            if i in keys:
                jargs.append(keys[i])
            elif isinstance(a, torch.Tensor):
                jargs.append(T.value(a) if a.device.type == "tpu" else host_copy.from_cpu(a))
            else:
                jargs.append(a)
        kept = graph_outputs.kept_inputs(args, forwarded) if forwarded else None
        args.clear()  # boxed calling convention: let inputs be freed early
        if plan is not None:
            jargs, sizes, values = plan.pad(jargs)
            jargs.insert(0, sizes)
        if random:
            jargs.append(rng.ENV.get_and_rotate_prng_key())
        before = counters.count("compilations")
        start = time.perf_counter()
        program = get(precision.current(), tuple(keys))
        held = getattr(program, "executables", None)
        held = held() if held is not None else None
        out = program(*jargs)
        # (a program reading packed copies is awaited always: a later write may free the copy it reads)
        if wait or keys:  # XLA:CPU would keep the finished program's buffers (runtime.await_graph_programs)
            jax.block_until_ready(out)
        if error_checks:
            out, infos = out
            _check_errors(error_checks, infos)
        if held is not None and program.executables() > held and counters.count("compilations") == before:
            # loaded from the executable cache, never traced: a program built for this graph all the same
            # (the sweep's compile counts and steady-state recompile flag count programs, warm or cold)
            counters.bump("compilations")
        if counters.count("compilations") != before:  # this call traced and compiled (or loaded) a program
            counters.bump_time("xla_s", time.perf_counter() - start)
        leaves, spec = pytree.tree_flatten(out)
        if plan is not None:
            leaves = plan.unpad(leaves, values)
        res = []
        pad = [None] * (len(leaves) - len(out_dtypes))
        for x, dt, tpu, scalar in zip(leaves, out_dtypes + pad, out_on_tpu + pad, out_scalar + pad, strict=False):
            if scalar and hasattr(x, "item"):
                x = x.item()
            elif hasattr(x, "dtype") and hasattr(x, "shape"):
                dt = dt or dtypes.to_torch(x.dtype)
                x = T.wrap(x, dt) if (on_tpu if tpu is None else tpu) else host_copy.to_cpu(x, dt)
            res.append(x)
        if kept:
            graph_outputs.put_back(res, kept)
        return list(pytree.tree_unflatten(res, spec))

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def _grouped_mm_fake(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Fake-tensor rule for aten._grouped_mm on tpu. PyTorch's meta kernel checks CUDA's rules (bfloat16
    only, 16-byte strides); on tpu grouped_mm takes every dtype (Transformers' MoE calls it with float32
    there). The output shape follows torch.nn.functional.grouped_mm's documented layouts."""
    a, b = args[0], args[1]
    if a.device.type != "tpu":
        return NotImplemented
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    out_dtype = kwargs.get("out_dtype", args[4] if len(args) > 4 else None) or a.dtype
    if a.dim() == 2 and b.dim() == 3:
        shape = (a.shape[0], b.shape[2])
    elif a.dim() == 3 and b.dim() == 3:
        shape = (a.shape[0], a.shape[1], b.shape[2])
    elif a.dim() == 2 and b.dim() == 2 and offs is not None:
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    elif a.dim() == 3 and b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        return NotImplemented  # PyTorch's meta kernel names the problem
    if a.shape[-1] != b.shape[-2 if b.dim() == 3 else 0]:
        return NotImplemented
    with fake_mode:
        return a.new_empty(shape, dtype=out_dtype)


def _register_fake_rules() -> None:
    from torch._subclasses import fake_impls

    graph_parity.register_batch_norm_rules()
    graph_parity.register_layer_norm_rule()
    op = torch.ops.aten._grouped_mm.default
    if op not in fake_impls.op_implementations_dict:
        fake_impls.register_op_impl(op)(_grouped_mm_fake)
    graph_parity.register_sparse_rules()
    meta_kernels.register()


_register_fake_rules()


def decompositions() -> dict[Any, Any]:
    """Core ATen decompositions, plus torchax's, for ops we have no JAX lowering for."""
    # Cached per lowering table: hooks.override_lowerings (fault injection) swaps `lowering.find` for a
    # block, and a table made under it (decomposing an op only the override lacked) must not outlive it.
    return _decompositions(lowering.find)


# bounded: each override_lowerings block (diagnose's fault injection) makes a table of its own
@functools.lru_cache(maxsize=8)
def _decompositions(find: Callable[[Any], Any]) -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions

    _, tx = load_op_table()
    table = dict(core_aten_decompositions())
    for op, fn in tx.items():
        if isinstance(op, torch._ops.OpOverload):
            table.setdefault(op, fn)
        elif isinstance(op, torch._ops.OpOverloadPacket):
            for ov in op.overloads():
                table.setdefault(getattr(op, ov), fn)
    table.update(op_registry.table("graph_decomposition"))
    # PyTorch's other decompositions (eager runs them too: lowering.decomposition), for ops no rule of ours
    # covers: such an op would otherwise fail at compile time with NoLowering (ldexp.Tensor, special_bessel_j1
    # and special_ndtr on integers decomposed in eager but not in compiled graphs)
    from torch._decomp import decomposition_table

    ruled = {**op_registry.table("graph"), **op_registry.table("backward"), **op_registry.table("eager")}
    for op, fn in decomposition_table.items():
        if op not in table and op not in ruled:
            table[op] = fn
    # keep ops we lower directly whole (fewer, larger XLA ops); decompose only what we cannot lower
    return {op: fn for op, fn in table.items() if find(op) is None}


# torchax's rand_like decomposition makes its tensor on the default device (`torch.rand(self.shape)`): in a
# graph of tpu tensors that was a CPU tensor, so every compiled forward with dropout in training (native_dropout
# decomposes to rand_like) failed with FakeTensorDeviceMismatchError (cpu and tpu:0). PyTorch's rand_like
# makes it where `self` is.
@lowers(torch.ops.aten.rand_like.default, torch.ops.aten.rand_like.generator, kind="graph_decomposition")
def _rand_like(self: torch.Tensor, *, dtype: torch.dtype | None = None, device: Any = None,
               generator: Any = None, **_: Any) -> torch.Tensor:
    return torch.rand(self.shape, dtype=dtype or self.dtype, device=device or self.device, generator=generator)
