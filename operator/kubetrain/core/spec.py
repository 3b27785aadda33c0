"""Parse a TrainingJob into typed, frozen objects after defaulting and validating it against the CRD."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kubetrain.core import api
from kubetrain.core.schema import Problem, apply_defaults, crd_schema, validate_object

__all__ = [
    "CheckpointSpec",
    "DataSpec",
    "ElasticRange",
    "FailurePolicy",
    "JobSpec",
    "Resources",
    "RunPolicy",
    "Scheduling",
    "SpecError",
    "TrainingJob",
    "parse",
    "validate",
]

Json = Any


class SpecError(ValueError):
    """A TrainingJob that the API server would reject; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _frozen(value: Json) -> Json:
    """Read-only views of nested JSON, so a parsed job cannot be changed by accident."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def thaw(value: Json) -> Json:
    """Plain dicts and lists again, for building manifests."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ElasticRange:
    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    shared_memory: str


@dataclass(frozen=True)
class DataSpec:
    path: str
    claim_name: str | None
    workers: int


@dataclass(frozen=True)
class CheckpointSpec:
    path: str
    claim_name: str | None
    every_steps: int
    keep: int


@dataclass(frozen=True)
class FailurePolicy:
    backoff_limit: int
    max_restarts: int
    stall_timeout_seconds: int
    restart_on_oom: bool
    node_lost_timeout_seconds: int
    rendezvous_timeout_seconds: int
    disruption_limit: int
    exclude_node_after: int  # failures pointing at one node, in distinct attempts, before the job avoids it
    restart_in_place: bool  # torchrun's failure has the kubelet restart the pod's containers where it stands


@dataclass(frozen=True)
class RunPolicy:
    active_deadline_seconds: int | None
    ttl_seconds_after_finished: int | None
    suspend: bool
    clean_pod_policy: str
    managed_by: str
    termination_grace_period_seconds: int


