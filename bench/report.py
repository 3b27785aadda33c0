"""Figures, goals and verdicts, and the one-line text format every figure is printed in."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

__all__ = ["Figure", "Goal", "format_figure", "format_report", "format_value", "median", "percentile", "to_json"]

Op = Literal["<=", ">="]


@dataclass(frozen=True)
class Goal:
    """A bound on a figure, and why it is that bound (printed in ``--list`` and the docs)."""

    op: Op
    value: float
    reason: str = ""

    def met_by(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value <= self.value if self.op == "<=" else value >= self.value

    def __str__(self) -> str:
        return f"goal {self.op} {format_value(self.value)}"


@dataclass(frozen=True)
class Figure:
    """One measured figure: ``value`` is ``None`` when the benchmark could not measure it (``error`` says why)."""

    name: str
    value: float | None
    unit: str
    goal: Goal
    detail: str = ""
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    # Why a miss is the machine's, not the code's (its parallel capacity was measured below its cores): the
    # verdict is then DISTURBED, and the detail says what a machine with that capacity would measure.
    disturbed: str = ""

    def with_extra(self, more: Mapping[str, float]) -> Figure:
        return replace(self, extra=self.extra | dict(more))

    @property
    def met(self) -> bool:
        return not self.error and self.goal.met_by(self.value)

    @property
    def verdict(self) -> str:
        if self.met:
            return "met"
        return "DISTURBED" if self.disturbed and not self.error else "missed"


def format_value(value: float) -> str:
    """Three significant digits, never scientific notation for the magnitudes benchmarks produce."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


def format_figure(figure: Figure, name_width: int = 0) -> str:
    """``name  value unit (detail)  goal <= x  met|missed`` on one line."""
    if figure.value is None or figure.error:
        measured = f"n/a ({figure.error or 'not measured'})"
    else:
        measured = f"{format_value(figure.value)} {figure.unit}".rstrip()
        detail = "; ".join(part for part in (figure.detail, figure.disturbed and f"DISTURBED: {figure.disturbed}")
                           if part)
        if detail:
            measured += f" ({detail})"
    measured = " ".join(measured.split())  # one line, whatever an error message held
    return f"{figure.name.ljust(name_width)}  {measured}  {figure.goal}  {figure.verdict}"


def format_report(figures: Sequence[Figure]) -> list[str]:
    width = max((len(f.name) for f in figures), default=0)
    return [format_figure(f, width) for f in figures]


def to_json(figures: Iterable[Figure], **meta: Any) -> dict[str, Any]:
    """Machine-readable results: one object per figure with its verdict."""
    rows = []
    for figure in figures:
        row = asdict(figure)
        row["goal"] = {"op": figure.goal.op, "value": figure.goal.value, "reason": figure.goal.reason}
        row["verdict"] = figure.verdict
        rows.append(row)
    return {**meta, "figures": rows}


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
