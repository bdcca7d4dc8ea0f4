"""Numerics: how a `tpu` output is compared with the CPU baseline. The tolerances live in ONE place,
harness/sweep/tolerances.yaml (`defaults:` per precision and dtype, `entries:` per entry), read by
harness/sweep/tolerances.py into a `Tolerance` (its names are importable from here too); docs/numerics.md
explains the rule and the measurements behind the numbers.

For each output tensor (named by `output_tensors`), with `ref` the CPU baseline, `res` the `tpu` result,
`fp64` the float64 CPU reference and `s` the tensor's own scale = RMS of fp64 (of ref without a reference):

- max_abs_err  = max |res - ref|
- max_rel_err  = max |res - ref| / max |ref|                 (worst tensor)
- cosine       = cosine similarity of the flattened tensors   (lowest over tensors)
- rmse_ratio   = rmse(fp64, res) / rmse(fp64, ref)            (worst tensor)
- rel_rmse     = rmse(fp64, res) / s                          (worst tensor: the error in units of the tensor)

A tensor matches when, with a valid float64 reference, PyTorch's fp64 RMSE rule (`torch._dynamo.utils.same`)
holds with a floor scaled to the tensor:
    rmse(fp64, res) <= multiplier * rmse(fp64, ref) + floor * s
(multiplier 2 for float32 results, 3 for bfloat16/float16 results and tensors of fewer than 1,000 elements,
as in same()). Without a valid reference, a scale-aware allclose decides:
    |res - ref| <= tol * |ref| + tol * s      elementwise, non-finite values in the same places
so the absolute floor (tol * s) only matters for elements near zero against the tensor's scale, and a
tensor of magnitude 1e-7 is judged as strictly as one of magnitude 1. Unlike same(), a passing allclose
never short-cuts the fp64 rule: when the reference is valid it always decides, so a huge rmse_ratio is
never hidden (DPT's 1e-7 depth maps passed allclose with rmse_ratio 4,900).

The float64 reference is valid when it agrees with the CPU baseline to within the baseline's own noise:
    rmse(fp64, ref) <= reference * s   for every tensor  (`reference_valid`)
Otherwise (e.g. a run that drew different random numbers in float64) it is not used.

Data-dependent outputs (`data_dependent:` names, e.g. keypoints, scores, descriptors of a detector): float32
noise may flip a threshold and change how many detections there are. When their shapes differ from the
baseline's, detections are matched by location (the first name is the location tensor, the others are per
detection along dim 1): matched detections are compared by the rule, and at most `max_unmatched` of them
(a fraction) may be missing on either side. The dense outputs (hidden states, computed before thresholding)
are compared as usual.

At "medium" and "high" the baseline computes the tpu's own rounding (harness/sweep/emulate.py), so the two
agree far more closely than either agrees with float64: they differ only where float32 noise (an erf or a
reduction one ulp apart) flips a bfloat16 rounding, a small fraction of the rounding error itself. With a
valid reference, the `agree:` tolerance then also bounds
    rmse(ref, res) <= agree * rmse(fp64, ref) + AGREE_FLOOR * s
(a 1% matmul error hides under the fp64 rule's 3x bfloat16 allowance on some models, not under this; both
sides of the bound grow together with depth, so it holds at real size too).

Elementwise differences at or below the compared dtype's smallest normal number (torch.finfo.tiny) are
flush-to-zero, not error (`flushed`): the stand-in flushes float32 subnormals as a TPU does, CPU keeps them.

With `cosine: true` (per-entry override) a tensor matches when allclose or cosine >= 0.99, `same()`'s
`cos_similarity` rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace  # noqa: F401 (callers vary a Tolerance as numerics.replace)

# the tolerances themselves (read from tolerances.yaml) live in tolerances.py; callers import them from here too
from harness.sweep.tolerances import (DEFAULT_TOLERANCES_FILE, TOLERANCES, Overrides, Tolerance,  # noqa: F401
                                      load_overrides, tolerance_for)

MULTIPLIER_FLOAT32 = 2.0  # same(): rmse multiplier for float32 results
MULTIPLIER_LOW_PRECISION = 3.0  # same(): for bfloat16/float16 results, and for tensors < SMALL_NUMEL
SMALL_NUMEL = 1000
AGREE_FLOOR = 1e-5  # float32 noise, in units of the tensor's scale (the "highest" floor)
COSINE_THRESHOLD = 0.99  # same(cos_similarity=True)


@dataclass
class Comparison:
    match: bool
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    cosine: float = math.nan
    rmse_ratio: float = math.nan
    rel_rmse: float = math.nan
    reason: str = ""  # why it does not match: the worst tensor and the rule it broke
    agree_rmse: float = math.nan  # rmse(baseline, tpu) / scale, worst tensor (not a row column)
    notes: str = ""  # what the rule tolerated (threshold flips of data-dependent outputs)

    def metrics(self) -> dict:
        return {
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "cosine": self.cosine,
            "rmse_ratio": self.rmse_ratio,
            "rel_rmse": self.rel_rmse,
        }


def _finite(t):
    """t's finite elements (flattened), or t itself when all are: a boolean-mask gather is a nonzero and a
    copy, the most expensive step of the rule on the all-finite tensors it nearly always sees (the train
    phase judges every gradient and weight: ~2400 tensors for 7 small entries, 2.5 CPU-s of 22)."""
    import torch

    fin = torch.isfinite(t)
    return t if bool(fin.all()) else t[fin]


def _rmse(a, b) -> float:
    import torch

    d = _finite(a.double() - b.double())
    return float(torch.sqrt(torch.mean(torch.square(d)))) if d.numel() else 0.0


def _rms(a) -> float:
    import torch

    a = _finite(a.double())
    return float(torch.sqrt(torch.mean(torch.square(a)))) if a.numel() else 0.0


def tensor_scale(ref, fp64=None) -> float:
    """The scale a tensor's errors are measured in: the RMS of its float64 reference (else of the baseline)."""
    usable = fp64 is not None and tuple(fp64.shape) == tuple(ref.shape)
    return _rms(fp64 if usable else ref)


