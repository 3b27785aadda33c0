"""Build the lab's binaries from its Go modules, cached outside the repository by version.

Only what is missing is built; a warm cache makes this a no-op. A file lock keeps two builds (say, CI's
``python -m tests.lab build`` and a pytest session) from racing on the same cache directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tests.lab.procs import file_lock, heartbeat, log_line
from tests.lab.versions import (
    BINARIES,
    GO_DIR,
    MODULES,
    GoModule,
    binary_path,
    cache_root,
    module_binary_path,
    module_of,
)

HEARTBEAT_S = 30.0
KUBEFLOW_TRAINING_OPERATOR_VERSION = "v1.9.4"
KUBEFLOW_MODULE_PATH = "github.com/kubeflow/training-operator"
# Not the lab's own: the peer the benchmarks compare kubetrain with (bench/peer.py), built on demand only.
PEER_MODULES: dict[str, GoModule] = {
    "kubeflow": GoModule(
        directory=GO_DIR / "kubeflow",
        version=KUBEFLOW_TRAINING_OPERATOR_VERSION,
        packages={"training-operator": f"{KUBEFLOW_MODULE_PATH}/cmd/training-operator.v1"},
    ),
}


def go_binary() -> str:
    found = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(found).exists():
        raise FileNotFoundError("Go toolchain not found: install Go 1.26+ or put `go` on PATH")
    return found


def _log(message: str) -> None:
    log_line("lab build", message)


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
    with heartbeat(lambda elapsed: _log(f"still building {key} ({elapsed:.0f} s)"), HEARTBEAT_S):
        subprocess.run(command, cwd=module.directory, env=env, check=True)
    for name in names:
        os.replace(staging / _go_output_name(module.packages[name]), out_dir / name)
    shutil.rmtree(staging, ignore_errors=True)
    _log(f"built {', '.join(names)} in {time.monotonic() - started:.0f} s -> {out_dir}")


def _ensure_module_binary(key: str, module: GoModule, name: str) -> Path:
    path = module_binary_path(key, module, name)
    if path.exists():
        return path
    with file_lock(cache_root() / f".{key}.lock"):
        missing = [n for n in module.packages if not module_binary_path(key, module, n).exists()]
        if missing:
            _build_module(key, module, missing)
    return path


def ensure_binary(name: str) -> Path:
    """Return the path of a lab binary, building it (and its module's other missing binaries) first."""
    path = binary_path(name)
    if path.exists():
        return path
    key, module = module_of(name)
    return _ensure_module_binary(key, module, name)


def ensure_peer_binary(name: str = "training-operator") -> Path:
    """Return the path of the benchmarks' peer operator (Kubeflow's training operator), building it first."""
    for key, module in PEER_MODULES.items():
        if name in module.packages:
            return _ensure_module_binary(key, module, name)
    raise KeyError(f"unknown peer binary {name!r}")


def module_source_dir(module_path: str, version: str, cwd: Path) -> Path:
    """A Go module's source tree in the module cache (its data files: CRDs, OpenAPI documents), downloaded
    first when missing; ``cwd``: a module directory of the lab's whose go.mod and proxy settings apply."""
    found = subprocess.run([go_binary(), "mod", "download", "-json", f"{module_path}@{version}"],
                           cwd=cwd, capture_output=True, text=True, check=True).stdout
    directory = json.loads(found).get("Dir")
    if not directory:
        raise FileNotFoundError(f"go mod download gave no directory for {module_path}@{version}")
    return Path(directory)


def peer_module_dir(key: str = "kubeflow") -> Path:
    """The peer's source tree in the Go module cache (its CRDs live there)."""
    module = PEER_MODULES[key]
    return module_source_dir(KUBEFLOW_MODULE_PATH, module.version, module.directory)


def ensure_all() -> dict[str, Path]:
    return {name: ensure_binary(name) for name in BINARIES}


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if not binary_path(name).exists()]


__all__ = ["MODULES", "PEER_MODULES", "ensure_all", "ensure_binary", "ensure_peer_binary", "missing_binaries",
           "module_source_dir", "peer_module_dir"]
