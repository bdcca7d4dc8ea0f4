"""Float32's spread for a train row the rule fails against a valid float64 reference (harness/sweep/train.py).

One float32 run can land near float64 by luck where later Adam steps amplify rounding, and the rule's factor
times its distance then fails a correct tpu (BioGPT's layer-1 q_proj.bias after 3 steps: CPU 2.2e-7 from
float64 on one element, tpu 3.8e-7, five CPU runs from weights nudged one ulp 2.5e-8..3.1e-7). Each nudged
run (train.nudged) is another sample of where float32 lands; `within_spread` judges each failing tensor
against the largest distance among float64, the baseline and the samples.

How many samples: one, then more (up to len(NUDGE_SEEDS)) only while the row is near its bound (`near_bound`:
every failing tensor within NEAR_BOUND times what the spread so far admits), since a sample that lands near
float64 too understates the spread. A wrong backward or optimizer puts a tensor float32 determines far
beyond a spread of float32 noise, not near it: it costs one sample and still fails however many are taken
(tests/harness/sweep/test_train_spread.py).

The flush sample: a TPU flushes float32 subnormals to zero, products included, and so does the stand-in;
CPU PyTorch keeps them. A gradient summed from many subnormal products (GotOcr2's SAM relative-position
table: float64 RMS 1.9e-37, 16x float32's smallest normal) is then off on tpu by up to the number of terms
times that smallest normal, beyond numerics.flushed's elementwise allowance, while CPU is exact to 1e-43. Such a
tensor is decided by flushing, not by the backward: when a failing tensor's float64 scale is below FLUSH_REACH,
the first sample is the CPU baseline run with flush-to-zero on (`flush_to_zero`: float32 as a TPU computes it,
no nudge), and the row passes as uninformative only if tpu is within the rule's factor of that spread too. A
tensor of normal size is never near it (flushing changes nothing there), so the flush run is not even made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from harness.sweep import numerics, train_weights

# The nudged runs' coin seeds: any fixed values, one per sample of float32's rounding (24: the first sample's,
# as it was with one).
NUDGE_SEEDS = (24, 25, 26)
# A row whose every failing tensor is within this many times the bound float32's spread so far admits is near
# its bound: one more sample may widen the spread enough. Beyond it, a second sample as far from float64 as
# the first would not excuse it either.
NEAR_BOUND = 3.0
# The spread sample run with flush-to-zero (an index beside NUDGE_SEEDS' 0, 1, 2: harness/sweep/runner.py).
FLUSH = "flush"
# Below this float64 scale (2**-100, 7.9e-31) a tensor can be summed from products below float32's smallest
# normal (1.2e-38) in a contraction of a few million terms, and flushing them moves it by more than float32's
# own rounding: the flush sample is taken. Real gradients of these models are many orders of magnitude larger
# (the smallest judged in the full sweep that is not such a branch: ~1e-12).
FLUSH_REACH = 2.0 ** -100


class FlushUnsupported(RuntimeError):
    """torch.set_flush_denormal is not available on this CPU (x86 with SSE3 and AArch64 have it)."""


@contextlib.contextmanager
def flush_to_zero() -> Iterator[None]:
    """CPU float32 with subnormals flushed to zero, inputs and results, as a TPU computes. One thread: the
    flag is per thread (x86 MXCSR, ARM FPCR), and PyTorch's pool threads would keep theirs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if not torch.set_flush_denormal(True):
            raise FlushUnsupported("torch.set_flush_denormal(True) is not supported on this CPU")
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def flushing(context: Callable[[], Any] | None) -> Callable[[], contextlib.ExitStack]:
    """`context` (a factory of context managers, as train.run_steps takes) with flush_to_zero inside too."""
    def ctx() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(flush_to_zero())
        if context is not None:
            stack.enter_context(context())
        return stack
    return ctx


def sample_seed(i: int | str) -> int | str:
    """The i-th spread sample's argument to train.nudged: NUDGE_SEEDS[i], or FLUSH."""
    return FLUSH if i == FLUSH else NUDGE_SEEDS[i]


def _samples(spread: dict | Sequence[dict] | None) -> list[dict]:
    if isinstance(spread, dict):
        return [spread]
    return [s for s in (spread or ()) if s]


