"""Tolerances: the per-precision defaults and per-entry overrides of harness/sweep/tolerances.yaml, read into
the `Tolerance` each comparison applies. How a tolerance is applied (the rule) is harness/sweep/numerics.py,
which re-exports these names; docs/numerics.md says how the numbers were measured.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_TOLERANCES_FILE = Path(__file__).with_name("tolerances.yaml")
_DEFAULT_KEYS = {"tol", "floor", "reference", "agree"}
_KNOWN_KEYS = {"tol", "floor", "reference", "agree", "multiplier", "cosine", "skip", "data_dependent", "max_unmatched"}


@dataclass(frozen=True)
class Tolerance:
    tol: float  # allclose rtol, and atol in units of the tensor's scale
    multiplier: float | None = None  # None: same()'s rule by dtype and size
    cosine: bool = False
    skip: str = ""  # non-empty: do not run the entry, record it as `skipped` with this reason
    floor: float | None = None  # fp64 rule's floor in units of the tensor's scale; None: tol / 10, as in same()
    reference: float = 1e-3  # largest rmse(fp64, baseline) / scale for the float64 reference to be valid
    data_dependent: tuple[str, ...] = ()
    max_unmatched: float = 0.1
    tie_sizes: frozenset = frozenset()  # set by the runner: near-tied ranking selections in the baseline
    agree: float | None = None  # rmse(baseline, tpu) <= agree * rmse(fp64, baseline) (+ floor): same rounding

    @property
    def floor_value(self) -> float:
        return self.tol / 10.0 if self.floor is None else self.floor


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


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read tolerances file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries", {}) or {}, dict):
        raise ValueError(f"tolerances file {path}: expected a mapping with an `entries:` mapping")
    return data


@functools.cache
def _defaults() -> dict[tuple[str, str], dict]:
    """`defaults:` of the shipped tolerances.yaml: "precision/dtype" -> {tol, floor, reference}."""
    data = _read_yaml(DEFAULT_TOLERANCES_FILE)
    out = {}
    for key, values in (data.get("defaults") or {}).items():
        precision, _, dtype = str(key).partition("/")
        if not isinstance(values, dict) or set(values) - _DEFAULT_KEYS or "tol" not in values:
            raise ValueError(f"tolerances file {DEFAULT_TOLERANCES_FILE}: default {key!r} must map to keys among "
                             f"{sorted(_DEFAULT_KEYS)} including tol, got {values!r}")
        out[(precision, dtype)] = {k: float(v) for k, v in values.items()}
    return out


# (precision, dtype) -> allclose tol, from tolerances.yaml
TOLERANCES: dict[tuple[str, str], float] = {k: v["tol"] for k, v in _defaults().items()}


def load_overrides(path: str | Path | None) -> Overrides:
    """Read the per-entry YAML. Raises ValueError naming the problem on a malformed file."""
    if path is None:
        path = DEFAULT_TOLERANCES_FILE
        if not path.exists():
            return Overrides()
    path = Path(path)
    data = _read_yaml(path)
    entries = data.get("entries") or {}
    for key, values in entries.items():
        if not isinstance(values, dict) or set(values) - _KNOWN_KEYS:
            raise ValueError(
                f"tolerances file {path}: entry {key!r} must map to keys among {sorted(_KNOWN_KEYS)}, got {values!r}"
            )
    return Overrides(entries={str(k): dict(v) for k, v in entries.items()})


def tolerance_for(entry_id: str, precision: str, dtype: str, overrides: Overrides | None = None) -> Tolerance:
    d = _defaults()[(precision, dtype)]
    base = Tolerance(tol=d["tol"], floor=d.get("floor"), reference=d.get("reference", 1e-3), agree=d.get("agree"))
    values = overrides.for_entry(entry_id) if overrides else {}
    if not values:
        return base
    return replace(
        base,
        tol=float(values.get("tol", base.tol)),
        floor=float(values["floor"]) if "floor" in values else base.floor,
        reference=float(values.get("reference", base.reference)),
        # only where the configuration has the bound: at "highest" the baseline does not share a rounding
        agree=float(values["agree"]) if values.get("agree") is not None and base.agree is not None else base.agree,
        multiplier=None if values.get("multiplier") is None else float(values["multiplier"]),
        cosine=bool(values.get("cosine", False)),
        skip=str(values.get("skip") or ""),
        data_dependent=tuple(str(n) for n in values.get("data_dependent") or ()),
        max_unmatched=float(values.get("max_unmatched", base.max_unmatched)),
    )
