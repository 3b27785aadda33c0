"""The two images have one name each, tagged with the release, wherever they are named.

`kubetrain/operator` and `kubetrain/trainer`, tag = the chart's appVersion: in the Dockerfiles' build
instructions, the chart's values, the operator's default trainer image, the CRD (no default of its own),
the examples and the docs. No cluster, no helm.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml

from kubetrain.cli.commands import main
from kubetrain.controller import operator_main
from kubetrain.core import api
from kubetrain.core.schema import crd_schema

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "kubetrain"
OPERATOR = "kubetrain/operator"
TRAINER = "kubetrain/trainer"
# Files that name the images for users; each reference must carry the release's tag.
DOCUMENTS = [
    ROOT / "README.md",
    CHART / "README.md",
    CHART / "values.yaml",
    CHART / "templates" / "NOTES.txt",
    ROOT / "docs" / "trainingjob-reference.md",
    *sorted((ROOT / "examples").rglob("*.yaml")),
]


def app_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return version


def dockerfile_build_tag(path: Path) -> str:
    """The image reference in the `docker build ... -t REF` line of a Dockerfile's header comment."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    tags = re.findall(r"docker build\b.*?\s-t\s+(\S+)", "\n".join(header))
    assert len(tags) == 1, f"{path}: expected one `docker build ... -t REF` line in the header, found {tags}"
    return str(tags[0])


@pytest.mark.parametrize(("dockerfile", "repository"),
                         [("Dockerfile", OPERATOR), ("trainer_image/Dockerfile", TRAINER)])
def test_dockerfiles_build_the_released_names(dockerfile: str, repository: str) -> None:
    assert dockerfile_build_tag(ROOT / dockerfile) == f"{repository}:{app_version()}"


def test_chart_values_point_at_both_images_tagged_with_the_app_version() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == OPERATOR
    assert values["trainer"]["image"]["repository"] == TRAINER
    assert values["image"]["tag"] == values["trainer"]["image"]["tag"] == ""  # "": the appVersion
    assert values["image"]["digest"] == values["trainer"]["image"]["digest"] == ""


def test_operator_default_trainer_image_is_the_release() -> None:
    assert f"{TRAINER}:{app_version()}" == api.DEFAULT_TRAINER_IMAGE
    (option,) = [p for p in main.commands["render"].params
                 if isinstance(p, click.Option) and "--trainer-image" in p.opts]
    assert option.default == api.DEFAULT_TRAINER_IMAGE
    assert operator_main.parser().get_default("trainer_image") == api.DEFAULT_TRAINER_IMAGE


def test_crd_leaves_the_image_to_the_operator() -> None:
    image = crd_schema()["properties"]["spec"]["properties"]["image"]
    assert "default" not in image, "a CRD default would hide the operator's --trainer-image from every job"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("trainingjob-*.yaml")), ids=lambda p: p.name)
def test_examples_use_the_operators_trainer_image(path: Path) -> None:
    assert "image" not in yaml.safe_load(path.read_text())["spec"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_name_the_images_with_the_release_tag(path: Path) -> None:
    text = path.read_text()
    assert "ghcr.io/kubetrain" not in text and "kubetrain-operator:" not in text
    for repository, tag in re.findall(r"\b(kubetrain/(?:operator|trainer)):([\w.-]+)", text):
        assert tag == app_version(), f"{path}: {repository}:{tag}"