def _ratios(ref: dict, res: dict, fp64: dict, tol: numerics.Tolerance, allow: dict,
            samples: list[dict]) -> list[tuple[str, float, float, float]] | None:
    """(name, dev / bound, dev, spread) for each tensor the rule fails, the better of raw and both sides shrunk
    (train_weights.shrink): dev = rmse(fp64, tpu), spread = the largest rmse among float64, the baseline and
    the samples, bound = the rule's multiplier x spread + floor. None when a sample lacks a failing tensor."""
    base, judged = train_weights.shrink(ref, fp64, allow), train_weights.shrink(res, fp64, allow)
    alts = [train_weights.shrink(s, fp64, allow) for s in samples]
    rm, out = numerics._rmse, []
    for n in _failing(base, judged, fp64, tol):
        f = fp64[n]
        if any(n not in s or tuple(s[n].shape) != tuple(f.shape) for s in samples):
            return None
        floor = tol.floor_value * numerics.tensor_scale(ref[n], f)
        mult = numerics.multiplier(tol, res[n], f)  # the rule's own factor, on the spread for the baseline's distance
        best = None
        for r, t, ss in ((ref, res, samples), (base, judged, alts)):
            points = [f, r[n], *(s[n] for s in ss)]
            spread = max(rm(a, b) for i, a in enumerate(points) for b in points[i + 1:])
            dev = rm(f, t[n])
            ratio = dev / (mult * spread + floor) if mult * spread + floor > 0 else float("inf")
            if best is None or ratio < best[1]:
                best = (n, ratio, dev, spread)
        out.append(best)
    return out


def _failing(base: dict, judged: dict, fp64: dict, tol: numerics.Tolerance) -> Iterator[str]:
    """The tensors the rule fails (both sides shrunk as judge does)."""
    for n in base:
        f = fp64.get(n)
        if f is not None and n in judged and not numerics.compare_tensor(n, base[n], judged[n], f, tol)[0]:
            yield n


def flush_reach(ref: dict, res: dict, fp64: dict, tol: numerics.Tolerance, allow: dict) -> bool:
    """Some tensor the rule fails has a float64 scale below FLUSH_REACH: the flush sample may explain it."""
    base, judged = train_weights.shrink(ref, fp64, allow), train_weights.shrink(res, fp64, allow)
    return any(numerics.tensor_scale(fp64[n]) < FLUSH_REACH for n in _failing(base, judged, fp64, tol))


def within_spread(ref: dict, res: dict, fp64: dict, tol: numerics.Tolerance, allow: dict,
                  spread: dict | Sequence[dict] | None, flushed: bool = False) -> str:
    """A row the rule fails against a valid float64 reference, judged again on each failing tensor against
    float32's spread: the largest distance among float64, the baseline `ref` and the nudged runs `spread` (one
    or a list). A tensor passes within the rule's multiplier x its spread + the floor, raw or both sides shrunk
    (as rounding_dominated); a tensor float32 determines keeps a noise-sized spread, so a wrong gradient or
    update still fails. Why the row passes so ('' when a failing tensor is beyond its spread): an
    uninformative pass, as rounding_dominated. `flushed`: the first sample is the flush run (FLUSH)."""
    samples = _samples(spread)
    ratios = _ratios(ref, res, fp64, tol, allow, samples) if samples else None
    if not ratios or any(r > 1.0 for _, r, _, _ in ratios):
        return ""
    shown = [f"{n} tpu {dev:.3g}, spread {sp:.3g}" for n, _, dev, sp in ratios]
    nudges = len(samples) - flushed
    runs = ", ".join((["a run with subnormals flushed to zero as on a TPU"] if flushed else [])
                     + ([] if not nudges else ["run nudged one ulp" if nudges == 1 else f"{nudges} runs nudged one ulp"]))
    # figures first: messages are cut at errors.MESSAGE_LIMIT
    return (f"float32-spread: rmse from float64 {shown[0]}" + (f" (+{len(shown) - 1} tensors)" if len(shown) > 1
                                                                else "")
            + f"; within the rule's factor x float32's spread (baseline, {runs}), not the baseline's")


def near_bound(ref: dict, res: dict, fp64: dict, tol: numerics.Tolerance, allow: dict,
               spread: dict | Sequence[dict] | None) -> bool:
    """Every tensor the rule fails is within NEAR_BOUND times what float32's spread so far admits: another
    nudged run may excuse the row (within_spread), so it is worth making."""
    ratios = _ratios(ref, res, fp64, tol, allow, _samples(spread))
    return bool(ratios) and max(r for _, r, _, _ in ratios) <= NEAR_BOUND
