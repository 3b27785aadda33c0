"""The project's container images, built with podman from its own Dockerfiles and kept as OCI archives.

``ensure_images()`` returns one archive per image (``podman save --format oci-archive``), ready for
``ctr -n k8s.io images import --all-platforms FILE``: the archive's index names the image with its canonical
reference (``org.opencontainers.image.ref.name``), which ctr keeps as the image's name.

No container registry is reachable here, so the images are built on a base made from Debian packages
(mmdebstrap, then ``podman import``) and passed as the Dockerfiles' ``PYTHON_IMAGE`` build argument.

Archives are cached under ``cache_root() / "images"``, named by a sha256 over everything that goes into the
image: its reference, the Dockerfile, every file git knows (tracked, or untracked and not ignored) under the
paths the Dockerfile COPYs, and the base image's ID. The build context is a copy of exactly those files, so
the image holds what the hash covers (no __pycache__, no stray build output).

The podman flags are the ones this kind of machine needs (docs/lab.md): runc (crun fails on cgroup v1
hybrid), cgroupfs, and rlimits no higher than the ones we have (raising one needs CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from tests.lab.procs import file_lock, heartbeat, log_line
from tests.lab.versions import cache_root

REPO: Final = Path(__file__).resolve().parents[2]

# The canonical names: the chart's image and the operator's default trainer image, tag = chart appVersion.
IMAGES: Final = {
    "operator": "docker.io/kubetrain/operator:0.1.0",
    "trainer": "docker.io/kubetrain/trainer:0.1.0",
}
DOCKERFILES: Final = {
    "operator": REPO / "Dockerfile",
    "trainer": REPO / "trainer_image" / "Dockerfile",
}

BASE_REPOSITORY: Final = "localhost/kubetrain-lab/python-base"
BASE_SUITE: Final = "bookworm"
# What the Dockerfiles use from the base: python + venv, groupadd/useradd (passwd), the CA bundle for pip.
BASE_PACKAGES: Final = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
# `podman import` leaves the config empty; give it what the official python image sets.
BASE_CONFIG: Final = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)

HOST_CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"
PODMAN_GLOBAL_FLAGS: Final = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
# For `podman build` and `podman run` alike.
ULIMIT_FLAGS: Final = ("--ulimit", "nofile=10000:10000", "--ulimit", "nproc=4096:4096")
# Builds reach PyPI through the host's network and trust what the host trusts.
BUILD_FLAGS: Final = (
    *ULIMIT_FLAGS, "--network", "host", "--pull=never",
    "--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
)
HEARTBEAT_S = 30.0


class ImageBuildError(RuntimeError):
    """A step of an image build failed; the message ends with the tail of its log."""


def images_dir() -> Path:
    return cache_root() / "images"


def podman_command(*args: str) -> list[str]:
    """A podman command line with the global flags this machine needs."""
    podman = shutil.which("podman")
    if podman is None:
        raise FileNotFoundError("podman not found: apt-get install podman (and mmdebstrap, runc)")
    return [podman, *PODMAN_GLOBAL_FLAGS, *args]


def _log(message: str) -> None:
    log_line("lab images", message)


def _last_line(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 4096))
        # pip and podman redraw progress lines with \r: the last piece is the latest one
        lines = [line for line in re.split(r"[\r\n]+", handle.read().decode(errors="replace")) if line.strip()]
    return lines[-1][:160] if lines else ""


def _run_logged(command: Sequence[str], log_path: Path, what: str) -> None:
    """Run a long command with its output in log_path and a progress line every HEARTBEAT_S seconds."""
    started = time.monotonic()

    def say(elapsed: float) -> None:
        _log(f"still {what} ({elapsed:.0f} s): {_last_line(log_path)}")
    with log_path.open("w") as log, heartbeat(say, HEARTBEAT_S):
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise ImageBuildError(f"{what} failed (exit {result.returncode}); log {log_path}:\n{tail}")
    _log(f"{what}: done in {time.monotonic() - started:.0f} s")


def _podman_image_id(ref: str) -> str | None:
    result = subprocess.run(podman_command("image", "inspect", "--format", "{{.Id}}", ref),
                            capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def base_image_ref() -> str:
    """The base's reference; its tag changes with the recipe, so a new recipe makes a new base."""
    recipe = json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_CONFIG]).encode()
    return f"{BASE_REPOSITORY}:{BASE_SUITE}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure_base_image() -> str:
    """Make the Debian base image in podman's storage if it is not there; return its image ID."""
    ref = base_image_ref()
    with file_lock(images_dir() / ".python-base.lock"):
        existing = _podman_image_id(ref)
        if existing:
            return existing
        if shutil.which("mmdebstrap") is None:
            raise FileNotFoundError("mmdebstrap not found: apt-get install mmdebstrap (it makes the base image)")
        with tempfile.TemporaryDirectory(dir=images_dir(), prefix=".base-") as scratch:
            rootfs = Path(scratch) / "rootfs.tar"
            _log(f"making {ref} with mmdebstrap (about a minute)")
            _run_logged(["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                         BASE_SUITE, str(rootfs)], images_dir() / "python-base.log", "making the base image")
            changes = [flag for change in BASE_CONFIG for flag in ("--change", change)]
            _run_logged(podman_command("import", *changes, str(rootfs), ref),
                        images_dir() / "python-base.import.log", "importing the base image")
    image_id = _podman_image_id(ref)
    if image_id is None:
        raise ImageBuildError(f"podman import did not leave {ref} in podman's storage")
    return image_id


def _dockerfile_instructions(dockerfile: Path) -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            pairs.append((words[0].upper(), words[1:]))
    return pairs


def copied_paths(dockerfile: Path) -> list[str]:
    """The build-context paths the Dockerfile's COPY/ADD instructions read (not those --from a stage)."""
    paths = []
    for keyword, words in _dockerfile_instructions(dockerfile):
        if keyword not in {"COPY", "ADD"} or any(word.startswith("--from") for word in words):
            continue
        if words and words[0].startswith("["):
            raise ValueError(f"{dockerfile}: write COPY in its plain form, not JSON: {' '.join(words)}")
        paths += [word for word in words if not word.startswith("--")][:-1]
    return paths


def context_files(dockerfile: Path) -> list[str]:
    """Files (relative to the repository) that go into the image: what git knows under the COPYed paths."""
    paths = copied_paths(dockerfile)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    # A tracked file deleted from the working tree is not part of the image.
    files = sorted({name for name in listed if name and (REPO / name).is_file()})
    for path in paths:
        if not any(name == path or name.startswith(path.rstrip("/") + "/") for name in files):
            raise FileNotFoundError(f"{dockerfile.name} copies {path!r}, but git knows no file there")
    return files


def image_key(name: str, base_id: str) -> str:
    """sha256 over everything that goes into the image, each part length-prefixed so none can shift."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    dockerfile = DOCKERFILES[name]
    add("ref", IMAGES[name].encode())
    add("base", base_id.encode())
    add("build-flags", json.dumps(BUILD_FLAGS).encode())
    add("dockerfile", dockerfile.read_bytes())
    for file in context_files(dockerfile):
        executable = os.access(REPO / file, os.X_OK)
        add(f"file {file} {'x' if executable else '-'}", (REPO / file).read_bytes())
    return digest.hexdigest()


def archive_path(name: str, key: str) -> Path:
    return images_dir() / f"{name}-{key}.oci.tar"


def stage_context(dockerfile: Path, into: Path) -> Path:
    """Copy the Dockerfile and its context files into `into`; return the staged Dockerfile."""
    for file in [str(dockerfile.relative_to(REPO)), *context_files(dockerfile)]:
        target = into / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / file, target)  # copy2 keeps mtimes, so podman's layer cache still hits
    return into / dockerfile.relative_to(REPO)


def _build(name: str, base_ref: str, archive: Path) -> None:
    ref = IMAGES[name]
    previous_id = _podman_image_id(ref)
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix=f".context-{name}-") as context:
        dockerfile = stage_context(DOCKERFILES[name], Path(context))
        _log(f"building {ref} (a cold trainer build downloads and unpacks torch: many minutes)")
        _run_logged(podman_command("build", *BUILD_FLAGS, "--build-arg", f"PYTHON_IMAGE={base_ref}",
                                   "--file", str(dockerfile), "--tag", ref, context),
                    images_dir() / f"{name}.log", f"building {name}")
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    _run_logged(podman_command("save", "--format", "oci-archive", "--output", str(partial), ref),
                images_dir() / f"{name}.save.log", f"saving {name}")
    os.replace(partial, archive)
    _remove_stale(name, archive, previous_id, _podman_image_id(ref))


def _remove_stale(name: str, keep: Path, previous_id: str | None, current_id: str | None) -> None:
    """Delete this image's older archives, and its previous build from podman's storage."""
    for old in [*images_dir().glob(f"{name}-*.oci.tar"), *images_dir().glob(f"{name}-*.partial")]:
        if old != keep:
            old.unlink(missing_ok=True)
            _log(f"removed stale archive {old.name}")
    if previous_id and previous_id != current_id:
        remove_image_if_untagged(previous_id)


def remove_image_if_untagged(image_id: str) -> None:
    """Remove an image from podman's storage unless it still has a name (someone may have tagged it).

    This also drops the build-cache layers only it used (say, an old torch layer); shared ones stay."""
    result = subprocess.run(podman_command("image", "inspect", "--format", "{{json .RepoTags}}", image_id),
                            capture_output=True, text=True, check=False)
    if result.returncode == 0 and not json.loads(result.stdout):
        subprocess.run(podman_command("rmi", image_id), capture_output=True, check=False)


def ensure_image(name: str) -> Path:
    """Return the OCI archive of image `name` ("operator" or "trainer"), building it if it is missing."""
    if name not in IMAGES:
        raise KeyError(f"unknown image {name!r}; known: {', '.join(IMAGES)}")
    images_dir().mkdir(parents=True, exist_ok=True)
    base_id = ensure_base_image()
    archive = archive_path(name, image_key(name, base_id))
    if archive.exists():
        return archive
    with file_lock(images_dir() / f".{name}.lock"):
        if not archive.exists():
            _build(name, base_image_ref(), archive)
    return archive


def ensure_images() -> dict[str, Path]:
    """The OCI archive of every image, by name ("operator", "trainer"); builds what is missing."""
    return {name: ensure_image(name) for name in IMAGES}


def _archive_json(archive: Path, member: str) -> Any:
    with tarfile.open(archive) as tar:
        handle = tar.extractfile(member)
        if handle is None:
            raise ImageBuildError(f"{archive}: {member} is not a file")
        return json.load(handle)


def archive_index(archive: Path) -> dict[str, Any]:
    """The archive's index.json (where ctr reads the image's name)."""
    index: dict[str, Any] = _archive_json(archive, "index.json")
    return index


def archive_image_id(archive: Path) -> str:
    """The image ID (config digest) of the archive's one image, as podman reports it."""
    (manifest,) = archive_index(archive)["manifests"]
    blob = f"blobs/sha256/{manifest['digest'].removeprefix('sha256:')}"
    config_digest: str = _archive_json(archive, blob)["config"]["digest"]
    return config_digest.removeprefix("sha256:")


def load_image(name: str) -> str:
    """Make podman's `IMAGES[name]` the image in its archive (loading it if needed); return the reference."""
    archive = ensure_image(name)
    ref = IMAGES[name]
    if _podman_image_id(ref) != archive_image_id(archive):
        _run_logged(podman_command("load", "--input", str(archive)), images_dir() / f"{name}.load.log",
                    f"loading {archive.name} into podman")
    return ref


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or find cached) the named images, default all; print one line per image: name, ref, archive."""
    parser = argparse.ArgumentParser(prog="python -m tests.lab.oci", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"{', '.join(IMAGES)} (default: all)")
    names = parser.parse_args(argv).names or list(IMAGES)
    unknown = [name for name in names if name not in IMAGES]
    if unknown:
        parser.error(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    for name in names:
        archive = ensure_image(name)
        print(f"{name}\t{IMAGES[name]}\t{archive}\t{archive.stat().st_size / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
