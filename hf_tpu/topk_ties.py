"""aten.topk with CPU's indices when values tie, and CPU's order when unsorted.

Why not torchax's (jax.lax.top_k): among equal values it returns the lowest index first, and it always sorts.
CPU's kernel (ATen/native/TopKImpl.h) runs libstdc++'s algorithms on (value, index) pairs with the comparator
"a before b when a is NaN and b is not, or a > b" (largest; mirrored for smallest): `std::partial_sort` when
k * 64 <= n, otherwise `std::nth_element` at k - 1 and, when sorted, `std::sort` of the first k - 1. Which of
several tied elements it keeps, and the unsorted order, are whatever those algorithms leave. Qwen4-Exp's
indexed attention picks key blocks with `scores.topk(2)` over relu'd scores where zeros tie: CPU kept block 2,
lax.top_k block 0, and the logits differed by 0.03 (issue 28's bounded-dynamism run, wrong in plain eager too).

So this lowering replays those algorithms (GCC's libstdc++, which PyTorch's Linux wheels are built with) on an
integer key per element whose `<` is the comparator (ties stay ties: -0.0 == 0.0, every NaN equal):
- introselect: median-of-three pivot and the unguarded (Hoare) partition, which is computed for a whole
  segment at once (the m-th element stopping the left scan swaps with the m-th stopping the right scan until
  they cross); at depth 2*lg(n) the heap fallback; then an insertion sort of the last <= 3 elements;
- heap select and sort heap (partial_sort, and introselect's fallback): make/adjust/push/pop_heap, one step at
  a time;
- std::sort of the first k - 1: XLA:CPU's unstable sort is that std::sort (tests/hf_tpu/test_sort_ties.py), so
  lax.sort with the key gives its permutation.
The replay runs only when it can change the answer: a sorted result is unique unless two of the k + 1 best
keys in a row tie, so without ties lax.top_k's indices are returned (a lax.cond over the whole tensor); an
unsorted nth_element result (k > 1, k * 64 > n) is always replayed. Rows are replayed one at a time (lax.map),
so the element-wise heap steps update in place.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def order_key(x: Any, largest: bool) -> Any:
    """An integer array whose `<` is CPU's topk comparator: key[i] < key[j] exactly when CPU puts x[i] before
    x[j]; equal keys are CPU's ties (-0.0 and 0.0; any two NaNs)."""
    jax = _jax()
    jnp = jax.numpy
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return ~x if largest else x  # ~ reverses the order without overflowing at the minimum
    if x.dtype != jnp.float64:
        x = x.astype(jnp.float32)  # half types convert exactly
    itype = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
    info = jnp.iinfo(itype)
    bits = jax.lax.bitcast_convert_type(x, itype)
    bits = jnp.where(bits == info.min, 0, bits)  # -0.0's bit pattern: ties with 0.0 in CPU's comparator
    # monotone: negative floats (sign bit set) have their magnitude bits flipped
    s = bits ^ ((bits >> (jnp.iinfo(itype).bits - 1)) & info.max)
    s = jnp.where(jnp.isnan(x), info.max, s)  # NaN above everything, every NaN equal
    return ~s if largest else s


def _half(v: Any) -> Any:
    """C++'s v / 2 for an int: toward zero ((-1) / 2 == 0)."""
    return _jax().lax.div(v, _jax().numpy.asarray(2, v.dtype))


def _swap(t: Any, p: Any, i: Any, j: Any) -> tuple[Any, Any]:
    ti, tj, pi, pj = t[i], t[j], p[i], p[j]
    return t.at[i].set(tj).at[j].set(ti), p.at[i].set(pj).at[j].set(pi)