@dataclass(frozen=True)
class Scheduling:
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Json], ...]
    affinity: Mapping[str, Json] | None
    priority_class_name: str | None
    scheduler_name: str | None
    topology: str | None = None  # a node-label key the whole gang shares (its PodGroup's topology constraint)
    # Not in the CRD: what Kueue's admission checks add to the pods (podSetUpdates; queueing.placed sets them).
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSpec:
    image: str | None  # None: the operator's trainer image (see manifests.container_image)
    command: tuple[str, ...] | None
    args: tuple[str, ...]
    trainer: Mapping[str, Json] | None
    nodes: int
    elastic: ElasticRange | None
    gpus_per_node: int
    procs_per_node: int
    resources: Resources
    env: tuple[Mapping[str, Json], ...]
    volumes: tuple[Mapping[str, Json], ...]
    volume_mounts: tuple[Mapping[str, Json], ...]
    data: DataSpec
    checkpoint: CheckpointSpec
    failure_policy: FailurePolicy
    run_policy: RunPolicy
    scheduling: Scheduling
    # The defaulted trainer, data and checkpoint blocks, handed to the trainer image as JSON.
    trainer_config: Mapping[str, Json] = field(repr=False)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: a fixed count, or MIN:MAX for elastic jobs."""
        if self.elastic is None:
            return str(self.nodes)
        return f"{self.elastic.min_nodes}:{self.elastic.max_nodes}"

    @property
    def samples_per_step(self) -> int | None:
        """Samples one optimizer step consumes across the world (built-in trainer only)."""
        if self.trainer is None:
            return None
        return int(self.trainer["batchSize"]) * int(self.trainer["gradAccumulation"]) * self.world_size

    @property
    def total_steps(self) -> int | None:
        """Planned optimizer steps, when the built-in trainer says so up front."""
        if self.trainer is None:
            return None
        steps = self.trainer.get("maxSteps")
        return int(steps) if steps is not None else None


@dataclass(frozen=True)
class TrainingJob:
    name: str
    namespace: str
    uid: str
    generation: int
    labels: Mapping[str, str]
    spec: JobSpec
    created: str | None = None  # metadata.creationTimestamp, set by the API server
    annotations: Mapping[str, str] = field(default_factory=dict)  # which bump no generation either


def validate(obj: Json, old: Json = None) -> list[Problem]:
    """Every problem the API server would report for this object (empty when it is valid)."""
    return _checked(obj, old)[1]


def _checked(obj: Json, old: Json) -> tuple[Json, list[Problem]]:
    problems: list[Problem] = []
    if isinstance(obj, dict):
        if obj.get("apiVersion") != api.API_VERSION:
            problems.append(Problem("apiVersion", f"must be {api.API_VERSION} (got {obj.get('apiVersion')!r})"))
        if obj.get("kind") != api.KIND:
            problems.append(Problem("kind", f"must be {api.KIND} (got {obj.get('kind')!r})"))
        metadata = obj.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
            problems.append(Problem("metadata.name", "is required"))
            return obj, problems
    defaulted, schema_problems = validate_object(obj, old)
    return defaulted, problems + schema_problems


def parse(obj: Json, old: Json = None, *, check: bool = True) -> TrainingJob:
    """Default, validate and convert a TrainingJob object; raise SpecError with every problem.

    ``check=False`` skips validation for objects the API server has validated already (the
    operator's hot path); defaults are still applied.
    """
    if check:
        defaulted, problems = _checked(obj, old)
        if problems:
            raise SpecError(problems)
    else:
        defaulted = apply_defaults(crd_schema(), obj)
    metadata = defaulted["metadata"]
    return TrainingJob(
        name=metadata["name"],
        namespace=metadata.get("namespace") or "default",
        uid=metadata.get("uid") or "",
        generation=int(metadata.get("generation") or 0),
        labels=_frozen(metadata.get("labels") or {}),
        spec=_job_spec(defaulted["spec"]),
        created=metadata.get("creationTimestamp"),
        annotations=_frozen(metadata.get("annotations") or {}),
    )


def _job_spec(spec: Mapping[str, Json]) -> JobSpec:
    elastic = spec.get("elastic")
    resources = spec["resources"]
    data = spec["data"]
    checkpoint = spec["checkpoint"]
    gpus = int(spec["gpusPerNode"])
    procs = spec.get("procsPerNode") or gpus or 1
    trainer = spec.get("trainer")
    return JobSpec(
        image=spec.get("image"),
        command=tuple(spec["command"]) if "command" in spec else None,
        args=tuple(spec.get("args", ())),
        trainer=_frozen(trainer) if trainer is not None else None,
        nodes=int(spec["nodes"]),
        elastic=ElasticRange(int(elastic["minNodes"]), int(elastic["maxNodes"])) if elastic else None,
        gpus_per_node=gpus,
        procs_per_node=int(procs),
        resources=Resources(str(resources["cpu"]), str(resources["memory"]), str(resources["sharedMemory"])),
        env=_frozen(spec.get("env", [])),
        volumes=_frozen(spec.get("volumes", [])),
        volume_mounts=_frozen(spec.get("volumeMounts", [])),
        data=DataSpec(data["path"], data.get("claimName"), int(data["workers"])),
        checkpoint=CheckpointSpec(
            checkpoint["path"], checkpoint.get("claimName"), int(checkpoint["everySteps"]), int(checkpoint["keep"])
        ),
        failure_policy=_failure_policy(spec["failurePolicy"]),
        run_policy=_run_policy(spec["runPolicy"]),
        scheduling=_scheduling(spec["scheduling"]),
        trainer_config=_frozen({
            "trainer": trainer or {},
            # Where volumes come from is the operator's business, not the trainer's.
            "data": {k: v for k, v in data.items() if k != "claimName"},
            "checkpoint": {k: v for k, v in checkpoint.items() if k != "claimName"},
        }),
    )


def _failure_policy(failure: Mapping[str, Json]) -> FailurePolicy:
    return FailurePolicy(
        backoff_limit=int(failure["backoffLimit"]),
        max_restarts=int(failure["maxRestarts"]),
        stall_timeout_seconds=int(failure["stallTimeoutSeconds"]),
        restart_on_oom=bool(failure["restartOnOOM"]),
        node_lost_timeout_seconds=int(failure["nodeLostTimeoutSeconds"]),
        rendezvous_timeout_seconds=int(failure["rendezvousTimeoutSeconds"]),
        disruption_limit=int(failure["disruptionLimit"]),
        exclude_node_after=int(failure["excludeNodeAfter"]),
        restart_in_place=bool(failure["restartInPlace"]),
    )


def _run_policy(run: Mapping[str, Json]) -> RunPolicy:
    return RunPolicy(
        active_deadline_seconds=run.get("activeDeadlineSeconds"),
        ttl_seconds_after_finished=run.get("ttlSecondsAfterFinished"),
        suspend=bool(run["suspend"]),
        clean_pod_policy=run["cleanPodPolicy"],
        managed_by=run["managedBy"],
        termination_grace_period_seconds=int(run["terminationGracePeriodSeconds"]),
    )


def _scheduling(scheduling: Mapping[str, Json]) -> Scheduling:
    return Scheduling(
        node_selector=_frozen(scheduling.get("nodeSelector", {})),
        tolerations=_frozen(scheduling.get("tolerations", [])),
        affinity=_frozen(scheduling["affinity"]) if "affinity" in scheduling else None,
        priority_class_name=scheduling.get("priorityClassName") or None,
        scheduler_name=scheduling.get("schedulerName") or None,
        topology=scheduling.get("topology") or None,
    )
