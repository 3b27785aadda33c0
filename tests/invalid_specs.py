"""A table of invalid TrainingJobs, each with the field the API must name when it rejects it.

Used twice: `kubetrain validate` must reject each with that field (tests/test_spec.py), and the real
API server must reject each with the same field (tests/test_crd_on_server.py), so the two agree.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubetrain.core import api

Json = Any


def base_job() -> dict[str, Json]:
    """A small valid job every case starts from."""
    return {
        "apiVersion": "kubetrain.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "valid"},
        "spec": {
            "nodes": 2,
            "procsPerNode": 2,
            "resources": {"cpu": "1", "memory": "1Gi"},
            "trainer": {"task": "digits", "maxSteps": 10},
            "checkpoint": {"claimName": "checkpoints"},
        },
    }


@dataclass(frozen=True)
class Case:
    id: str
    change: Callable[[dict[str, Json]], None]
    field: str  # the path the error must name

    def job(self) -> dict[str, Json]:
        job = copy.deepcopy(base_job())
        self.change(job)
        return job


def _set(path: str, value: Json) -> Callable[[dict[str, Json]], None]:
    def change(job: dict[str, Json]) -> None:
        *parents, leaf = path.split(".")
        node = job
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return change


def _delete(path: str) -> Callable[[dict[str, Json]], None]:
    def change(job: dict[str, Json]) -> None:
        *parents, leaf = path.split(".")
        node = job
        for key in parents:
            node = node[key]
        del node[leaf]
    return change


def _both(*changes: Callable[[dict[str, Json]], None]) -> Callable[[dict[str, Json]], None]:
    def change(job: dict[str, Json]) -> None:
        for each in changes:
            each(job)
    return change


INVALID: list[Case] = [
    Case("zero-nodes", _set("spec.nodes", 0), "spec.nodes"),
    Case("too-many-nodes", _set("spec.nodes", api.MAX_NODES + 1), "spec.nodes"),
    Case("nodes-not-integer", _set("spec.nodes", "two"), "spec.nodes"),
    Case("negative-gpus", _set("spec.gpusPerNode", -1), "spec.gpusPerNode"),
    Case("too-many-gpus", _set("spec.gpusPerNode", 17), "spec.gpusPerNode"),
    Case("procs-differ-from-gpus", _set("spec.gpusPerNode", 8), "spec.procsPerNode"),
    Case("zero-procs", _set("spec.procsPerNode", 0), "spec.procsPerNode"),
    Case("empty-image", _set("spec.image", ""), "spec.image"),
    Case("image-with-space", _set("spec.image", "my image"), "spec.image"),
    Case("trainer-and-command", _set("spec.command", ["python", "train.py"]), "spec"),
    Case("neither-trainer-nor-command", _delete("spec.trainer"), "spec"),
    Case("args-without-command", _set("spec.args", ["--lr", "1"]), "spec.args"),
    Case("unknown-task", _set("spec.trainer.task", "imagenet"), "spec.trainer.task"),
    Case("task-and-entrypoint", _set("spec.trainer.entrypoint", "pkg.mod:build"), "spec.trainer"),
    Case("bad-entrypoint", _both(_delete("spec.trainer.task"), _set("spec.trainer.entrypoint", "pkg.mod")),
         "spec.trainer.entrypoint"),
    Case("steps-and-epochs", _set("spec.trainer.epochs", 3), "spec.trainer.epochs"),
    Case("zero-steps", _set("spec.trainer.maxSteps", 0), "spec.trainer.maxSteps"),
    Case("unknown-strategy", _set("spec.trainer.strategy", "deepspeed"), "spec.trainer.strategy"),
    Case("unknown-precision", _set("spec.trainer.precision", "fp8"), "spec.trainer.precision"),
    Case("zero-batch", _set("spec.trainer.batchSize", 0), "spec.trainer.batchSize"),
    Case("zero-lr", _set("spec.trainer.optimizer", {"lr": 0}), "spec.trainer.optimizer.lr"),
    Case("unknown-optimizer", _set("spec.trainer.optimizer", {"name": "lion"}), "spec.trainer.optimizer.name"),
    Case("elastic-min-above-max", _both(_set("spec.elastic", {"minNodes": 3, "maxNodes": 2}), _set("spec.nodes", 2)),
         "spec.elastic.minNodes"),
    Case("nodes-outside-elastic-range", _set("spec.elastic", {"minNodes": 3, "maxNodes": 4}), "spec.nodes"),
    Case("elastic-without-max", _set("spec.elastic", {"minNodes": 1}), "spec.elastic.maxNodes"),
    Case("reserved-env-pet", _set("spec.env", [{"name": "PET_NNODES", "value": "4"}]), "spec.env[0].name"),
    Case("reserved-env-rank", _set("spec.env", [{"name": "RANK", "value": "0"}]), "spec.env[0].name"),
    Case("reserved-env-master-addr", _set("spec.env", [{"name": "NCCL_DEBUG", "value": "INFO"},
                                                       {"name": "MASTER_ADDR", "value": "x"}]),
         "spec.env[1].name"),
    Case("reserved-env-world-size", _set("spec.env", [{"name": "WORLD_SIZE", "value": "8"}]), "spec.env[0].name"),
    Case("bad-env-name", _set("spec.env", [{"name": "1BAD=", "value": "x"}]), "spec.env[0].name"),
    Case("reserved-volume-name", _set("spec.volumes", [{"name": "dshm", "emptyDir": {}}]), "spec.volumes[0].name"),
    Case("mount-over-shm", _both(_set("spec.volumes", [{"name": "scratch", "emptyDir": {}}]),
                                 _set("spec.volumeMounts", [{"name": "scratch", "mountPath": "/dev/shm"}])),
         "spec.volumeMounts[0].mountPath"),
    Case("mount-of-unknown-volume", _set("spec.volumeMounts", [{"name": "nope", "mountPath": "/nope"}]),
         "spec.volumeMounts"),
    Case("relative-checkpoint-path", _set("spec.checkpoint.path", "ckpt"), "spec.checkpoint.path"),
    Case("negative-checkpoint-interval", _set("spec.checkpoint.everySteps", -1), "spec.checkpoint.everySteps"),
    Case("multi-node-without-shared-checkpoints", _delete("spec.checkpoint.claimName"), "spec.checkpoint.claimName"),
    Case("negative-backoff", _set("spec.failurePolicy", {"backoffLimit": -1}), "spec.failurePolicy.backoffLimit"),
    Case("huge-stall-timeout", _set("spec.failurePolicy", {"stallTimeoutSeconds": 10**7}),
         "spec.failurePolicy.stallTimeoutSeconds"),
    Case("zero-deadline", _set("spec.runPolicy", {"activeDeadlineSeconds": 0}),
         "spec.runPolicy.activeDeadlineSeconds"),
    Case("unknown-clean-pod-policy", _set("spec.runPolicy", {"cleanPodPolicy": "Some"}),
         "spec.runPolicy.cleanPodPolicy"),
    Case("bad-managed-by", _set("spec.runPolicy", {"managedBy": "kueue"}), "spec.runPolicy.managedBy"),
    Case("bad-memory-quantity", _set("spec.resources", {"memory": "lots"}), "spec.resources.memory"),
    # Accepted by the quantity pattern, refused by the API server only when the operator creates the pods.
    Case("negative-memory", _set("spec.resources", {"memory": "-1Gi"}), "spec.resources.memory"),
    Case("zero-memory", _set("spec.resources", {"memory": "0Gi"}), "spec.resources.memory"),
    Case("zero-cpu", _set("spec.resources", {"cpu": "0"}), "spec.resources.cpu"),
    Case("negative-cpu-integer", _set("spec.resources", {"cpu": -2}), "spec.resources.cpu"),
    Case("negative-shared-memory", _set("spec.resources", {"sharedMemory": "-64Mi"}), "spec.resources.sharedMemory"),
    Case("bad-toleration-operator", _set("spec.scheduling", {"tolerations": [{"key": "a", "operator": "In"}]}),
         "spec.scheduling.tolerations[0].operator"),
    # The embedded core/v1 types have their real schemas (generated by crds/core_schemas.py), so a
    # typo inside them fails at `kubectl apply` rather than when the operator creates the pods.
    Case("volume-unknown-field", _set("spec.volumes", [{"name": "scratch", "persistentVolumeClaim": {
        "claimName": "scratch", "claimNam": "scratch"}}]), "spec.volumes[0].persistentVolumeClaim.claimNam"),
    Case("volume-wrong-type", _set("spec.volumes", [{"name": "host", "hostPath": {"path": 3}}]),
         "spec.volumes[0].hostPath.path"),
    Case("volume-missing-required", _set("spec.volumes", [{"name": "cache", "nfs": {"server": "nas"}}]),
         "spec.volumes[0].nfs.path"),
    Case("volume-bad-size-limit", _set("spec.volumes", [{"name": "scratch", "emptyDir": {"sizeLimit": "lots"}}]),
         "spec.volumes[0].emptyDir.sizeLimit"),
    Case("env-value-from-without-key", _set("spec.env", [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf"}}}]), "spec.env[0].valueFrom.secretKeyRef.key"),
    Case("env-value-from-unknown-field", _set("spec.env", [{"name": "TOKEN", "valueFrom": {"secretRef": {
        "name": "hf"}}}]), "spec.env[0].valueFrom.secretRef"),
    Case("affinity-unknown-field", _set("spec.scheduling", {"affinity": {"nodeAffinity": {
        "requiredDuringScheduling": {"nodeSelectorTerms": []}}}}),
         "spec.scheduling.affinity.nodeAffinity.requiredDuringScheduling"),
    Case("affinity-weight-not-integer", _set("spec.scheduling", {"affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": "high", "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname"}}]}}}),
         "spec.scheduling.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    Case("topology-not-a-label-key", _set("spec.scheduling", {"topology": "rack name"}), "spec.scheduling.topology"),
    Case("topology-empty-prefix", _set("spec.scheduling", {"topology": "/rack"}), "spec.scheduling.topology"),
    Case("topology-name-too-long", _set("spec.scheduling", {"topology": "example.com/" + "r" * 64}),
         "spec.scheduling.topology"),
    Case("unknown-spec-field", _set("spec.replicas", 2), "spec.replicas"),
    Case("unknown-trainer-field", _set("spec.trainer.learningRate", 0.1), "spec.trainer.learningRate"),
    Case("name-too-long", _set("metadata.name", "a" * 51), "metadata.name"),
    Case("name-starts-with-digit", _set("metadata.name", "1job"), "metadata.name"),
]