def _partition_pivot(t: Any, p: Any, f: Any, l: Any) -> tuple[Any, Any, Any]:  # noqa: E741 - libstdc++'s names
    """std::__unguarded_partition_pivot on [f, l): the median of t[f+1], t[mid], t[l-1] swapped to f, then the
    Hoare partition of (f, l) around it, done for the whole segment at once; returns (t, p, cut)."""
    jax = _jax()
    jnp = jax.numpy
    n = t.shape[0]
    a, b, c = f + 1, f + (l - f) // 2, l - 1
    ta, tb, tc = t[a], t[b], t[c]
    sel = jnp.where(ta < tb, jnp.where(tb < tc, b, jnp.where(ta < tc, c, a)),
                    jnp.where(ta < tc, a, jnp.where(tb < tc, c, b)))
    t, p = _swap(t, p, f, sel)
    pv = t[f]
    pos = jnp.arange(n, dtype=f.dtype)
    inside = (pos > f) & (pos < l)
    stops_left = inside & ~(t < pv)  # the left scan runs while t < pivot
    stops_right = inside & ~(pv < t)  # the right scan runs while pivot < t
    # A[m]: the m-th left stopper from the left, B[m]: the m-th right stopper from the right (n and -1 past the
    # last). Round m swaps A[m] and B[m] while A[m] < B[m]; before the first crossing M every scan only meets
    # untouched elements, and at M the left scan stops at A[M] or at B[M-1] (now holding a left stopper).
    ia = jnp.where(stops_left, jnp.cumsum(stops_left) - 1, n)
    ib = jnp.where(stops_right, jnp.sum(stops_right) - jnp.cumsum(stops_right), n)
    big = jnp.asarray(n, f.dtype)
    A = jnp.full((n + 1,), n, f.dtype).at[ia].set(pos).at[n].set(big)
    B = jnp.full((n + 1,), -1, f.dtype).at[ib].set(pos).at[n].set(-1)
    M = jnp.argmax(A >= B)  # exists: A[count] = n
    swapped = jnp.arange(n + 1) < M
    perm = jnp.arange(n, dtype=f.dtype)
    perm = perm.at[jnp.where(swapped, A, n)].set(B, mode="drop").at[jnp.where(swapped, B, n)].set(A, mode="drop")
    cut = jnp.minimum(A[M], jnp.where(M > 0, B[jnp.maximum(M - 1, 0)], big))
    return t[perm], p[perm], cut


def _adjust_heap(t: Any, p: Any, base: Any, hole: Any, length: Any, vt: Any, vp: Any) -> tuple[Any, Any]:
    """std::__adjust_heap followed by its std::__push_heap: a max-heap under `<` at t[base:base+length]."""
    lax = _jax().lax
    jnp = _jax().numpy
    n = t.shape[0]
    top = hole

    def down_cond(s: Any) -> Any:
        return s[3] < _half(length - 1)

    def down(s: Any) -> Any:
        t, p, hole, second = s
        second = 2 * (second + 1)
        second = jnp.where(t[base + second] < t[base + second - 1], second - 1, second)
        return t.at[base + hole].set(t[base + second]), p.at[base + hole].set(p[base + second]), second, second

    t, p, hole, second = lax.while_loop(down_cond, down, (t, p, hole, hole))
    even = ((length & 1) == 0) & (second == _half(length - 2))
    src = jnp.clip(base + 2 * (second + 1) - 1, 0, n - 1)
    dst = jnp.where(even, base + hole, n)  # out of range: dropped
    t, p = t.at[dst].set(t[src], mode="drop"), p.at[dst].set(p[src], mode="drop")
    hole = jnp.where(even, 2 * (second + 1) - 1, hole)

    def up_cond(s: Any) -> Any:
        t, _, hole = s
        return (hole > top) & (t[base + jnp.maximum(_half(hole - 1), 0)] < vt)

    def up(s: Any) -> Any:
        t, p, hole = s
        parent = _half(hole - 1)
        return t.at[base + hole].set(t[base + parent]), p.at[base + hole].set(p[base + parent]), parent

    t, p, hole = lax.while_loop(up_cond, up, (t, p, hole))
    return t.at[base + hole].set(vt), p.at[base + hole].set(vp)


def _pop_heap(t: Any, p: Any, first: Any, last: Any, result: Any) -> tuple[Any, Any]:
    vt, vp = t[result], p[result]
    t, p = t.at[result].set(t[first]), p.at[result].set(p[first])
    return _adjust_heap(t, p, first, jnp_zero(first), last - first, vt, vp)


