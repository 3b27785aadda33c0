"""docs/trainingjob-reference.md is generated from the CRD and must stay in step with it."""

from __future__ import annotations

from pathlib import Path

from kubetrain.core.reference import render_reference
from kubetrain.core.schema import crd_schema

REFERENCE = Path(__file__).parent.parent / "docs" / "trainingjob-reference.md"


def test_reference_matches_the_crd() -> None:
    assert REFERENCE.read_text() == render_reference(), (
        "run: python -m kubetrain.core.reference > docs/trainingjob-reference.md")


def test_every_spec_field_is_documented() -> None:
    text = render_reference()
    for name in crd_schema()["properties"]["spec"]["properties"]:
        assert f"`spec.{name}`" in text
    assert "`spec.trainer.optimizer.lr`" in text and "`status.progress.eta`" in text
