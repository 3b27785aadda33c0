"""`kubetrain` (the console script) and `python -m kubetrain`: `kubetrain operator ...` starts the operator
without importing the click CLI (operator_main.py says why); every other command is the click CLI (cli/commands.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["operator"]:
        from kubetrain.controller.operator_main import run

        sys.exit(run(args[1:]))
    from kubetrain.cli.commands import main as cli

    cli(args, prog_name="kubetrain")


if __name__ == "__main__":
    main()
