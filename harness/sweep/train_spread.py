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
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.sweep import numerics, train_weights

# The nudged runs' coin seeds: any fixed values, one per sample of float32's rounding (24: the first sample's,
# as it was with one).
NUDGE_SEEDS = (24, 25, 26)
# A row whose every failing tensor is within this many times the bound float32's spread so far admits is near
# its bound: one more sample may widen the spread enough. Beyond it, a second sample as far from float64 as
# the first would not excuse it either.
NEAR_BOUND = 3.0


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
    for n in ref:
        f = fp64.get(n)
        if f is None or n not in res or numerics.compare_tensor(n, base[n], judged[n], f, tol)[0]:
            continue
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


def within_spread(ref: dict, res: dict, fp64: dict, tol: numerics.Tolerance, allow: dict,
                  spread: dict | Sequence[dict] | None) -> str:
    """A row the rule fails against a valid float64 reference, judged again on each failing tensor against
    float32's spread: the largest distance among float64, the baseline `ref` and the nudged runs `spread` (one
    or a list). A tensor passes within the rule's multiplier x its spread + the floor, raw or both sides shrunk
    (as rounding_dominated); a tensor float32 determines keeps a noise-sized spread, so a wrong gradient or
    update still fails. Why the row passes so ('' when a failing tensor is beyond its spread): an
    uninformative pass, as rounding_dominated."""
    samples = _samples(spread)
    ratios = _ratios(ref, res, fp64, tol, allow, samples) if samples else None
    if not ratios or any(r > 1.0 for _, r, _, _ in ratios):
        return ""
    shown = [f"{n} tpu {dev:.3g}, spread {sp:.3g}" for n, _, dev, sp in ratios]
    runs = "run nudged one ulp" if len(samples) == 1 else f"{len(samples)} runs nudged one ulp"
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
