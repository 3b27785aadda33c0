"""The real node's sandbox image, built from tests/lab/pause.c into an OCI archive (no registry needed).

The archive is written by hand: one layer holding the static binary, a config, a manifest and an index whose
annotation names the image, which is what ``ctr images import`` reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.lab.versions import cache_root

SOURCE = Path(__file__).with_name("pause.c")
IMAGE_NAME = "localhost/kubetrain-lab/pause:1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    archive.addfile(info, io.BytesIO(data))


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, (data, mode) in files.items():
            _add_bytes(archive, name, data, mode)
    return buffer.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def oci_archive(binary: bytes, image_name: str) -> bytes:
    """An OCI image layout (as a tar) with one layer holding ``/pause``."""
    layer = _tar_bytes({"pause": (binary, 0o755)})
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    blobs: dict[str, bytes] = {}
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": _blob(blobs, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [_blob(blobs, layer, "application/vnd.oci.image.layer.v1.tar")],
    }
    entry = _blob(blobs, json.dumps(manifest).encode(), OCI_MANIFEST)
    entry["annotations"] = {"io.containerd.image.name": image_name,
                            "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[1]}
    files = {"oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644),
             "index.json": (json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode(), 0o644)}
    files.update({f"blobs/sha256/{d.removeprefix('sha256:')}": (data, 0o644) for d, data in blobs.items()})
    return _tar_bytes(files)


def ensure_pause_archive() -> Path:
    """The cached archive, rebuilt when pause.c changes (a static build takes a second)."""
    source = SOURCE.read_bytes()
    target = cache_root() / "images" / f"pause-{hashlib.sha256(source).hexdigest()[:16]}.oci.tar"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "pause"
        compiler = shutil.which("cc") or shutil.which("gcc") or "gcc"
        subprocess.run([compiler, "-static", "-Os", "-s", "-o", str(binary), str(SOURCE)], check=True)
        partial = target.with_suffix(".partial")
        partial.write_bytes(oci_archive(binary.read_bytes(), IMAGE_NAME))
        partial.replace(target)
    return target