def multiplier(tol: Tolerance, res, fp64) -> float:
    """How many times the baseline's error against float64 a result of `res`'s dtype and size may have."""
    import torch

    if tol.multiplier is not None:
        return tol.multiplier
    m = MULTIPLIER_LOW_PRECISION if res.dtype in (torch.float16, torch.bfloat16) else MULTIPLIER_FLOAT32
    if fp64.numel() < SMALL_NUMEL or (res.ndim == 4 and res.shape[-1] == res.shape[-2] == 1) or tol.tol >= 2e-2:
        m = MULTIPLIER_LOW_PRECISION
    return m


def error_bound(tol: Tolerance, baseline, fp64) -> float:
    """The largest rmse(fp64, result) the rule accepts for a tensor whose baseline is `baseline` and float64
    reference `fp64` (same shape): multiplier x the baseline's own error + the floor x the tensor's scale. The
    train phase's weight allowances (train_weights.py) start from it."""
    f, b = fp64.detach().double(), baseline.detach().double()
    return multiplier(tol, b, f) * _rmse(f, b) + tol.floor_value * tensor_scale(b, f)


def flushed(ref, res, dtype):
    """`res` (float64) with each element that is within `dtype`'s smallest normal number (torch.finfo.tiny:
    1.2e-38 for float32 and bfloat16) of `ref`'s taken as `ref`'s, for the dtypes XLA:CPU flushes: float32,
    bfloat16 and float64 subnormal inputs and results become zero, as real TPUs do, while CPU PyTorch keeps them (docs/device.md): a
    difference that small is flush-to-zero, not an error (DeepSeek-OCR2's SAM encoder: a qkv weight gradient
    of RMS 4e-39). It is below every tolerance on a tensor of normal scale, so only tensors that are
    themselves subnormal-sized are judged differently."""
    import torch

    # float16 is computed in float32, where its subnormals are normal numbers: tpu keeps them (measured), and
    # float16's tiny (6.1e-5) would excuse a 5% error on a tensor of scale 1e-3.
    if dtype not in (torch.float32, torch.bfloat16, torch.float64):
        return res
    tiny = torch.finfo(dtype).tiny
    near = (res - ref).abs() <= tiny
    return torch.where(near, ref, res) if bool(near.any()) else res


