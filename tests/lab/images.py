"""How container images map to local Python environments (no image is pulled; see docs/lab.md).

An image reference is matched against glob patterns, first match wins. Each entry names a Python
environment whose ``bin`` goes first on PATH (so ``torchrun`` and ``python`` resolve there), a default
working directory and extra environment variables. The default, ``*``, is the environment of the Python
running the lab, with the repository's trainer_image/ on PYTHONPATH (what the trainer image would contain).

Override with ``KUBETRAIN_LAB_IMAGES``: a JSON object ``{"pattern": {"prefix": "/venv", "workingDir": "/x",
"env": {"K": "V"}}}`` (or ``{"pattern": "/venv"}``), tried before the default.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXEC_ONLY_TORCHRUN = """#!/bin/sh
# The exec-only image's torchrun: drops its own flags and execs the job's command (after --no-python).
while [ "$#" -gt 0 ] && [ "$1" != "--no-python" ]; do shift; done
[ "$#" -gt 0 ] && shift
exec "$@"
"""


@dataclass(frozen=True)
class ImageEnvironment:
    prefix: Path
    working_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def base_env(self) -> dict[str, str]:
        return {"PATH": f"{self.prefix / 'bin'}:{SYSTEM_PATH}", "VIRTUAL_ENV": str(self.prefix), **self.env}


def default_environment() -> ImageEnvironment:
    return ImageEnvironment(prefix=Path(sys.prefix), env={"PYTHONPATH": str(REPO / "trainer_image")})


def exec_only_image(root: Path) -> ImageEnvironment:
    """An image (written under ``root``) whose ``torchrun`` only execs the job's command: its pods cost a
    process, not a torch import, for tests and benchmarks of the operator with dozens of pods at once."""
    torchrun = root / "bin" / "torchrun"
    torchrun.parent.mkdir(parents=True, exist_ok=True)
    torchrun.write_text(EXEC_ONLY_TORCHRUN)
    torchrun.chmod(0o755)
    return ImageEnvironment(prefix=root)


def _parse(entry: object) -> ImageEnvironment:
    if isinstance(entry, str):
        return ImageEnvironment(prefix=Path(entry))
    if isinstance(entry, dict):
        working_dir = entry.get("workingDir")
        return ImageEnvironment(
            prefix=Path(entry.get("prefix", sys.prefix)),
            working_dir=Path(working_dir) if working_dir else None,
            env={str(k): str(v) for k, v in dict(entry.get("env", {})).items()},
        )
    raise ValueError(f"bad KUBETRAIN_LAB_IMAGES entry: {entry!r}")


class ImageMap:
    def __init__(self, mapping: dict[str, ImageEnvironment] | None = None) -> None:
        configured = json.loads(os.environ.get("KUBETRAIN_LAB_IMAGES", "{}"))
        self.mapping = {pattern: _parse(entry) for pattern, entry in configured.items()}
        self.mapping.update(mapping or {})
        self.mapping.setdefault("*", default_environment())

    def put_first(self, pattern: str, environment: ImageEnvironment) -> None:
        """Resolve ``pattern`` to ``environment`` ahead of every other entry, the catch-all included."""
        entries = {key: value for key, value in self.mapping.items() if key != pattern}
        self.mapping.clear()
        self.mapping.update({pattern: environment, **entries})

    def resolve(self, image: str) -> ImageEnvironment:
        for pattern, environment in self.mapping.items():
            if fnmatch.fnmatchcase(image, pattern):
                return environment
        return self.mapping["*"]
