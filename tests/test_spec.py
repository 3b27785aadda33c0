"""Defaulting, validation and parsing of TrainingJobs (the pure core, no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.core.schema import crd_schema
from kubetrain.core.spec import SpecError, parse, validate
from tests.invalid_specs import INVALID, Case, base_job

EXAMPLES = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.yaml"))


def test_there_are_at_least_30_invalid_cases() -> None:
    assert len(INVALID) >= 30
    assert len({case.id for case in INVALID}) == len(INVALID)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_spec_is_rejected_naming_the_field(case: Case) -> None:
    problems = validate(case.job())
    assert problems, f"{case.id} was accepted"
    assert case.field in {p.path for p in problems}, problems


def test_base_job_is_valid() -> None:
    assert validate(base_job()) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    assert validate(yaml.safe_load(path.read_text())) == []


def test_defaults_are_applied() -> None:
    job = parse(base_job())
    spec = job.spec
    assert spec.image is None  # no CRD default: the operator's configured trainer image applies
    assert spec.failure_policy.backoff_limit == 3
    assert spec.failure_policy.stall_timeout_seconds == 600
    assert spec.run_policy.clean_pod_policy == "Running"
    assert spec.run_policy.managed_by == "kubetrain.io/operator"
    assert spec.checkpoint.path == "/checkpoints"
    assert spec.trainer is not None and spec.trainer["strategy"] == "ddp"
    assert spec.trainer["optimizer"] == {"name": "adamw", "lr": 0.001, "weightDecay": 0.0, "momentum": 0.9}
    assert job.namespace == "default"


def test_procs_per_node_follows_gpus() -> None:
    job = base_job()
    job["spec"]["gpusPerNode"] = 4
    del job["spec"]["procsPerNode"]
    spec = parse(job).spec
    assert (spec.procs_per_node, spec.world_size, spec.gpus) == (4, 8, 8)


def test_cpu_job_without_procs_runs_one_process_per_node() -> None:
    job = base_job()
    del job["spec"]["procsPerNode"]
    assert parse(job).spec.world_size == 2


def test_elastic_nnodes_is_a_range() -> None:
    job = base_job()
    job["spec"]["elastic"] = {"minNodes": 1, "maxNodes": 4}
    assert parse(job).spec.nnodes == "1:4"
    assert parse(base_job()).spec.nnodes == "2"


def test_trainer_config_omits_volume_claims() -> None:
    job = base_job()
    job["spec"]["checkpoint"] = {"claimName": "ckpt"}
    config = parse(job).spec.trainer_config
    assert "claimName" not in config["checkpoint"]
    assert config["checkpoint"]["everySteps"] == 100


def test_parse_raises_with_every_problem() -> None:
    job = base_job()
    job["spec"]["nodes"] = 0
    job["spec"]["trainer"]["batchSize"] = 0
    with pytest.raises(SpecError) as raised:
        parse(job)
    assert {p.path for p in raised.value.problems} == {"spec.nodes", "spec.trainer.batchSize"}


def test_parsed_job_is_read_only() -> None:
    spec = parse(base_job()).spec
    with pytest.raises(TypeError):
        spec.trainer["task"] = "gpt"  # type: ignore[index]


def test_wrong_kind_and_missing_name() -> None:
    paths = {p.path for p in validate({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}})}
    assert {"apiVersion", "kind", "metadata.name"} <= paths


def test_messages_say_what_is_allowed() -> None:
    job = base_job()
    job["spec"]["nodes"] = 0
    job["spec"]["trainer"]["strategy"] = "zero"
    messages = {p.path: p.message for p in validate(job)}
    assert messages["spec.nodes"] == "must be at least 1 (got 0)"
    assert messages["spec.trainer.strategy"].startswith("must be one of ddp, fsdp")


# One change per freezing rule: (the field the error names, how the spec changes).
FROZEN = (
    ("spec.image", lambda spec: spec.update(image="other:1")),
    ("spec.trainer", lambda spec: spec["trainer"].update(maxSteps=20)),
    ("spec.gpusPerNode", lambda spec: spec.update(procsPerNode=1)),
    ("spec.resources", lambda spec: spec["resources"].update(cpu="2")),
    ("spec.env", lambda spec: spec.update(env=[{"name": "SEED", "value": "1"}])),
    ("spec.checkpoint", lambda spec: spec["checkpoint"].update(everySteps=7)),
    ("spec.nodes", lambda spec: spec.update(nodes=3)),
)


class TestTransitionRules:
    """Fields frozen while the job is active (CEL transition rules) — checked on updates only."""

    @staticmethod
    def _running(job: dict, phase: str = "Running") -> dict:  # type: ignore[type-arg]
        return {**job, "status": {"phase": phase}}

    def test_image_cannot_change_while_running(self) -> None:
        old = self._running(base_job())
        new = base_job()
        new["spec"]["image"] = "other:1"
        assert "spec.image" in {p.path for p in validate(new, old)}

    def test_unset_image_stays_valid_while_running(self) -> None:
        old = self._running(base_job())
        assert validate(base_job(), old) == []

    def test_image_cannot_be_set_or_unset_while_running(self) -> None:
        with_image = base_job()
        with_image["spec"]["image"] = "other:1"
        assert "spec.image" in {p.path for p in validate(with_image, self._running(base_job()))}
        assert "spec.image" in {p.path for p in validate(base_job(), self._running(with_image))}

    def test_image_may_change_while_suspended(self) -> None:
        old = {**base_job(), "status": {"phase": "Suspended"}}
        new = base_job()
        new["spec"]["image"] = "other:1"
        assert validate(new, old) == []

    def test_fixed_size_job_cannot_scale_while_running(self) -> None:
        new = base_job()
        new["spec"]["nodes"] = 3
        assert "spec.nodes" in {p.path for p in validate(new, self._running(base_job()))}

    def test_elastic_job_scales_while_running(self) -> None:
        old = base_job()
        old["spec"]["elastic"] = {"minNodes": 1, "maxNodes": 4}
        new = base_job()
        new["spec"]["elastic"] = {"minNodes": 1, "maxNodes": 4}
        new["spec"]["nodes"] = 3
        assert validate(new, self._running(old)) == []

    @pytest.mark.parametrize(("field", "change"), FROZEN, ids=[field for field, _ in FROZEN])
    @pytest.mark.parametrize("phase", ["Running", "Starting", "Succeeded", "Failed"])
    def test_a_shaping_field_is_frozen_once_the_job_is_active(self, field: str, change: Any, phase: str) -> None:
        new = base_job()
        change(new["spec"])
        assert field in {p.path for p in validate(new, self._running(base_job(), phase))}

    @pytest.mark.parametrize(("field", "change"), FROZEN, ids=[field for field, _ in FROZEN])
    @pytest.mark.parametrize("status", [None, {}, {"phase": "Suspended"}], ids=["none", "empty", "suspended"])
    def test_a_shaping_field_may_change_before_the_start_or_while_suspended(self, field: str, change: Any,
                                                                             status: Any) -> None:
        old = base_job() if status is None else {**base_job(), "status": status}
        new = base_job()
        change(new["spec"])
        assert validate(new, old) == []

    def test_each_freezing_rule_compares_its_field_before_reading_the_status(self) -> None:
        # The server runs them on every status write too, where the field is unchanged: the comparison
        # first settles them there (measured: about 2 ms less of the API server's CPU per status write).
        root = crd_schema()
        rules = [v["rule"] for v in root["x-kubernetes-validations"] if "oldSelf.status" in v["rule"]]
        assert len(rules) == 10
        for rule in rules:
            first, _, rest = rule.partition(" || !has(oldSelf.status)")
            assert rest and "status" not in first, rule

    def test_managed_by_is_immutable(self) -> None:
        new = base_job()
        new["spec"]["runPolicy"] = {"managedBy": "kueue.x-k8s.io/multikueue"}
        assert "spec.runPolicy.managedBy" in {p.path for p in validate(new, base_job())}