def _nanmax(values: list[float], default: float = math.nan) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return max(vals) if vals else default


def _nonfinite_agree(r, s) -> bool:
    import torch

    fr, fs = torch.isfinite(r), torch.isfinite(s)
    if not torch.equal(fr, fs):
        return False
    return bool(torch.equal(r[~fr].nan_to_num(0.0), s[~fs].nan_to_num(0.0)))  # inf vs -inf differ; NaN = NaN


def scaled_allclose(r, s, tol: float, scale: float) -> bool:
    """|s - r| <= tol * |r| + tol * scale elementwise on finite values; non-finite values in the same places."""
    if not _nonfinite_agree(r, s):
        return False
    import torch

    fin = torch.isfinite(r)
    if not bool(fin.all()):
        r, s = r[fin], s[fin]
    return bool(((s - r).abs() <= tol * r.abs() + tol * scale).all())


def compare_tensor(name: str, ref, res, fp64, tol: Tolerance) -> tuple[bool, dict, str]:
    """Compare one tensor. Returns (match, metrics, reason). `fp64` None: no (valid) reference."""
    import torch

    if tuple(ref.shape) != tuple(res.shape):
        return False, {}, f"{name}: shape {tuple(res.shape)} != baseline {tuple(ref.shape)}"
    r, s = ref.detach().cpu().double(), res.detach().cpu().to(ref.dtype).double()
    s = flushed(r, s, ref.dtype)
    m: dict[str, float] = {}
    if r.numel() == 0:
        return True, {"max_abs_err": 0.0, "max_rel_err": 0.0, "cosine": 1.0, "rmse_ratio": math.nan,
                      "rel_rmse": 0.0}, ""
    diff = (s - r).abs()
    m["max_abs_err"] = float(diff.max()) if not diff.isnan().all() else math.nan
    peak = float(r.abs().nan_to_num(0.0).max())
    m["max_rel_err"] = m["max_abs_err"] / peak if peak > 0 else (0.0 if m["max_abs_err"] == 0 else math.inf)
    if bool((r.isnan() & s.isnan()).all()):
        m["cosine"] = 1.0
    elif torch.equal(r.nan_to_num(0.0), s.nan_to_num(0.0)) and not bool((r.isnan() ^ s.isnan()).any()):
        m["cosine"] = 1.0  # identical (also all zeros, where cosine_similarity gives 0)
    else:
        m["cosine"] = float(torch.nn.functional.cosine_similarity(r.nan_to_num(0.0).flatten(),
                                                                  s.nan_to_num(0.0).flatten(), dim=0, eps=1e-12))
    has_ref = fp64 is not None and tuple(fp64.shape) == tuple(ref.shape)
    scale = tensor_scale(r, fp64.detach().cpu().double() if has_ref else None)
    m["rmse_ratio"], m["rel_rmse"] = math.nan, math.nan
    if has_ref:
        f = fp64.detach().cpu().double()
        ref_err, res_err = _rmse(f, r), _rmse(f, s)
        if ref_err > 0:
            m["rmse_ratio"] = res_err / ref_err
        else:
            m["rmse_ratio"] = 0.0 if res_err == 0 else math.inf
        m["rel_rmse"] = res_err / scale if scale > 0 else (0.0 if res_err == 0 else math.inf)
    else:
        res_err = _rmse(r, s)
        m["rel_rmse"] = res_err / scale if scale > 0 else (0.0 if res_err == 0 else math.inf)
    m["agree_rmse"] = _rmse(r, s) / scale if scale > 0 else (0.0 if m["max_abs_err"] == 0 else math.inf)
    allclose = scaled_allclose(r, s, tol.tol, scale)
    if tol.cosine:
        ok = allclose or m["cosine"] >= COSINE_THRESHOLD
        return ok, m, "" if ok else f"{name}: cosine {m['cosine']:.5f} < {COSINE_THRESHOLD}"
    if has_ref and tol.agree is not None and _nonfinite_agree(r, s) \
            and m["agree_rmse"] * scale > tol.agree * ref_err + AGREE_FLOOR * scale:
        return False, m, (f"{name}: rmse(cpu,tpu)={m['agree_rmse']:.3g} x scale > {tol.agree:g}*rmse(fp64,cpu)="
                          f"{ref_err / scale if scale else math.inf:.3g} x scale + {AGREE_FLOOR:g} (the baseline "
                          f"computes the tpu's rounding)")
    if not has_ref:
        ok = allclose
        return ok, m, "" if ok else (f"{name}: not allclose at tol={tol.tol:g} relative to the tensor's scale "
                                     f"{scale:.3g} (max abs err {m['max_abs_err']:.3g}), no valid fp64 reference")
    if not _nonfinite_agree(r, s):
        return False, m, f"{name}: non-finite values differ from the baseline's"
    mult = multiplier(tol, res.detach().cpu(), fp64)
    bound = mult * ref_err + tol.floor_value * scale
    ok = res_err <= bound
    reason = "" if ok else (
        f"{name}: rmse(fp64,tpu)={res_err:.3g} > {mult:g}*rmse(fp64,cpu)={ref_err:.3g} + "
        f"{tol.floor_value:g}*scale={tol.floor_value * scale:.3g} (scale {scale:.3g}, rel rmse {m['rel_rmse']:.3g})"
    )
    return ok, m, reason


