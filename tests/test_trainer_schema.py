"""The trainer and the API check KUBETRAIN_CONFIG's blocks against one schema.

trainer_image/kubetrain_trainer/config_schema.json is what the trainer validates its config against; the
CRD's spec.trainer, spec.data and spec.checkpoint properties are generated from it by crds/trainer_schema.py.
These tests keep the committed CRD in step with it and show, case by case, that the trainer and
`kubetrain validate` (which evaluates the CRD as the API server does) accept and reject the same configs.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from crds import trainer_schema
from crds.trainer_schema import CRD, GeneratorError, load_schema, render
from kubetrain.core import schema as crd_validation
from kubetrain_trainer import config
from kubetrain_trainer.config import ConfigError, parse_config
from tests.invalid_specs import base_job

Json = Any
SECTIONS = ("trainer", "data", "checkpoint")
OPTIONS_32 = {f"k{i}": "v" for i in range(32)}

# (id, the blocks the operator would pass, whether both must accept them).
CASES: list[tuple[str, dict[str, Json], bool]] = [
    ("defaults", {}, True),
    ("checkpoint-only-at-the-end", {"checkpoint": {"everySteps": 0}}, True),
    ("checkpoint-interval-max", {"checkpoint": {"everySteps": 100_000_000}}, True),
    ("checkpoint-interval-negative", {"checkpoint": {"everySteps": -1}}, False),
    ("checkpoint-interval-too-large", {"checkpoint": {"everySteps": 100_000_001}}, False),
    ("keep-max", {"checkpoint": {"keep": 100}}, True),
    ("keep-zero", {"checkpoint": {"keep": 0}}, False),
    ("checkpoint-path-empty", {"checkpoint": {"path": ""}}, False),
    ("data-path-relative", {"data": {"path": "data"}}, False),
    ("workers-zero", {"data": {"workers": 0}}, True),
    ("workers-too-many", {"data": {"workers": 65}}, False),
    ("drop-last-not-a-boolean", {"data": {"dropLast": 1}}, False),
    ("lr-max", {"trainer": {"optimizer": {"lr": 10}}}, True),
    ("lr-zero", {"trainer": {"optimizer": {"lr": 0}}}, False),
    ("lr-too-large", {"trainer": {"optimizer": {"lr": 10.5}}}, False),
    ("optimizer-unknown", {"trainer": {"optimizer": {"name": "lamb"}}}, False),
    ("batch-size-max", {"trainer": {"batchSize": 65536}}, True),
    ("batch-size-zero", {"trainer": {"batchSize": 0}}, False),
    ("batch-size-too-large", {"trainer": {"batchSize": 65537}}, False),
    ("batch-size-boolean", {"trainer": {"batchSize": True}}, False),
    ("batch-size-string", {"trainer": {"batchSize": "32"}}, False),
    ("log-every-zero", {"trainer": {"logEverySteps": 0}}, False),
    ("min-lr-ratio-bounds", {"trainer": {"minLrRatio": 0, "gradClip": 0}}, True),
    ("min-lr-ratio-too-large", {"trainer": {"minLrRatio": 1.5}}, False),
    ("seed-max", {"trainer": {"seed": 4294967295}}, True),
    ("seed-negative", {"trainer": {"seed": -1}}, False),
    ("compile-string", {"trainer": {"compile": "yes"}}, False),
    ("task-unknown", {"trainer": {"task": "mnist"}}, False),
    ("precision-unknown", {"trainer": {"precision": "fp8"}}, False),
    ("strategy-unknown", {"trainer": {"strategy": "zero"}}, False),
    ("entrypoint", {"trainer": {"entrypoint": "pkg.mod:build"}}, True),
    ("entrypoint-without-function", {"trainer": {"entrypoint": "no_colon"}}, False),
    ("entrypoint-bad-module", {"trainer": {"entrypoint": "1pkg:build"}}, False),
    ("task-and-entrypoint", {"trainer": {"task": "digits", "entrypoint": "pkg.mod:build"}}, False),
    ("steps-and-epochs", {"trainer": {"maxSteps": 5, "epochs": 1}}, False),
    ("options-max", {"trainer": {"options": OPTIONS_32}}, True),
    ("options-too-many", {"trainer": {"options": {**OPTIONS_32, "k32": "v"}}}, False),
    ("option-not-a-string", {"trainer": {"options": {"layers": 2}}}, False),
    ("option-too-long", {"trainer": {"options": {"layers": "x" * 257}}}, False),
    ("unknown-trainer-key", {"trainer": {"maxStep": 5}}, False),
    ("unknown-optimizer-key", {"trainer": {"optimizer": {"beta": 0.9}}}, False),
    ("unknown-data-key", {"data": {"worker": 1}}, False),
    ("unknown-checkpoint-key", {"checkpoint": {"every": 1}}, False),
]


def _with_task(blocks: dict[str, Json]) -> dict[str, Json]:
    """The CRD requires a task or an entrypoint; the trainer defaults to digits."""
    blocks = copy.deepcopy(blocks)
    trainer = blocks.setdefault("trainer", {})
    if "entrypoint" not in trainer:
        trainer.setdefault("task", "digits")
    return blocks


def _api_accepts(blocks: dict[str, Json]) -> bool:
    job = base_job()
    spec = job["spec"]
    spec["trainer"] = blocks["trainer"]
    spec["data"] = blocks.get("data", {})
    spec["checkpoint"] = {**blocks.get("checkpoint", {}), "claimName": spec["checkpoint"]["claimName"]}
    _, problems = crd_validation.validate_object(job)
    return not problems


def _trainer_accepts(blocks: dict[str, Json]) -> bool:
    try:
        parse_config(blocks, env={})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("blocks", "accepted"), [pytest.param(b, a, id=i) for i, b, a in CASES])
def test_the_trainer_and_the_api_accept_the_same_configs(blocks: dict[str, Json], accepted: bool) -> None:
    blocks = _with_task(blocks)
    assert (_api_accepts(blocks), _trainer_accepts(blocks)) == (accepted, accepted)


def test_the_crd_is_generated_from_the_trainers_schema() -> None:
    text = CRD.read_text()
    assert render(text, load_schema()) == text, f"run {trainer_schema.COMMAND}"
    properties = crd_validation.crd_schema()["properties"]["spec"]["properties"]
    for section in SECTIONS:
        served = {k: v for k, v in properties[section]["properties"].items() if k != "claimName"}
        assert served == load_schema()["properties"][section]["properties"], section


def test_changing_the_schema_or_the_crd_alone_fails_the_check(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    text = CRD.read_text()
    changed = json.loads(json.dumps(load_schema()))
    changed["properties"]["checkpoint"]["properties"]["everySteps"]["minimum"] = 1
    assert render(text, changed) != text
    edited = text.replace("keep: {type: integer, minimum: 1, maximum: 100,", "keep: {type: integer, minimum: 0, "
                                                                            "maximum: 100,")
    assert edited != text
    crd = tmp_path / "crds" / "trainingjobs.kubetrain.io.yaml"
    crd.parent.mkdir()
    crd.write_text(edited)
    monkeypatch.setattr(trainer_schema, "CRD", crd)
    monkeypatch.setattr(trainer_schema, "ROOT", tmp_path)
    assert trainer_schema.main(["--check"]) == 1
    assert trainer_schema.main([]) == 0
    assert crd.read_text() == text


def test_every_region_must_name_a_section_of_the_schema() -> None:
    with pytest.raises(GeneratorError, match="no section 'model'"):
        render("# BEGIN generated: kubetrain_trainer model\n# END generated: kubetrain_trainer model", load_schema())
    with pytest.raises(GeneratorError, match="exactly one region"):
        render("", load_schema())


def test_the_schemas_defaults_are_the_trainers_and_its_keys_its_fields() -> None:
    defaults = parse_config({}, env={})
    for section in SECTIONS:
        properties = load_schema()["properties"][section]["properties"]
        parsed = getattr(defaults, section)
        fields = {f.name for f in dataclasses.fields(parsed)}
        assert fields == {config._snake(key) for key in properties}, section
        for key, prop in properties.items():
            if "default" in prop and prop["type"] != "object":
                assert getattr(parsed, config._snake(key)) == prop["default"], f"{section}.{key}"
    for key, prop in load_schema()["properties"]["trainer"]["properties"]["optimizer"]["properties"].items():
        assert getattr(defaults.trainer.optimizer, config._snake(key)) == prop["default"], key


def test_a_keyword_the_trainer_does_not_implement_fails_loudly() -> None:
    with pytest.raises(ConfigError, match=r"unsupported keyword.*multipleOf"):
        config._check_value({"type": "integer", "multipleOf": 2}, 3, "trainer.batchSize")
