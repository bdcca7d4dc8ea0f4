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

Eager mode runs a step as ONE program over the whole parameter list (issue 25: one program per step, not one
per parameter), with the hyperparameters (lr, betas, ...) as traced arguments, so a learning-rate schedule
does not compile a new program each step. The step counts' `_foreach_add_(state_steps, 1)` that PyTorch
issues just before is deferred (foreach_add.py) and done inside that program; gradients that are views are
read inside it too. A 6-layer GPT-2's fused AdamW step: 93 programs (17 per chunk of same-shaped parameters,
76 `add_` for the counts) -> 1. Sharing across models: the program is named for the executable cache, so a
process that steps a model another process stepped loads it instead of tracing it (7 tiny models in one
process, benchmarks/optimizer_programs.py, CPU-s in the step: cold 3.05 with chunk programs shared across
models -> 3.08, warm 0.46 -> 0.43).
Compiled graphs lower the functional forms AOTAutograd records with the same functions.

Float32 Adam(W) steps without AMSGrad or GradScaler call PyTorch's own fused CPU kernel from inside that one
program (torch_dot_ffi.fused_adam, an XLA custom call on the donated buffers): CPU's bits, and seven passes over
the arrays where XLA:CPU's loops made eleven (a 151,936 x 1,024 parameter's steady step 158-165 -> 115-116 ms).
"""

from __future__ import annotations

import functools
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
    # torch.lerp's formula (the one foreach Adam's exp_avg.lerp_ uses), exact at both ends; foreach_ops' lerp
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
    """Functional `_fused_adam(w)`: (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) after one step.
    Float32 lists without AMSGrad or GradScaler take PyTorch's own kernel inside the program (torch_dot_ffi)."""
    from hf_tpu import torch_dot_ffi

    jnp = _jax().numpy
    wide = jnp.float64 if _jax().config.jax_enable_x64 else jnp.float32
    lr_w, b1, b2, wd = (_scalar(v, wide) for v in (lr, beta1, beta2, weight_decay))
    if not amsgrad and grad_scale is None and found_inf is None:
        by_torch = torch_dot_ffi.fused_adam(params, grads, exp_avgs, exp_avg_sqs, state_steps,
                                            (lr_w, b1, b2, wd, _scalar(eps, wide)), maximize=maximize,
                                            decoupled=decoupled)
        if by_torch is not None:
            return by_torch[0], list(grads), by_torch[1], by_torch[2], list(max_exp_avg_sqs)
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
             keep: tuple[int, ...] | None = None, steps_at: int | None = None,
             operands: tuple[tuple[int, tuple], ...] = ()) -> Callable[..., Any]:
    """The step's program; `donate`: the positional lists (parameters, states) whose arrays XLA may
    overwrite with the results instead of allocating new ones; `keep`: which of fn's outputs it returns
    (None: all); `steps_at`: the position of the state_steps list when the program adds the step's
    increment to the counts itself (the keyword `step_increment`) and returns the new counts last;
    `operands`: (list position, a tensor.Operand key or None per element) for lists holding views, whose
    buffers the program gets and reads the views of itself."""
    from hf_tpu import xla_options

    # full optimisation at real size (xla_options.py); named for the executable cache, so that a process
    # loads the step program another one compiled instead of tracing and lowering it (16% of a warm
    # sweep entry's CPU time went to the fused AdamW step, measured on data2vec-text QA)
    return xla_options.jit(functools.partial(_selected, fn, keep, dict(statics), steps_at, dict(operands)),
                           ident=_ident(fn, statics, keep, steps_at, operands), donate_argnums=donate)


def _ident(fn: Callable[..., Any], statics: tuple[tuple[str, Any], ...], keep: tuple[int, ...] | None,
           steps_at: int | None = None, operands: tuple[tuple[int, tuple], ...] = ()) -> str | None:
    """The step program's name across processes (executable_cache.py): the functional step (this module's
    source is in the cache's environment digest), its static hyperparameters, the outputs it returns,
    whether it counts the step and the views it reads; the traced ones (lr, betas, ...) and the lists' shapes are in each call's
    key. None when a static value has no stable text."""
    from hf_tpu import executable_cache

    base = fn.func if isinstance(fn, functools.partial) else fn
    if base not in (adam, sgd) or (isinstance(fn, functools.partial) and fn.args):
        return None
    try:
        bound = executable_cache.stable(dict(fn.keywords) if isinstance(fn, functools.partial) else {})
        return (f"optim|{base.__name__}|{bound}|{executable_cache.stable(dict(statics))}|keep={keep}"
                f"|steps_at={steps_at}|views={executable_cache.stable(operands)}")
    except executable_cache.Unstable:
        return None