def reference_valid(ref: dict, fp64: dict | None, tol: Tolerance) -> tuple[bool, str]:
    """Does the float64 reference agree with the CPU baseline to within the baseline's own noise? (valid, why
    not). A reference that drew other random numbers, or took another code path, compares nothing."""
    if not fp64:
        return False, "no float64 reference"
    checked = 0
    for name, r in ref.items():
        f = fp64.get(name)
        if _is_data_dependent(name, tol) and (f is None or tuple(f.shape) != tuple(r.shape)):
            continue  # a threshold flipped in float64: the dense outputs say whether the reference is sound
        if f is None or tuple(f.shape) != tuple(r.shape):
            return False, f"{name}: no float64 counterpart of the same shape"
        checked += 1
        scale = tensor_scale(r, f)
        err = _rmse(f.double(), r.double())
        if err > tol.reference * scale:
            return False, f"{name}: rmse(fp64, cpu) = {err / scale if scale else math.inf:.3g} x scale > {tol.reference:g}"
    return (True, "") if checked else (False, "no float64 output of the baseline's shapes")


def _is_data_dependent(name: str, tol: Tolerance) -> bool:
    return any(name == n or name.startswith(n + ".") for n in tol.data_dependent)


def _real_rows(out: dict, names: list[str], b: int):
    """Indices of batch element b's detections that are not padding (padding rows are zero in every
    data-dependent tensor: detectors pad each image's detections to the batch's largest count)."""
    import torch

    n = out[names[0]].shape[1]
    real = torch.zeros(n, dtype=torch.bool)
    for name in names:
        t = out[name]
        if t.ndim >= 2 and t.shape[1] == n:
            real |= t[b].reshape(n, -1).ne(0).any(dim=1)
    return torch.nonzero(real).flatten()


