"""``python -m bench``: run every benchmark (or those named) and print one line per figure.

Usage::

    python -m bench                  # everything (about 20 minutes on 2 cores; starts and stops a lab)
    python -m bench --quick          # fewer repeats and shorter runs (about 5 minutes)
    python -m bench core trainer.metrics   # only these benchmarks (a name or a dotted prefix)
    python -m bench peer             # kubetrain against Kubeflow's training operator (builds it once, starts a lab)
    python -m bench --no-lab         # everything that needs no lab
    python -m bench --list           # the benchmarks, their figures and goals
    python -m bench --json out.json  # also write the results as JSON

Exit status: 0 when every benchmark ran (goals met or not; add --strict to fail on a missed goal),
1 when a benchmark could not run, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.registry import Benchmark, Context
from bench.report import Figure, format_figure, to_json

__all__ = ["all_benchmarks", "main", "select"]


def all_benchmarks() -> tuple[Benchmark, ...]:
    """Every benchmark, in the order they run (the lab ones last, sharing one lab)."""
    from bench import (
        burst,
        cluster,
        core,
        costs,
        frontier,
        gang,
        inplace,
        kueue,
        peer,
        recovery,
        rendezvous,
        scale,
        trainer,
        trainer_overhead,
    )

    # The peer before the scale benchmarks: their 512-pod job and 250 jobs would still be going away (and
    # weigh on a freshly started operator) when the peer measures memory.
    ordered = (*core.BENCHMARKS, *trainer.BENCHMARKS, *trainer_overhead.BENCHMARKS, *cluster.BENCHMARKS,
               *recovery.BENCHMARKS, *rendezvous.BENCHMARKS, *peer.BENCHMARKS, *scale.BENCHMARKS, *burst.BENCHMARKS,
               *kueue.BENCHMARKS, *gang.BENCHMARKS, *inplace.BENCHMARKS, *frontier.BENCHMARKS,
               *costs.BENCHMARKS)
    return tuple(sorted(ordered, key=lambda bench: bench.needs_lab))  # stable: the order above within each kind


def select(benchmarks: Sequence[Benchmark], names: Sequence[str], *, no_lab: bool = False) -> list[Benchmark]:
    """Benchmarks whose name, a dotted prefix of it, or one of whose figure names is in ``names``."""
    def wanted(bench: Benchmark) -> bool:
        if not names:
            return True
        keys = {bench.name, *(f.name for f in bench.figures)}
        return any(key == name or key.startswith(name + ".") for name in names for key in keys)

    unknown = [n for n in names if not any(
        k == n or k.startswith(n + ".") for b in benchmarks for k in (b.name, *(f.name for f in b.figures)))]
    if unknown:
        raise ValueError(f"unknown benchmark(s): {', '.join(unknown)} (see --list)")
    return [b for b in benchmarks if wanted(b) and not (no_lab and b.needs_lab)]


def list_lines(benchmarks: Sequence[Benchmark]) -> list[str]:
    lines = []
    for bench in benchmarks:
        lab = "  [starts a lab]" if bench.needs_lab else ""
        lines.append(f"{bench.name}: {bench.summary}{lab}")
        for spec in bench.figures:
            lines.append(f"    {spec.name}  {spec.goal}  ({spec.goal.reason})")
    return lines


def run(benchmarks: Sequence[Benchmark], ctx: Context) -> tuple[list[Figure], bool]:
    """Run each benchmark, printing its lines as they come; a failing one reports its figures as n/a."""
    figures: list[Figure] = []
    all_ran = True
    width = max((len(f.name) for b in benchmarks for f in b.figures), default=0)
    try:
        for bench in benchmarks:
            started = time.monotonic()
            try:
                measured = bench.run(ctx)
            except Exception as error:
                all_ran = False
                message = f"{type(error).__name__}: {error}"[:300]
                measured = [spec.failed(message) for spec in bench.figures]
            ctx.log(f"{bench.name} took {time.monotonic() - started:.0f} s")
            for figure in measured:
                print(format_figure(figure, width), flush=True)
            figures += measured
    finally:
        ctx.close()
    return figures, all_ran


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more rounds")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0] if __doc__ else "",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="benchmarks or figures to run (a name or dotted prefix)")
    parser.add_argument("--list", action="store_true", help="list benchmarks, figures and goals, run nothing")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter runs")
    parser.add_argument("--no-lab", action="store_true", help="skip the benchmarks that need the lab")
    parser.add_argument("--rounds", type=_positive, metavar="N",
                        help="measured rounds of every benchmark that repeats (default: its own)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results to FILE as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("-q", "--silent", action="store_true", help="no progress notes on stderr")
    args = parser.parse_args(argv)
    try:
        chosen = select(all_benchmarks(), args.names, no_lab=args.no_lab)
    except ValueError as error:
        parser.error(str(error))
    if args.list:
        print("\n".join(list_lines(chosen)))
        return 0
    started = time.monotonic()
    figures, all_ran = run(chosen, Context(quick=args.quick, verbose=not args.silent, repeats=args.rounds))
    elapsed = time.monotonic() - started
    met = sum(f.met for f in figures)
    print(f"# {met}/{len(figures)} goals met in {elapsed:.0f} s{' (--quick)' if args.quick else ''}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(to_json(
            figures, date=datetime.now(UTC).isoformat(timespec="seconds"), quick=args.quick,
            seconds=round(elapsed, 1), machine=f"{platform.node()} {platform.machine()}",
            python=platform.python_version()), indent=2) + "\n")
    if not all_ran:
        return 1
    return 1 if args.strict and met < len(figures) else 0


if __name__ == "__main__":
    sys.exit(main())