traces = 0  # step programs traced in this process (a warm executable cache traces none it has seen)


def _selected(fn: Callable[..., Any], keep: tuple[int, ...] | None, statics: dict[str, Any],
              steps_at: int | None, operands: dict[int, tuple], *lists: Any, **traced: Any) -> tuple[Any, ...]:
    from hf_tpu import tensor as T

    global traces
    traces += 1  # runs only while JAX traces the program
    if operands:
        lists = tuple([a if k is None else T.apply_operand(a, k) for a, k in zip(ls, operands[i], strict=True)]
                      if i in operands else ls for i, ls in enumerate(lists))
    if steps_at is not None:
        inc = traced.pop("step_increment")
        steps = [(s + inc).astype(s.dtype) for s in lists[steps_at]]  # as `_foreach_add_(state_steps, 1)`
        lists = (*lists[:steps_at], steps, *lists[steps_at + 1:])
    outs = fn(*lists, **traced, **statics)
    outs = outs if keep is None else tuple(outs[k] for k in keep)
    return outs if steps_at is None else (*outs, lists[steps_at])


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


def eager_kernel(op: Any) -> Callable[..., None]:
    """The tpu kernel of in-place `op` (`_fused_adamw_`, ...): every list it writes, from one program over the
    whole parameter list, which also adds the step's increment to the step counts when the
    `_foreach_add_(state_steps, 1)` before it is still waiting (foreach_add.py): one program per step (the
    issue's requirement; it was one per chunk of same-shaped parameters plus one `add_` per parameter, 93
    for a 6-layer GPT-2)."""
    from hf_tpu import foreach_add, host_copy
    from hf_tpu import tensor as T

    fn, traced_names = _INPLACE[op]
    schema = op._schema.arguments
    written = _lists_written(op)
    positional = [a.name for a in schema if not a.kwarg_only]
    steps_at = positional.index("state_steps") if "state_steps" in positional else None
    # the parameters and states; not the gradients (often views of a backward op's result, and written back
    # unchanged unless GradScaler's scale divides them)
    donated = tuple(i for i in written if schema[i].name != "grads")
    keep_unscaled = tuple(k for k, i in enumerate(written) if schema[i].name != "grads")

    def read(i: int, ts: list[torch.Tensor], operands: list[tuple[int, tuple]]) -> list[Any]:
        """List i's arrays. A view in a list the step does not donate (gradients that are views of a
        backward op's result, ViT's and conv weights') is handed over as its buffer and read inside the
        program (its key joins `operands`), not materialised by a program of its own first."""
        if i in donated:
            return [T.value(t) for t in ts]
        arrays, keys = [], []
        for t in ts:
            o = T.operand(t)
            arrays.append(o.array if type(o) is T.Operand else o)
            keys.append(o.key if type(o) is T.Operand else None)
        if any(k is not None for k in keys):
            operands.append((i, tuple(keys)))
        return arrays

    def kernel(*args: Any, **kwargs: Any) -> None:
        pending = foreach_add.waiting(args[steps_at]) if steps_at is not None and args[steps_at] else None
        operands: list[tuple[int, tuple]] = []
        lists = [pending[0] if pending is not None and i == steps_at else read(i, ts, operands)
                 for i, ts in enumerate(args[: len(positional)])]
        traced, statics = {}, []
        for name, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                traced[name] = T.value(v) if v.device.type == "tpu" else host_copy.from_cpu(v)
            elif name in traced_names:
                traced[name] = v  # a Python float: a traced argument of the program, not a constant in it
            elif v is not None:
                statics.append((name, v))
        if pending is not None:
            traced["step_increment"] = pending[1]  # traced too: the same program whatever the increment
        donate = donated if _donatable(args, lists, donated) else ()
        # the gradients come back changed only when GradScaler's scale divides them; otherwise they are not
        # outputs at all: returned, they would take a donated buffer of their shape (JAX pairs donated inputs
        # with outputs by shape, in order) and be copied into it, leaving a state list to allocate anew
        keep = None if "grad_scale" in traced else keep_unscaled
        program = _program(fn, tuple(sorted(statics)), donate, keep, steps_at if pending is not None else None,
                           tuple(operands))
        outputs = written if keep is None else [written[k] for k in keep]
        if pending is not None:
            outputs = [*outputs, steps_at]
        outs = program(*lists, **traced)
        for i, new in zip(outputs, outs, strict=True):
            for t, a in zip(args[i], new, strict=True):  # an empty list (no max_exp_avg_sqs) stays empty
                T.assign(t, a)

    return kernel


for _op in _INPLACE:  # fused optimizer steps: one program per step
    lowers(_op, kind="eager")(eager_kernel(_op))