def jnp_zero(like: Any) -> Any:
    return _jax().numpy.zeros((), like.dtype)


def _heap_select(t: Any, p: Any, first: Any, middle: Any, last: Any) -> tuple[Any, Any]:
    """std::__heap_select: make_heap of [first, middle), then every later element better than the heap's top
    replaces it."""
    lax = _jax().lax
    length = middle - first

    def make(s: Any) -> Any:
        t, p, parent = s
        t, p = _adjust_heap(t, p, first, parent, length, t[first + parent], p[first + parent])
        return t, p, parent - 1

    # parents (len-2)/2 down to 0; nothing when len < 2
    t, p, _ = lax.while_loop(lambda s: (length >= 2) & (s[2] >= 0), make, (t, p, _half(length - 2)))

    def scan(i: Any, s: Any) -> Any:
        t, p = s
        return lax.cond(t[i] < t[first], lambda tp: _pop_heap(*tp, first, middle, i), lambda tp: tp, (t, p))

    return lax.fori_loop(middle, last, scan, (t, p))


def _sort_heap(t: Any, p: Any, first: Any, last: Any) -> tuple[Any, Any]:
    lax = _jax().lax

    def body(s: Any) -> Any:
        t, p, last = s
        t, p = _pop_heap(t, p, first, last - 1, last - 1)
        return t, p, last - 1

    t, p, _ = lax.while_loop(lambda s: s[2] - first > 1, body, (t, p, last))
    return t, p


def _insertion_sort(t: Any, p: Any, first: Any, last: Any) -> tuple[Any, Any]:
    """std::__insertion_sort (stable): each element moves left past the elements greater than it."""
    lax = _jax().lax

    def insert(i: Any, s: Any) -> Any:
        t, p = s
        vt, vp = t[i], p[i]

        def shift(s: Any) -> Any:
            t, p, j = s
            return t.at[j].set(t[j - 1]), p.at[j].set(p[j - 1]), j - 1

        t, p, j = lax.while_loop(lambda s: (s[2] > first) & (vt < s[0][s[2] - 1]), shift, (t, p, i))
        return t.at[j].set(vt), p.at[j].set(vp)

    return lax.fori_loop(first + 1, last, insert, (t, p))


def _introselect(t: Any, p: Any, nth: int) -> tuple[Any, Any]:
    """std::nth_element(begin, begin + nth, end)."""
    jax = _jax()
    lax, jnp = jax.lax, jax.numpy
    n = t.shape[0]
    zero = jnp.zeros((), jnp.int32)

    def body(s: Any) -> Any:
        t, p, f, l, depth = s  # noqa: E741
        t, p, cut = _partition_pivot(t, p, f, l)
        return t, p, jnp.where(cut <= nth, cut, f), jnp.where(cut <= nth, l, cut), depth - 1

    t, p, f, l, depth = lax.while_loop(lambda s: (s[3] - s[2] > 3) & (s[4] > 0), body,  # noqa: E741
                                       (t, p, zero, zero + n, zero + 2 * (n.bit_length() - 1)))

    def heap(tp: Any) -> Any:  # depth limit reached: heap select, then the nth element to its place
        t, p = _heap_select(*tp, f, zero + nth + 1, l)
        return _swap(t, p, f, zero + nth)

    return lax.cond(l - f > 3, heap, lambda tp: _insertion_sort(*tp, f, l), (t, p))


