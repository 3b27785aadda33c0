"""What the CRD's generators share: finding the marked regions they own, dumping YAML for them, and the
command line that rewrites the CRD or only checks that it is current."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

Json = Any
ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "trainingjobs.kubetrain.io.yaml"


class GeneratorError(Exception):
    """The CRD's regions and the generator's source do not fit together."""


class NoAliasDumper(yaml.SafeDumper):
    """No anchors: a region must read the same however the generator shares objects."""

    def ignore_aliases(self, data: Json) -> bool:
        return True


def regions(lines: list[str], begin: re.Pattern[str], end: str) -> Iterator[tuple[str, str, int, int]]:
    """(name, indent, index of the BEGIN line, index of its END line) of each region: ``begin`` matches a
    BEGIN line with groups ``indent`` and ``name``; ``end`` is the END line's text with ``{}`` for the name."""
    for first, line in enumerate(lines):
        match = begin.match(line)
        if match is None:
            continue
        end_line = match["indent"] + end.format(match["name"])
        ends = [i for i in range(first + 1, len(lines)) if lines[i] == end_line]
        if not ends:
            raise GeneratorError(f"line {first + 1}: no `{end_line.strip()}` after it")
        yield match["name"], match["indent"], first, ends[0]


def main(argv: list[str] | None, *, command: str, description: str, render: Callable[[str], str],
         crd: Path = CRD, root: Path = ROOT) -> int:
    """Rewrite ``crd`` with ``render``, or with --check exit 1 (writing nothing) when it is not current."""
    parser = argparse.ArgumentParser(prog=command, description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the CRD is not current; write nothing")
    args = parser.parse_args(argv)
    current = crd.read_text()
    wanted = render(current)
    if current == wanted:
        return 0
    if args.check:
        print(f"{crd.relative_to(root)} is not current: run {command}", file=sys.stderr)
        return 1
    crd.write_text(wanted)
    print(f"wrote {crd.relative_to(root)} ({len(wanted)} bytes)")
    return 0
