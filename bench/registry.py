"""Benchmarks as data: a name, the figures it reports (with goals), and a function that measures them."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import Figure, Goal

__all__ = ["Benchmark", "Context", "FigureSpec"]


@dataclass(frozen=True)
class FigureSpec:
    """A figure a benchmark promises: its name, unit and goal, known before anything runs."""

    name: str
    unit: str
    goal: Goal

    def measured(self, value: float, detail: str = "", disturbed: str = "", **extra: float) -> Figure:
        return Figure(self.name, value, self.unit, self.goal, detail, extra=dict(extra), disturbed=disturbed)

    def failed(self, error: str) -> Figure:
        return Figure(self.name, None, self.unit, self.goal, error=error)


@dataclass(frozen=True)
class Benchmark:
    name: str
    summary: str
    figures: tuple[FigureSpec, ...]
    run: Callable[[Context], list[Figure]]
    needs_lab: bool = False


@dataclass
class Context:
    """What benchmarks share in one run: the --quick flag, a scratch directory, cached measurements and
    (for the benchmarks that need it) one lab, started on first use and always stopped by :meth:`close`."""

    quick: bool = False
    verbose: bool = True
    repeats: int | None = None  # --rounds: every benchmark's rounds, for a longer or a shorter run than its own
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kubetrain-bench-")))
    cache: dict[str, Any] = field(default_factory=dict)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def rounds(self, quick: int, full: int) -> int:
        """How many measured rounds a benchmark runs: ``--rounds`` when given, else its own for --quick or not."""
        if self.repeats is not None:
            return self.repeats
        return quick if self.quick else full

    def log(self, message: str) -> None:
        if self.verbose:
            print(f"  .. {message}", file=sys.stderr, flush=True)

    def on_close(self, closer: Callable[[], None]) -> None:
        self._closers.append(closer)

    def close(self) -> None:
        """Run every closer (newest first) even when one fails; then remove the scratch directory."""
        errors = []
        while self._closers:
            try:
                self._closers.pop()()
            except Exception as error:
                errors.append(error)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise RuntimeError(f"cleaning up after the benchmarks failed: {errors}")
