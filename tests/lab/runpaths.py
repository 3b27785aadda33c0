"""Names of what a lab keeps outside its run directory, keyed so that two labs on one machine never share them.

A run directory's last component alone is not unique (every `python -m tests.lab up` uses `.lab/up`, in any
checkout), so the key adds a hash of its full path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SHM = Path("/dev/shm")


def lab_key(run_dir: Path) -> str:
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
    return f"{run_dir.name[:24]}-{digest}"


def etcd_data_dir(run_dir: Path) -> Path:
    root = SHM if SHM.is_dir() else run_dir
    return root / f"kubetrain-lab-etcd-{lab_key(run_dir)}"


def emptydir_root(run_dir: Path) -> Path:
    """Memory-backed emptyDirs of the process kubelet's pods."""
    return SHM / f"kubetrain-lab-{lab_key(run_dir)}"


def shm_dirs(run_dir: Path) -> list[Path]:
    return [etcd_data_dir(run_dir), emptydir_root(run_dir)]
