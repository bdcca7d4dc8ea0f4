"""Fused optimizer steps and GradScaler's kernels on tpu.

`torch.optim.AdamW/Adam/SGD(fused=True)` call `_fused_adamw_`, `_fused_adam_`, `_fused_sgd_` once per step
with lists of every parameter, gradient and state tensor; `torch.amp.GradScaler` calls
`_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`. PyTorch has kernels for them on CPU and
CUDA only (torchax has no lowering): on tpu they failed with "no JAX lowering for aten::_fused_adamw".

The math follows the `foreach` implementations in torch/optim (lerp for the first moment, bias corrections
from the step count in float64 as the Python scalars there are, float32 arithmetic for 16-bit parameters as
PyTorch's fused kernels do), so a fused step equals a foreach step within float32 rounding. `grad_scale`
(GradScaler's scale) divides the gradients, which are written back unscaled as PyTorch's kernels do, and a
nonzero `found_inf` leaves every tensor as it was.

Eager mode runs the in-place ops through jitted programs whose hyperparameters (lr, betas, ...) are traced
arguments, so a learning-rate schedule does not compile a new program each step. A step's parameters are
grouped by the shapes and dtypes of their tensors (parameter, gradient, states), and each group runs in
chunks of 2**k parameters, each chunk one program: the programs depend on the shapes alone, not on the whole
parameter list, so a process that steps many models (the sweep's worker, one model per entry) traces and
lowers each (shapes, 2**k) program once instead of one program per model (that was 19% of a warm sweep
entry's CPU time: Bert's whole-list program took 2.9 CPU-s to trace and lower for 3 steps). The math is
per element and every chunk takes the compile variant the whole step's arrays select (`variant`), so the
results are bit-identical to one whole-list program (tests/hf_tpu/test_fused_optim.py).
Compiled graphs lower the functional forms AOTAutograd records with the same functions.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _opmath(dtype: Any) -> Any:
    jnp = _jax().numpy
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _scalar(x: Any, dtype: Any) -> Any:
    return _jax().numpy.asarray(x).astype(dtype).reshape(())


def _lerp(start: Any, end: Any, weight: Any) -> Any:
    # torch.lerp's formula (the one foreach Adam's exp_avg.lerp_ uses), exact at both ends
    jnp = _jax().numpy
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


def _unscale(g: Any, grad_scale: Any, opmath: Any) -> Any:
    g = g.astype(opmath)
    return g if grad_scale is None else g / _scalar(grad_scale, opmath)


def _keep_if_inf(found_inf: Any, new: list[list[Any]], old: list[list[Any]]) -> list[list[Any]]:
    """found_inf != 0: every tensor keeps its old value (the step is skipped)."""
    if found_inf is None:
        return new
    jnp = _jax().numpy
    skip = jnp.asarray(found_inf).reshape(()) != 0
    return [[jnp.where(skip, o, n) for n, o in zip(ns, os_, strict=True)] for ns, os_ in zip(new, old, strict=True)]


def adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, max_exp_avg_sqs: list, state_steps: list,
         *, lr: Any, beta1: Any, beta2: Any, weight_decay: Any, eps: Any, amsgrad: bool, maximize: bool,
         grad_scale: Any = None, found_inf: Any = None, decoupled: bool) -> tuple[list, ...]:
    """Functional `_fused_adam(w)`: (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) after one step."""
    jnp = _jax().numpy
    wide = jnp.float64 if _jax().config.jax_enable_x64 else jnp.float32
    lr_w, b1, b2, wd = (_scalar(v, wide) for v in (lr, beta1, beta2, weight_decay))
    out: list[list[Any]] = [[], [], [], [], []]
    for i, p in enumerate(params):
        om = _opmath(p.dtype)
        g = _unscale(grads[i], grad_scale, om)
        out[1].append(g.astype(grads[i].dtype))
        if maximize:
            g = -g
        pf = p.astype(om)
        if decoupled:
            pf = pf * (1 - lr_w * wd).astype(om)
        else:
            g = g + wd.astype(om) * pf
        m = _lerp(exp_avgs[i].astype(om), g, (1 - b1).astype(om))
        v = exp_avg_sqs[i].astype(om) * b2.astype(om) + (g * g) * (1 - b2).astype(om)
        step = jnp.asarray(state_steps[i]).astype(wide).reshape(())
        bc1 = 1 - b1 ** step
        bc2_sqrt = jnp.sqrt(1 - b2 ** step)
        step_size = (lr_w / bc1).astype(om)
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i].astype(om), v)
            out[4].append(vmax.astype(max_exp_avg_sqs[i].dtype))
            denom = jnp.sqrt(vmax) / bc2_sqrt.astype(om) + _scalar(eps, om)
        else:
            denom = jnp.sqrt(v) / bc2_sqrt.astype(om) + _scalar(eps, om)
        pf = pf - step_size * (m / denom)
        out[0].append(pf.astype(p.dtype))
        out[2].append(m.astype(exp_avgs[i].dtype))
        out[3].append(v.astype(exp_avg_sqs[i].dtype))
    old = [list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(max_exp_avg_sqs) if amsgrad else []]
    if not amsgrad:
        out[4] = list(max_exp_avg_sqs)
        old[4] = list(max_exp_avg_sqs)
    # the unscaled gradients are written even when the step is skipped (as PyTorch's kernels do)
    kept = _keep_if_inf(found_inf, [out[0], out[2], out[3], out[4]], [old[0], old[2], old[3], old[4]])
    return kept[0], out[1], kept[1], kept[2], kept[3]


@lowers(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def sgd(params: list, grads: list, momentum_buffer_list: list, *, weight_decay: Any, momentum: Any, lr: Any,
        dampening: Any, nesterov: bool, maximize: bool, is_first_step: bool, grad_scale: Any = None,
        found_inf: Any = None) -> tuple[list, ...]:
    """Functional `_fused_sgd`: (params, grads, momentum_buffer_list) after one step. With no momentum buffers
    (momentum 0) the step is plain SGD."""
    jnp = _jax().numpy
    wide = jnp.float64 if _jax().config.jax_enable_x64 else jnp.float32
    new_p, new_g, new_b = [], [], []
    for i, p in enumerate(params):
        om = _opmath(p.dtype)
        g = _unscale(grads[i], grad_scale, om)
        new_g.append(g.astype(grads[i].dtype))
        if maximize:
            g = -g
        pf = p.astype(om)
        g = g + _scalar(weight_decay, om) * pf
        if momentum_buffer_list:
            if is_first_step:
                buf = g
            else:
                buf = (momentum_buffer_list[i].astype(om) * _scalar(momentum, om)
                       + g * (1 - _scalar(dampening, wide)).astype(om))
            new_b.append(buf.astype(momentum_buffer_list[i].dtype))
            g = g + _scalar(momentum, om) * buf if nesterov else buf
        new_p.append((pf - _scalar(lr, om) * g).astype(p.dtype))
    kept = _keep_if_inf(found_inf, [new_p, new_b], [list(params), list(momentum_buffer_list)])
    return kept[0], new_g, kept[1]


@lowers(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_unscale(grads: list, found_inf: Any, inv_scale: Any) -> tuple[list, Any]:
    """Functional `_amp_foreach_non_finite_check_and_unscale`: grads * inv_scale, and found_inf set to 1 when
    any gradient holds an inf or a NaN."""
    jnp = _jax().numpy
    bad = jnp.zeros((), jnp.bool_)
    out = []
    for g in grads:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        out.append((g.astype(jnp.float32) * inv_scale.astype(jnp.float32).reshape(())).astype(g.dtype))
    return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowers(aten._amp_update_scale.default)
def amp_update_scale(scale: Any, growth_tracker: Any, found_inf: Any, scale_growth_factor: float,
                     scale_backoff_factor: float, growth_interval: int) -> tuple[Any, Any]:
    """Functional `_amp_update_scale`: back off after an inf, grow after `growth_interval` clean steps."""
    jnp = _jax().numpy
    inf = found_inf.reshape(scale.shape) != 0
    successful = growth_tracker + 1
    grow = successful >= growth_interval
    grown = scale * scale_growth_factor
    grown = jnp.where(jnp.isfinite(grown), grown, scale)  # as PyTorch: never grow into inf
    new_scale = jnp.where(inf, scale * scale_backoff_factor, jnp.where(grow, grown, scale))
    new_tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale.astype(scale.dtype), new_tracker.astype(growth_tracker.dtype)


# ------------------------------------------------------------------------------------ lowerings and eager
_ADAM = {aten._fused_adamw.default: True, aten._fused_adamw.tensor_lr: True,
         aten._fused_adam.default: False, aten._fused_adam.tensor_lr: False}

for _op, _decoupled in _ADAM.items():
    lowers(_op)(functools.partial(adam, decoupled=_decoupled))

# in-place op -> (functional JAX function, its traced keyword hyperparameters, its static ones)
_ADAM_SCALARS = ("lr", "beta1", "beta2", "weight_decay", "eps")
_SGD_SCALARS = ("weight_decay", "momentum", "lr", "dampening")
_INPLACE: dict[Any, tuple[Callable[..., Any], tuple[str, ...]]] = {
    **{getattr(aten, f"_fused_adam{'w' if dec else ''}_").default: (functools.partial(adam, decoupled=dec),
                                                                   _ADAM_SCALARS) for dec in (True, False)},
    **{getattr(aten, f"_fused_adam{'w' if dec else ''}_").tensor_lr: (functools.partial(adam, decoupled=dec),
                                                                     _ADAM_SCALARS) for dec in (True, False)},
    aten._fused_sgd_.default: (sgd, _SGD_SCALARS),
    aten._fused_sgd_.tensor_lr: (sgd, _SGD_SCALARS),
}


@functools.cache
def _program(fn: Callable[..., Any], statics: tuple[tuple[str, Any], ...], donate: tuple[int, ...] = (),
             keep: tuple[int, ...] | None = None) -> Callable[..., Any]:
    """The step's program; `donate`: the positional lists (parameters, states) whose arrays XLA may
    overwrite with the results instead of allocating new ones; `keep`: which of fn's outputs it returns
    (None: all)."""
    from hf_tpu import xla_options

    # full optimisation at real size (xla_options.py); named for the executable cache, so that a process
    # loads the chunk programs another one compiled instead of tracing and lowering them (16% of a warm
    # sweep entry's CPU time went to the fused AdamW step, measured on data2vec-text QA)
    return xla_options.jit(functools.partial(_selected, fn, keep, dict(statics)), ident=_ident(fn, statics, keep),
                           donate_argnums=donate)


def _ident(fn: Callable[..., Any], statics: tuple[tuple[str, Any], ...], keep: tuple[int, ...] | None) -> str | None:
    """The step program's name across processes (executable_cache.py): the functional step (this module's
    source is in the cache's environment digest), its static hyperparameters and the outputs it returns; the
    traced ones (lr, betas, ...) and the lists' shapes are in each call's key. None when a static value has
    no stable text."""
    from hf_tpu import executable_cache

    base = fn.func if isinstance(fn, functools.partial) else fn
    if base not in (adam, sgd) or (isinstance(fn, functools.partial) and fn.args):
        return None
    try:
        bound = executable_cache.stable(dict(fn.keywords) if isinstance(fn, functools.partial) else {})
        return f"optim|{base.__name__}|{bound}|{executable_cache.stable(dict(statics))}|keep={keep}"
    except executable_cache.Unstable:
        return None


traces = 0  # step programs traced in this process (a warm executable cache traces none it has seen)


def _selected(fn: Callable[..., Any], keep: tuple[int, ...] | None, statics: dict[str, Any], *lists: Any,
              **traced: Any) -> tuple[Any, ...]:
    global traces
    traces += 1  # runs only while JAX traces the program
    outs = fn(*lists, **traced, **statics)
    return outs if keep is None else tuple(outs[k] for k in keep)


def _donatable(args: tuple, lists: list[list[Any]], written: tuple[int, ...]) -> bool:
    """Whether the arrays of the lists in `written` may be donated: each is its tensor's whole
    buffer, held by that one Buffer (memory.holders: not shared with a copy, a `copy_` source, a deepcopy)
    and listed once. Donating them lets XLA write the new parameters and moments over the old ones, so a
    step needs no second copy of the parameters and optimizer state (a GPT-2 124M training step's peak RSS:
    4.8 -> 3.8 GB).
    Not in fused eager mode: a pending graph may still read an old array."""
    from hf_tpu import fused, memory
    from hf_tpu import tensor as T

    if fused.ACTIVE:
        return False
    seen: set[int] = set()
    for i in written:
        for t, a in zip(args[i], lists[i], strict=True):
            p = T.payload(t)
            if p.view is not None or p.buf._array is not a or memory.holders(a) != 1 or id(a) in seen:
                return False
            seen.add(id(a))
    return True


def _lists_written(op: Any) -> list[int]:
    return [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def chunks(lists: list[list[Any]]) -> list[list[int]]:
    """The parameter indices of a step, grouped by the shapes and dtypes of every list's element (an empty
    list, e.g. max_exp_avg_sqs without amsgrad, takes no part), each group split into chunks of 2**k indices
    (largest first, in order): the programs a step runs. Chunks of powers of two bound the programs per group
    to log2(size)+1 while letting models with different numbers of same-shaped parameters share them."""
    n = len(lists[0])
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        key = tuple((tuple(a[i].shape), str(a[i].dtype), bool(getattr(a[i], "weak_type", False)))
                    for a in lists if len(a) == n)
        groups.setdefault(key, []).append(i)
    out = []
    for idx in groups.values():
        start = 0
        while start < len(idx):
            size = 1 << ((len(idx) - start).bit_length() - 1)
            out.append(idx[start:start + size])
            start += size
    return out


def variant(program: Callable[..., Any], lists: list[list[Any]]) -> Callable[..., Any]:
    """The compile variant of `program` (xla_options.jit) that the whole step's lists select, for every chunk:
    XLA's full optimisation and the fast-compile flags round this program differently (1 ulp in a few
    elements, measured), so a chunk compiled by its own size would not equal the whole-list step bit for
    bit."""
    from hf_tpu import xla_options

    large = any(getattr(a, "size", 0) >= xla_options.LARGE_ELEMENTS for a in itertools.chain(*lists))
    return getattr(program, "full" if large else "fast", program)


def eager_kernel(op: Any) -> Callable[..., None]:
    """The tpu kernel of in-place `op` (`_fused_adamw_`, ...): every list it writes, from one program per
    chunk of same-shaped parameters (`chunks`)."""
    from hf_tpu import host_copy
    from hf_tpu import tensor as T

    fn, traced_names = _INPLACE[op]
    schema = op._schema.arguments
    written = _lists_written(op)
    positional = [a.name for a in schema if not a.kwarg_only]
    # the parameters and states; not the gradients (often views of a backward op's result, and written back
    # unchanged unless GradScaler's scale divides them)
    donated = tuple(i for i in written if schema[i].name != "grads")
    keep_unscaled = tuple(k for k, i in enumerate(written) if schema[i].name != "grads")

    def kernel(*args: Any, **kwargs: Any) -> None:
        lists = [[T.value(t) for t in ts] for ts in args[: len(positional)]]
        traced, statics = {}, []
        for name, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                traced[name] = T.value(v) if v.device.type == "tpu" else host_copy.from_cpu(v)
            elif name in traced_names:
                traced[name] = v  # a Python float: a traced argument of the program, not a constant in it
            elif v is not None:
                statics.append((name, v))
        donate = donated if _donatable(args, lists, donated) else ()
        # the gradients come back changed only when GradScaler's scale divides them; otherwise they are not
        # outputs at all: returned, they would take a donated buffer of their shape (JAX pairs donated inputs
        # with outputs by shape, in order) and be copied into it, leaving a state list to allocate anew
        keep = None if "grad_scale" in traced else keep_unscaled
        program = variant(_program(fn, tuple(sorted(statics)), donate, keep), lists)
        outputs = written if keep is None else [written[k] for k in keep]
        for chunk in chunks(lists):
            outs = program(*[[a[j] for j in chunk] if a else a for a in lists], **traced)
            for i, new in zip(outputs, outs, strict=True):
                for j, a in zip(chunk if args[i] else (), new, strict=True):  # an empty list stays empty
                    T.assign(args[i][j], a)

    return kernel


for _op in _INPLACE:  # fused optimizer steps: a program per chunk of same-shaped parameters
    lowers(_op, kind="eager")(eager_kernel(_op))
