"""Numerics: how a `tpu` output is compared with the CPU baseline, and every tolerance in ONE place.

For each output tensor (named by `output_tensors`), with `ref` the CPU baseline, `res` the `tpu` result and
`fp64` the float64 CPU reference:

- max_abs_err  = max |res - ref|
- max_rel_err  = max |res - ref| / max |ref|                 (worst tensor)
- cosine       = cosine similarity of the flattened tensors   (lowest over tensors)
- rmse_ratio   = rmse(fp64, res) / rmse(fp64, ref)            (worst tensor)

A tensor matches (PyTorch's `torch._dynamo.utils.same`, the rule its dynamo benchmark harness uses) when
    allclose(ref, res, atol=tol, rtol=tol, equal_nan=True)
or, failing that and when a float64 reference exists,
    rmse(fp64, res) <= multiplier * rmse(fp64, ref) + tol / 10
with multiplier 2 for float32 results, 3 for bfloat16/float16 results and 3 for tensors of fewer than 1,000
elements (noise dominates there), exactly as in `same()`. An entry matches when every tensor matches, the
output names agree and shapes agree. With `cosine: true` (per-entry override) a tensor matches when
allclose or cosine >= 0.99, `same()`'s `cos_similarity` rule.

`tol` depends on the `tpu` float32 matmul precision and the model dtype (TOLERANCES below): "highest" is full
float32, "high" three bfloat16 passes, "medium" one bfloat16 pass (bfloat16 rounding of every matmul input).
Per-entry overrides live in a YAML file (`--tolerances`, default `harness/sweep/tolerances.yaml`):

    entries:
      "transformers/foo/FooModel":     # an entry id or an fnmatch pattern
        tol: 1.0e-3                     # replaces the table's tol
        multiplier: 3.0                 # replaces same()'s multiplier
        cosine: true                    # use the cosine rule
        skip: "reason"                  # the entry is recorded as `skipped`
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

# (precision, dtype) -> allclose tol (atol = rtol = tol), also the `tol` of the fp64 rule.
# float32/highest is same()'s default (1e-4); bfloat16 is what PyTorch's harness uses for amp/bf16 runs
# (1e-2); the reduced float32 matmul precisions sit in between according to the bfloat16 passes they make.
TOLERANCES: dict[tuple[str, str], float] = {
    ("highest", "float32"): 1e-4,
    ("high", "float32"): 1e-3,
    ("medium", "float32"): 2e-2,
    ("highest", "bfloat16"): 1e-2,
    ("high", "bfloat16"): 1e-2,
    ("medium", "bfloat16"): 2e-2,
}
MULTIPLIER_FLOAT32 = 2.0  # same(): rmse multiplier for float32 results
MULTIPLIER_LOW_PRECISION = 3.0  # same(): for bfloat16/float16 results, and for tensors < SMALL_NUMEL
SMALL_NUMEL = 1000
COSINE_THRESHOLD = 0.99  # same(cos_similarity=True)
DEFAULT_TOLERANCES_FILE = Path(__file__).with_name("tolerances.yaml")


@dataclass(frozen=True)
class Tolerance:
    tol: float
    multiplier: float | None = None  # None: same()'s rule by dtype and size
    cosine: bool = False
    skip: str = ""  # non-empty: do not run the entry, record it as `skipped` with this reason


@dataclass
class Overrides:
    entries: dict[str, dict] = field(default_factory=dict)

    def for_entry(self, entry_id: str) -> dict:
        if entry_id in self.entries:
            return self.entries[entry_id]
        for pattern, values in self.entries.items():
            if fnmatch.fnmatchcase(entry_id, pattern):
                return values
        return {}


_KNOWN_KEYS = {"tol", "multiplier", "cosine", "skip"}


def load_overrides(path: str | Path | None) -> Overrides:
    """Read the per-entry YAML. Raises ValueError naming the problem on a malformed file."""
    import yaml

    if path is None:
        path = DEFAULT_TOLERANCES_FILE
        if not path.exists():
            return Overrides()
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read tolerances file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries", {}) or {}, dict):
        raise ValueError(f"tolerances file {path}: expected a mapping with an `entries:` mapping")
    entries = data.get("entries") or {}
    for key, values in entries.items():
        if not isinstance(values, dict) or set(values) - _KNOWN_KEYS:
            raise ValueError(
                f"tolerances file {path}: entry {key!r} must map to keys among {sorted(_KNOWN_KEYS)}, got {values!r}"
            )
    return Overrides(entries={str(k): dict(v) for k, v in entries.items()})


def tolerance_for(entry_id: str, precision: str, dtype: str, overrides: Overrides | None = None) -> Tolerance:
    base = Tolerance(tol=TOLERANCES[(precision, dtype)])
    values = overrides.for_entry(entry_id) if overrides else {}
    if not values:
        return base
    return replace(
        base,
        tol=float(values.get("tol", base.tol)),
        multiplier=None if values.get("multiplier") is None else float(values["multiplier"]),
        cosine=bool(values.get("cosine", False)),
        skip=str(values.get("skip") or ""),
    )


@dataclass
class Comparison:
    match: bool
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    cosine: float = math.nan
    rmse_ratio: float = math.nan
    reason: str = ""  # why it does not match: the worst tensor and the rule it broke

    def metrics(self) -> dict:
        return {
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "cosine": self.cosine,
            "rmse_ratio": self.rmse_ratio,
        }


def _rmse(a, b) -> float:
    import torch

    return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))


def _multiplier(tol: Tolerance, res, fp64) -> float:
    import torch

    if tol.multiplier is not None:
        return tol.multiplier
    m = MULTIPLIER_LOW_PRECISION if res.dtype in (torch.float16, torch.bfloat16) else MULTIPLIER_FLOAT32
    if fp64.numel() < SMALL_NUMEL or (res.ndim == 4 and res.shape[-1] == res.shape[-2] == 1) or tol.tol >= 2e-2:
        m = MULTIPLIER_LOW_PRECISION
    return m


def _nanmax(values: list[float], default: float = math.nan) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return max(vals) if vals else default


def compare_tensor(name: str, ref, res, fp64, tol: Tolerance) -> tuple[bool, dict, str]:
    """Compare one tensor. Returns (match, metrics, reason)."""
    import torch

    if tuple(ref.shape) != tuple(res.shape):
        return False, {}, f"{name}: shape {tuple(res.shape)} != baseline {tuple(ref.shape)}"
    r, s = ref.detach().cpu().double(), res.detach().cpu().double()
    m: dict[str, float] = {}
    if r.numel() == 0:
        return True, {"max_abs_err": 0.0, "max_rel_err": 0.0, "cosine": 1.0, "rmse_ratio": math.nan}, ""
    diff = (s - r).abs()
    m["max_abs_err"] = float(diff.max()) if not diff.isnan().all() else math.nan
    scale = float(r.abs().nan_to_num(0.0).max())
    m["max_rel_err"] = m["max_abs_err"] / scale if scale > 0 else (0.0 if m["max_abs_err"] == 0 else math.inf)
    both_nan = r.isnan() & s.isnan()
    if bool(both_nan.all()):
        m["cosine"] = 1.0
    elif torch.equal(r.nan_to_num(0.0), s.nan_to_num(0.0)) and not bool((r.isnan() ^ s.isnan()).any()):
        m["cosine"] = 1.0  # identical (also all zeros, where cosine_similarity gives 0)
    else:
        m["cosine"] = float(torch.nn.functional.cosine_similarity(r.flatten(), s.flatten(), dim=0, eps=1e-12))
    m["rmse_ratio"] = math.nan
    if fp64 is not None and tuple(fp64.shape) == tuple(ref.shape):
        ref_err, res_err = _rmse(fp64, ref), _rmse(fp64, res)
        if ref_err > 0:
            m["rmse_ratio"] = res_err / ref_err
        elif not math.isnan(ref_err):
            m["rmse_ratio"] = 0.0 if res_err == 0 else math.inf
    res_cast = res.detach().cpu()
    ref_cast = ref.detach().cpu().to(res_cast.dtype)
    if torch.allclose(ref_cast, res_cast, atol=tol.tol, rtol=tol.tol, equal_nan=True):
        return True, m, ""
    if tol.cosine:
        ok = m["cosine"] >= COSINE_THRESHOLD
        return ok, m, "" if ok else f"{name}: cosine {m['cosine']:.5f} < {COSINE_THRESHOLD}"
    if fp64 is None or tuple(fp64.shape) != tuple(ref.shape):
        return False, m, f"{name}: not allclose at tol={tol.tol:g} (max abs err {m['max_abs_err']:.3g}), no fp64 reference"
    ref_err, res_err = _rmse(fp64, ref), _rmse(fp64, res)
    mult = _multiplier(tol, res_cast, fp64)
    ok = res_err <= mult * ref_err + tol.tol / 10.0
    if not ok and math.isnan(ref_err) and math.isnan(res_err):
        ok = True  # both NaN against the reference: same()'s equal_nan escape
    reason = "" if ok else (
        f"{name}: rmse(fp64,tpu)={res_err:.3g} > {mult:g}*rmse(fp64,cpu)={ref_err:.3g} + tol/10={tol.tol / 10:g}"
    )
    return ok, m, reason


def compare_outputs(ref: dict, res: dict, fp64: dict | None, tol: Tolerance) -> Comparison:
    """Compare named output tensors (dicts from `output_tensors`)."""
    if set(ref) != set(res):
        missing, extra = sorted(set(ref) - set(res)), sorted(set(res) - set(ref))
        return Comparison(False, reason=f"output names differ: missing {missing[:5]}, extra {extra[:5]}")
    if not ref:
        return Comparison(True, reason="no floating output tensors to compare")
    ok_all, reasons = True, []
    abs_errs, rel_errs, coss, ratios = [], [], [], []
    for name in ref:
        ok, m, reason = compare_tensor(name, ref[name], res[name], (fp64 or {}).get(name), tol)
        if not ok:
            ok_all = False
            reasons.append(reason)
        abs_errs.append(m.get("max_abs_err", math.nan))
        rel_errs.append(m.get("max_rel_err", math.nan))
        coss.append(m.get("cosine", math.nan))
        ratios.append(m.get("rmse_ratio", math.nan))
    cos_vals = [c for c in coss if not math.isnan(c)]
    return Comparison(
        ok_all,
        max_abs_err=_nanmax(abs_errs),
        max_rel_err=_nanmax(rel_errs),
        cosine=min(cos_vals) if cos_vals else math.nan,
        rmse_ratio=_nanmax(ratios),
        reason="; ".join(reasons)[:300],
    )
