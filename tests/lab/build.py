"""Build the lab's binaries from its Go modules, cached outside the repository by version.

Only what is missing is built; a warm cache makes this a no-op. A file lock keeps two builds (say, CI's
``python -m tests.lab build`` and a pytest session) from racing on the same cache directory.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.lab.versions import BINARIES, MODULES, GoModule, binary_path, cache_root, module_of

HEARTBEAT_S = 30.0


def go_binary() -> str:
    found = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(found).exists():
        raise FileNotFoundError("Go toolchain not found: install Go 1.26+ or put `go` on PATH")
    return found


def _log(message: str) -> None:
    print(f"[lab build {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_output_name(package: str) -> str:
    """The file name `go build -o dir/` gives a main package: its last element, skipping a /vN suffix."""
    parts = package.rstrip("/").split("/")
    if re.fullmatch(r"v\d+", parts[-1]) and len(parts) > 1:
        return parts[-2]
    return parts[-1]


def _build_module(key: str, module: GoModule, names: list[str]) -> None:
    out_dir = cache_root() / f"{key}-{module.version}"
    staging = out_dir / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    ldflags = " ".join(["-s", "-w", *(f"-X {var}" for var in module.version_vars)])
    tags = ["-tags", ",".join(module.tags)] if module.tags else []
    command = [
        go_binary(), "build", "-trimpath", *tags, "-ldflags", ldflags, "-o", f"{staging}/",
        *(module.packages[name] for name in names),
    ]
    env = {**os.environ, "CGO_ENABLED": "1" if module.cgo else "0"}
    _log(f"building {', '.join(names)} {module.version} "
         "(cold: Kubernetes 15-30 min on 2 cores, etcd and helm a few minutes)")
    started = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            _log(f"still building {key} ({time.monotonic() - started:.0f} s)")

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        subprocess.run(command, cwd=module.directory, env=env, check=True)
    finally:
        done.set()
    for name in names:
        os.replace(staging / _go_output_name(module.packages[name]), out_dir / name)
    shutil.rmtree(staging, ignore_errors=True)
    _log(f"built {', '.join(names)} in {time.monotonic() - started:.0f} s -> {out_dir}")


def ensure_binary(name: str) -> Path:
    """Return the path of a lab binary, building it (and its module's other missing binaries) first."""
    path = binary_path(name)
    if path.exists():
        return path
    key, module = module_of(name)
    with _locked(cache_root() / f".{key}.lock"):
        missing = [n for n in module.packages if not binary_path(n).exists()]
        if missing:
            _build_module(key, module, missing)
    return path


def ensure_all() -> dict[str, Path]:
    return {name: ensure_binary(name) for name in BINARIES}


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if not binary_path(name).exists()]


__all__ = ["MODULES", "ensure_all", "ensure_binary", "missing_binaries"]