def _replay_rows(t: Any, k: int, partial: bool, sort: bool) -> Any:
    """CPU's topk indices for each row of the key array t (R, n)."""
    jax = _jax()
    lax, jnp = jax.lax, jax.numpy
    n = t.shape[1]

    def row(tr: Any) -> Any:
        p = jnp.arange(n, dtype=jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        if partial:  # std::partial_sort(begin, begin + k, end)
            tr, p = _heap_select(tr, p, zero, zero + k, zero + n)
            tr, p = _sort_heap(tr, p, zero, zero + k)
        else:
            tr, p = _introselect(tr, p, k - 1)
            if sort and k - 1 > 1:  # std::sort(begin, begin + k - 1): XLA:CPU's unstable sort
                _, head = lax.sort((tr[:k - 1], p[:k - 1]), is_stable=False, num_keys=1)
                p = p.at[:k - 1].set(head)
        return p[:k]

    return lax.map(row, t).astype(jnp.int64)


def _as_rows(x: Any, dim: int) -> tuple[Any, tuple[int, ...]]:
    """x's lines along `dim` (>= 0) as the rows of a 2-D array, and the shape of the other dimensions."""
    jnp = _jax().numpy
    moved = jnp.moveaxis(x, dim, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape[:-1]


def _one_per_row(rows: Any, idx: Any, lead: tuple[int, ...], dim: int, keepdim: bool) -> tuple[Any, Any]:
    """The value at each row's index `idx` and the index, in the input's shape less `dim` (kept with size 1
    with `keepdim`): median.dim's and kthvalue's outputs."""
    jnp = _jax().numpy
    values = jnp.take_along_axis(rows, idx[:, None], axis=1)[:, 0].reshape(lead)
    idx = idx.reshape(lead)
    if keepdim:
        values, idx = jnp.expand_dims(values, dim), jnp.expand_dims(idx, dim)
    return values, idx


@lowers(aten.topk.default)
def _topk(x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Any, Any]:  # noqa: A002
    jax = _jax()
    lax, jnp = jax.lax, jax.numpy
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    rows, lead = _as_rows(x, dim)
    n = rows.shape[1]
    if k == 0 or rows.shape[0] == 0:
        idx = jnp.zeros((rows.shape[0], k), jnp.int64)
    else:
        t = order_key(rows, largest)
        partial = k * 64 <= n
        if not partial and not sorted and k > 1:
            idx = _replay_rows(t, k, partial, sorted)  # nth_element's arrangement: no shortcut
        else:
            best, best_idx = lax.top_k(~t, min(k + 1, n))  # ~t: the smallest keys first, ties lowest index first
            tie = jnp.any(best[:, 1:] == best[:, :-1])
            idx = lax.cond(tie, lambda t, _: _replay_rows(t, k, partial, sorted),
                           lambda _, bi: bi[:, :k].astype(jnp.int64), t, best_idx)
    values = jnp.take_along_axis(rows, idx, axis=1)
    out = (values.reshape(*lead, k), idx.reshape(*lead, k))
    return tuple(jnp.moveaxis(o, -1, dim) for o in out)



def _median_dim(ignore_nan: bool) -> Any:
    """median.dim / nanmedian.dim as CPU's median_with_indices_impl: std::nth_element over the positions at
    (n - 1) / 2 (nanmedian: (n - NaNs - 1) / 2) with the comparator "a < b, or a == b and a's position is
    lower" (nanmedian: or b is NaN and a is not), a total order, so the element found is that rank of the
    stable sort of (value, position), -0.0 equal to 0.0; median returns a row's first NaN if it has one.
    torchax's jnp.quantile-based index took another element of a tie (masked.median's gradient went there)."""
    def lowering(x: Any, dim: int = 0, keepdim: bool = False) -> tuple[Any, Any]:
        jax = _jax()
        jnp = jax.numpy
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        dim %= x.ndim
        rows, lead = _as_rows(x, dim)
        n = rows.shape[1]
        nan = jnp.isnan(rows) if jnp.issubdtype(rows.dtype, jnp.floating) else jnp.zeros(rows.shape, bool)
        count = nan.sum(axis=1).astype(jnp.int32)
        order = jnp.argsort(order_key(rows, False), axis=1, stable=True).astype(jnp.int32)
        nth = _half(n - count - 1) if ignore_nan else jnp.full_like(count, (n - 1) // 2)
        idx = jnp.take_along_axis(order, nth[:, None], axis=1)[:, 0]
        if not ignore_nan:
            idx = jnp.where(count > 0, jnp.argmax(nan, axis=1).astype(jnp.int32), idx)
        else:  # a row of NaNs only: all tie, so the position is nth_element's arrangement of n equal keys at 0
            tied = _introselect(jnp.zeros((n,), jnp.int32), jnp.arange(n, dtype=jnp.int32), 0)[1][0]
            idx = jnp.where(count == n, tied, idx)
        idx = idx.astype(jnp.int64)
        return _one_per_row(rows, idx, lead, dim, keepdim)

    return lowering


lowers(aten.median.dim)(_median_dim(False))
lowers(aten.nanmedian.dim)(_median_dim(True))


def _quick_select(t: Any, k: int) -> Any:
    """The positions of key row `t` after TH's quick_select_template (ATen's SortingUtils.h, Sedgewick's
    partition) at k, with its gt_or_nan comparator as `>` on keys: the median of three of L, (L + R) / 2 and R
    as pivot, i and j scanning past elements below / above it, the active range moved to [i, R] or
    [L, j - 1]. Measured: the index CPU's kthvalue returns on 5,060 tie-heavy integer rows of 1-100."""
    jax = _jax()
    lax, jnp = jax.lax, jax.numpy
    n = t.shape[0]
    one = jnp.ones((), jnp.int32)

    def cswap(t: Any, p: Any, a: Any, b: Any) -> tuple[Any, Any]:  # swap when t[a] > t[b]
        return lax.cond(t[a] > t[b], lambda tp: _swap(*tp, a, b), lambda tp: tp, (t, p))

    def general(s: tuple) -> tuple:
        t, p, lo, hi, _ = s
        t, p = _swap(t, p, (lo + hi) >> 1, lo + 1)
        t, p = cswap(t, p, lo + 1, hi)
        t, p = cswap(t, p, lo, hi)
        t, p = cswap(t, p, lo + 1, lo)
        piv = t[lo]

        def scan(s: tuple) -> tuple:
            t, p, i, j, _ = s
            i = lax.while_loop(lambda i: piv > t[i], lambda i: i + 1, i + 1)
            j = lax.while_loop(lambda j: t[j] > piv, lambda j: j - 1, j - 1)
            stop = j < i
            t, p = lax.cond(stop, lambda tp: tp, lambda tp: _swap(*tp, i, j), (t, p))
            return t, p, i, j, stop

        t, p, i, j, _ = lax.while_loop(lambda s: ~s[4], scan, (t, p, lo + 1, hi, jnp.zeros((), bool)))
        t, p = _swap(t, p, lo, j)
        return t, p, jnp.where(j <= k, i, lo), jnp.where(j >= k, j - 1, hi), jnp.zeros((), bool)

    def step(s: tuple) -> tuple:
        t, p, lo, hi, _ = s
        pair = lambda s: (*cswap(s[0], s[1], s[2], s[3]), s[2], s[3], jnp.ones((), bool))  # noqa: E731
        done = lambda s: (*s[:4], jnp.ones((), bool))  # noqa: E731
        branch = jnp.where(hi <= lo, 0, jnp.where(hi == lo + 1, 1, 2))
        return lax.switch(branch, [done, pair, general], s)

    start = (t, jnp.arange(n, dtype=jnp.int32), 0 * one, (n - 1) * one, jnp.zeros((), bool))
    return lax.while_loop(lambda s: ~s[4], step, start)[1]


@lowers(aten.kthvalue.default)
def _kthvalue(x: Any, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Any, Any]:
    """CPU's kthvalue: each row's positions through quick_select_template at k - 1 (_quick_select), the value
    and position found there; which of several equal values' positions it returns is that algorithm's
    (torchax's sort-based one took another: integer kthvalue's indices differed on ties)."""
    jax = _jax()
    jnp = jax.numpy
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    rows, lead = _as_rows(x, dim)
    n = rows.shape[1]
    idx = jax.lax.map(lambda tr: _quick_select(tr, k - 1)[k - 1], order_key(rows, False)).astype(jnp.int64)
    return _one_per_row(rows, idx, lead, dim, keepdim)
