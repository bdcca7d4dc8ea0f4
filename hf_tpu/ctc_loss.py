"""CTC loss on tpu: `_ctc_loss` and `_ctc_loss_backward`, as CPU's kernels compute them (issue 26).

PyTorch has no decomposition of either and torchax no lowering, and JAX ships no CTC (optax's is not a
dependency), so Graves' recursions are written here, vectorised over the batch and the extended target and
scanned over time: log_alpha forward (the loss is -log of its last two states at each sequence's input
length), log_beta backward. The backward is CPU's formula, not the plain derivative: CPU returns
exp(log_probs) - exp(log(alpha * beta) + nll - log_probs), the gradient with respect to the logits before a
log_softmax (the two agree once that log_softmax's backward is applied), zero from each sequence's input
length on, and zero for an infinite loss under zero_infinity. Lengths are int lists (the overload autograd
and F.ctc_loss reach), so every shape is static.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _jnp() -> Any:
    return _jax().numpy


def _skips(ext: Any, blank: int) -> Any:
    """(N, width) whether state s may also be entered from s-2: l'(s) is a label other than l'(s-2)."""
    jnp = _jnp()
    skip = jnp.zeros(ext.shape, bool)
    if ext.shape[1] > 2:
        skip = skip.at[:, 2:].set((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]))
    return skip


def _extended(targets: Any, target_lengths: list[int], blank: int, width: int) -> tuple[Any, Any]:
    """(N, width) extended labels l' (blank, t1, blank, t2, ..., blank; blank-padded) and (N, width) whether
    state s may also be entered from s-2 (l'(s) is a label other than l'(s-2))."""
    jnp = _jnp()
    n = len(target_lengths)
    rows = []
    offset = 0
    for b, tl in enumerate(target_lengths):  # 2-D targets are padded rows; 1-D ones are concatenated
        row = targets[b, :tl] if targets.ndim == 2 else targets[offset:offset + tl]
        offset += tl
        lab = jnp.full((width,), blank, dtype=jnp.int32)
        rows.append(lab.at[1:2 * tl:2].set(row.astype(jnp.int32)))
    ext = jnp.stack(rows) if n else jnp.zeros((0, width), jnp.int32)
    return ext, _skips(ext, blank)


def _logsumexp3(a: Any, b: Any, c: Any) -> Any:
    """log(e^a + e^b + e^c) as CPU's kernel writes it: around the maximum, 0 where all are -inf."""
    jnp = _jnp()
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _alpha(lp: Any, ext: Any, skip: Any, input_lengths: list[int], target_lengths: list[int]) -> Any:
    """log_alpha (N, T, width): -inf outside each sequence's states and times."""
    jax = _jax()
    jnp = _jnp()
    n, width = ext.shape
    t_max = lp.shape[0]
    ninf = jnp.array(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(jnp.swapaxes(lp, 0, 1), ext[:, None, :], axis=2)  # (N, T, width): lp_t(l'(s))
    states = jnp.arange(width)[None, :] <= 2 * jnp.array(target_lengths)[:, None]  # s <= 2 * target length
    first = jnp.where(jnp.arange(width)[None, :] < 2, emit[:, 0], ninf)
    first = jnp.where(states, first, ninf)
    il = jnp.array(input_lengths)

    def step(prev: Any, t: Any) -> tuple[Any, Any]:
        shift1 = jnp.concatenate([jnp.full((n, 1), ninf), prev[:, :-1]], axis=1)
        shift2 = jnp.where(skip, jnp.concatenate([jnp.full((n, 2), ninf), prev[:, :-2]], axis=1), ninf)
        cur = jnp.where(states, _logsumexp3(prev, shift1, shift2) + emit[:, t], ninf)
        cur = jnp.where((t < il)[:, None], cur, ninf)
        return cur, cur

    _, rest = jax.lax.scan(step, first, jnp.arange(1, t_max))
    return jnp.concatenate([first[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)


@lowers(aten._ctc_loss.default)
def ctc_loss(log_probs: Any, targets: Any, input_lengths: list[int], target_lengths: list[int], blank: int = 0,
             zero_infinity: bool = False) -> tuple[Any, Any]:
    jnp = _jnp()
    if log_probs.ndim != 3:
        raise ValueError(f"_ctc_loss on tpu takes log_probs of shape (T, N, C), got {tuple(log_probs.shape)}: "
                         "F.ctc_loss adds the batch dimension of an unbatched input")
    input_lengths, target_lengths = [int(v) for v in input_lengths], [int(v) for v in target_lengths]
    width = 2 * max(target_lengths, default=0) + 1
    ext, skip = _extended(targets, target_lengths, blank, width)
    alpha = _alpha(log_probs, ext, skip, input_lengths, target_lengths)
    b = jnp.arange(len(input_lengths))
    last = alpha[b, jnp.maximum(jnp.array(input_lengths) - 1, 0)]  # (N, width) at t = input length - 1
    tl2 = 2 * jnp.array(target_lengths)
    l1 = last[b, tl2]
    l2 = jnp.where(tl2 > 0, last[b, jnp.maximum(tl2 - 1, 0)], -jnp.inf)
    m = jnp.maximum(l1, l2)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    nll = -(jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    return nll.astype(log_probs.dtype), alpha


@lowers(aten._ctc_loss_backward.default, kind="backward")
def ctc_loss_backward(grad: Any, log_probs: Any, targets: Any, input_lengths: list[int], target_lengths: list[int],
                      neg_log_likelihood: Any, log_alpha: Any, blank: int, zero_infinity: bool = False) -> Any:
    jax = _jax()
    jnp = _jnp()
    input_lengths, target_lengths = [int(v) for v in input_lengths], [int(v) for v in target_lengths]
    t_max, n, c = log_probs.shape
    width = log_alpha.shape[2]
    ext, _ = _extended(targets, target_lengths, blank, width)
    # beta runs the recursion on time and states reversed: per sequence, time il-1..0 and states 2tl..0
    rev_t = jnp.clip(jnp.array(input_lengths)[:, None] - 1 - jnp.arange(t_max)[None, :], 0, t_max - 1)  # (N, T)
    tl2 = 2 * jnp.array(target_lengths)
    rev_s = jnp.clip(tl2[:, None] - jnp.arange(width)[None, :], 0, width - 1)  # (N, width)
    lp_rev = jnp.take_along_axis(jnp.swapaxes(log_probs, 0, 1), rev_t[:, :, None], axis=1)  # (N, T, C)
    ext_rev = jnp.take_along_axis(ext, rev_s, axis=1)
    skip_rev = _skips(ext_rev, blank)  # entering s from s+2 backwards: l'(s) differs from l'(s+2) and is a label
    beta_rev = _alpha(jnp.swapaxes(lp_rev, 0, 1), ext_rev, skip_rev, input_lengths, target_lengths)
    # back to time t and state s: beta[t, s] = beta_rev[il-1-t, 2tl-s] (each reversal is its own inverse),
    # -inf where t >= il or s > 2tl
    beta = jnp.take_along_axis(beta_rev, rev_t[:, :, None], axis=1)
    beta = jnp.take_along_axis(beta, rev_s[:, None, :], axis=2)
    valid_t = jnp.arange(t_max)[None, :] < jnp.array(input_lengths)[:, None]
    valid_s = jnp.arange(width)[None, :] <= tl2[:, None]
    ab = jnp.where(valid_t[:, :, None] & valid_s[:, None, :], log_alpha + beta, -jnp.inf)  # (N, T, width)
    # log of the sum over the states carrying class k: exp around each time's maximum, summed into classes by a
    # one-hot contraction (CPU accumulates per class around a running maximum; the same up to rounding)
    m = jnp.max(ab, axis=2, keepdims=True)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    onehot = (jax.nn.one_hot(ext, c, dtype=ab.dtype) * valid_s[:, :, None]).astype(ab.dtype)  # (N, width, C)
    summed = jnp.einsum("ntw,nwc->ntc", jnp.exp(ab - m), onehot, precision=jax.lax.Precision.HIGHEST)
    lcab = jnp.log(summed) + m  # -inf for a class no state carries
    lp = jnp.swapaxes(log_probs, 0, 1)
    nll = neg_log_likelihood[:, None, None]
    g = (jnp.exp(lp) - jnp.exp(lcab + nll - lp)) * grad[:, None, None]
    g = jnp.where(valid_t[:, :, None], g, 0.0)
    if zero_infinity:
        g = jnp.where(jnp.isinf(nll), 0.0, g)
    return jnp.swapaxes(g, 0, 1).astype(log_probs.dtype)
