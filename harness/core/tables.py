"""Figures and Markdown table cells, as every report of the harness writes them (coverage.md, the dashboard,
the verdicts section, the upstream-tests table)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """A percentage with its numerator and denominator, so no figure is shown without its base."""

    num: int
    den: int

    @property
    def pct(self) -> float | None:
        return 100.0 * self.num / self.den if self.den else None

    def __str__(self) -> str:
        return f"{fmt_pct(self.pct)} ({self.num}/{self.den})"


def fmt_pct(pct: float | None) -> str:
    return "n/a" if pct is None else f"{pct:.1f}%"


def fmt_num(x: object, digits: int = 3, fixed: bool = False) -> str:
    """Number for tables: '' for missing; `digits` significant digits, or decimals when fixed."""
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if v != v:  # NaN
        return ""
    return f"{v:.{digits}f}" if fixed else f"{v:.{digits}g}"


def md_cell(s: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(s).replace("|", "\\|").replace("\n", " ")