def _match_detections(ref: dict, res: dict, fp64: dict | None, tol: Tolerance, names: list[str]):
    """Data-dependent tensors whose shapes differ: pair detections by location (the first data-dependent
    name present), compare paired rows by the rule, allow `max_unmatched` of them unpaired on either side.
    Returns (ok, per-tensor metrics list, reason, note)."""
    import torch

    loc = next((n for n in tol.data_dependent if n in names), names[0])
    rl, sl = ref[loc].detach().double(), res[loc].detach().double()
    if rl.ndim < 2 or sl.ndim != rl.ndim or rl.shape[0] != sl.shape[0]:
        return False, [], f"{loc}: shapes {tuple(sl.shape)} and {tuple(rl.shape)} cannot be matched", ""
    scale = tensor_scale(rl)
    near = tol.tol * max(scale, 1e-30) + 1e-12
    metrics, reasons, unmatched, total = [], [], 0, 0
    for b in range(rl.shape[0]):
        keep_r, keep_s = _real_rows(ref, names, b), _real_rows(res, names, b)
        a, c = rl[b][keep_r].reshape(len(keep_r), -1), sl[b][keep_s].reshape(len(keep_s), -1)
        total += max(a.shape[0], c.shape[0])
        if a.numel() == 0 or c.numel() == 0:
            unmatched += max(a.shape[0], c.shape[0])
            continue
        dist = torch.cdist(a, c)
        best, j = dist.min(dim=1)
        mutual = dist.argmin(dim=0)[j] == torch.arange(a.shape[0])  # one-to-one: mutual nearest neighbours
        pair_i = torch.nonzero((best <= near) & mutual).flatten()
        pair_j = j[pair_i]
        unmatched += max(a.shape[0], c.shape[0]) - len(pair_i)
        for n in names:
            x, y = ref[n][b], res[n][b]
            if x.ndim == 0 or y.ndim == 0 or x.shape[0] != rl.shape[1] or y.shape[0] != sl.shape[1]:
                continue
            f = (fp64 or {}).get(n)
            f = f[b][keep_r][pair_i] if f is not None and tuple(f.shape) == tuple(ref[n].shape) else None
            ok, m, reason = compare_tensor(f"{n}[{b}] (matched)", x[keep_r][pair_i], y[keep_s][pair_j], f, tol)
            metrics.append(m)
            if not ok:
                reasons.append(reason)
    frac = unmatched / total if total else 0.0
    note = f"{loc}: {unmatched} of {total} detections unmatched (threshold flips tolerated up to {tol.max_unmatched:g})"
    if frac > tol.max_unmatched:
        reasons.append(f"{loc}: {unmatched} of {total} detections unmatched > {tol.max_unmatched:g}")
    return not reasons, metrics, "; ".join(reasons), note


def _compare_permuted(name: str, ref, res, tol: Tolerance) -> tuple[bool, dict, str, str]:
    """A tensor whose dim 1 was selected by a ranking with near-ties in the baseline (harness/sweep/ties.py):
    pair its dim-1 rows one-to-one (mutual nearest neighbours) per batch element and compare paired rows by
    the allclose rule (the float64 run broke the ties its own way too); at most `max_unmatched` rows may be
    unpaired (a tie at the selection's boundary swaps a member). A wrong value still fails: paired rows are
    compared, and rows that pair with nothing count against the limit."""
    import torch

    r, s = ref.detach().double(), res.detach().double()
    n = r.shape[1]
    xs, ys, unmatched = [], [], 0
    for b in range(r.shape[0]):
        a, c = r[b].reshape(n, -1), s[b].reshape(n, -1)
        dist = torch.cdist(a.nan_to_num(0.0), c.nan_to_num(0.0))
        j = dist.argmin(dim=1)
        mutual = dist.argmin(dim=0)[j] == torch.arange(n)
        i = torch.nonzero(mutual).flatten()
        xs.append(r[b][i])
        ys.append(s[b][j[i]])
        unmatched += n - len(i)
    ok, m, reason = compare_tensor(f"{name} (up to tie order)", torch.cat(xs), torch.cat(ys), None, tol)
    total = n * r.shape[0]
    note = f"{name}: compared up to tie order along dim 1 ({unmatched} of {total} rows unpaired)"
    if unmatched > tol.max_unmatched * total:
        ok, reason = False, f"{name}: {unmatched} of {total} rows pair with none up to tie order"
    return ok, m, reason, note


def compare_outputs(ref: dict, res: dict, fp64: dict | None, tol: Tolerance,
                    tie_sizes: frozenset[int] = frozenset()) -> Comparison:
    """Compare named output tensors (dicts from `output_tensors`). `fp64` None: no valid reference.
    `tie_sizes`: sizes of ranking selections that had near-ties in the baseline (ties.TieWatch); a failing
    tensor whose dim 1 has such a size is compared again up to a permutation of that dim."""
    if set(ref) != set(res):
        missing, extra = sorted(set(ref) - set(res)), sorted(set(res) - set(ref))
        return Comparison(False, reason=f"output names differ: missing {missing[:5]}, extra {extra[:5]}")
    if not ref:
        return Comparison(True, reason="no floating output tensors to compare")
    ok_all, reasons, notes = True, [], []
    per: list[dict] = []
    flipped = [n for n in ref if _is_data_dependent(n, tol) and tuple(ref[n].shape) != tuple(res[n].shape)]
    if flipped:
        group = [n for n in ref if _is_data_dependent(n, tol)]
        ok, ms, reason, note = _match_detections(ref, res, fp64, tol, group)
        per += ms
        notes.append(note)
        if not ok:
            ok_all = False
            reasons.append(reason)
    for name in ref:
        if flipped and _is_data_dependent(name, tol):
            continue
        ok, m, reason = compare_tensor(name, ref[name], res[name], (fp64 or {}).get(name), tol)
        if not ok and ref[name].ndim >= 2 and ref[name].shape[1] in tie_sizes \
                and tuple(ref[name].shape) == tuple(res[name].shape):
            ok, m, reason, note = _compare_permuted(name, ref[name], res[name], tol)
            notes.append(note)
        if not ok:
            ok_all = False
            reasons.append(reason)
        per.append(m)
    cos_vals = [m["cosine"] for m in per if not math.isnan(m.get("cosine", math.nan))]
    return Comparison(
        ok_all,
        max_abs_err=_nanmax([m.get("max_abs_err", math.nan) for m in per]),
        max_rel_err=_nanmax([m.get("max_rel_err", math.nan) for m in per]),
        cosine=min(cos_vals) if cos_vals else math.nan,
        rmse_ratio=_nanmax([m.get("rmse_ratio", math.nan) for m in per]),
        rel_rmse=_nanmax([m.get("rel_rmse", math.nan) for m in per]),
        agree_rmse=_nanmax([m.get("agree_rmse", math.nan) for m in per]),
        reason="; ".join(reasons)[:300],
        notes="; ".join(notes)[:300],
    )


ROUNDING_DOMINATED = 3.0  # the fp64 rule's factor: tpu may be this many times as far from float64 as the baseline


def rounding_dominated(ref: dict, res: dict, fp64: dict | None, tol: Tolerance, alt: dict | None = None) -> str:
    """An output whose own rounding puts the CPU baseline more than tol.reference of its scale from float64
    cannot be judged: any two roundings of it differ by about as much as a wrong number would. At "medium"
    that is bfloat16 rounding through a deep or ill-conditioned model (MobileNetV2 1.1x scale, Emu3 0.2x); at
    "highest" float32 rounding through a chaotic one (the RT-DETR family's query selection: 0.47x scale, with
    no near-tie big enough for ties.TieWatch). Returns why the row is such a case ('' when it is not): the
    float64 reference was refused for that reason and tpu is no farther from float64 than ROUNDING_DOMINATED
    times the baseline. The row is then an uninformative pass, out of the numerics denominators and listed as
    such, never a false fail_accuracy; a tpu farther off still fails.

    `alt`: a second float32 baseline from inputs nudged by one rounding (train.nudged). One run is one sample
    of where float32 lands (BLIP-2's layer-0 qkv weight: CPU 2.9e-4 x scale from float64, nudged 0.25, tpu
    1.5e-3): each tensor's spread is then the largest distance among float64, baseline and `alt`. A tensor
    float32 determines well keeps a spread of float32 noise, so a wrong value there still fails."""
    if not fp64 or set(ref) != set(res):
        return ""
    noisy, worst = [], 0.0
    for name, r in ref.items():
        f, t = fp64.get(name), res[name]
        if f is None or tuple(f.shape) != tuple(r.shape) or tuple(t.shape) != tuple(r.shape):
            return ""
        scale = tensor_scale(r, f)
        base, dev = _rmse(f, r), _rmse(f, t)
        a = (alt or {}).get(name)
        spread = max(base, _rmse(f, a), _rmse(r, a)) if a is not None and tuple(a.shape) == tuple(r.shape) else base
        if dev > ROUNDING_DOMINATED * spread + 1e-5 * scale:
            return ""
        if base > tol.reference * scale:
            noisy.append(name)
            worst = max(worst, base / scale if scale else math.inf)
    if not noisy:
        return ""
    return (f"rounding-dominated: the baseline's own rounding is {worst:.3g} x scale from float64 "
            f"({', '.join(noisy[:3])}); tpu within {ROUNDING_DOMINATED:g}x of "
            + ("float32's spread (the baseline and a run nudged by one rounding)" if alt else "it"))
