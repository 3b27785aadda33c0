"""Pure builders: a TrainingJob in, the headless Service, the pods of one attempt and their PodGroup out (plain dicts).

The pod contract (its variables are listed in trainer_image/README.md): one pod per node named
``<job>-<index>`` (naming.py), hostname and subdomain so that ``<job>-0.<job>`` resolves before anything is ready,
torchrun configured through the PET_* variables it reads natively (launch.py), ``restartPolicy: Never``
because restarts are gang restarts decided by the operator, and the restricted Pod Security profile.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kubetrain.core import api
from kubetrain.core.launch import (
    RENDEZVOUS_HOST_INDEX,
    Placement,
    launch_env,
    lost_pod_wait_seconds,
    program_args,
    rendezvous_id,
)
from kubetrain.core.naming import identity_labels, job_labels, pod_group_name, pod_name
from kubetrain.core.spec import TrainingJob, thaw

__all__ = [
    "build_pod",
    "build_pod_group",
    "build_pods",
    "build_service",
    "container_image",
    "in_place_rule",
    "owner_reference",
]

Json = Any

# A non-root identity for images that do not declare one; the trainer image uses it too.
RUN_AS_USER = 1000
# torchrun's exit code once its workers failed (and its own --max-restarts are spent).
TORCHRUN_FAILED = 1


def owner_reference(job: TrainingJob) -> dict[str, Json]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: TrainingJob, name: str, labels: dict[str, str]) -> dict[str, Json]:
    metadata: dict[str, Json] = {"name": name, "namespace": job.namespace, "labels": labels}
    if job.uid:  # `kubetrain render` has no uid: the API server assigns it on create
        metadata["ownerReferences"] = [owner_reference(job)]
    return metadata


def build_service(job: TrainingJob) -> dict[str, Json]:
    """The headless Service that gives every pod the DNS name ``<job>-<index>.<job>``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, job.name, job_labels(job)),
        "spec": {
            "clusterIP": "None",
            # Rendezvous starts before any pod is ready: resolve names of unready pods too.
            "publishNotReadyAddresses": True,
            "selector": identity_labels(job),
            "ports": [
                {"name": "rendezvous", "port": api.RENDEZVOUS_PORT, "targetPort": api.RENDEZVOUS_PORT},
                {"name": "metrics", "port": api.METRICS_PORT, "targetPort": api.METRICS_PORT},
            ],
        },
    }


def build_pod_group(job: TrainingJob, attempt: int) -> dict[str, Json]:
    """The PodGroup of one attempt (scheduling.k8s.io/v1beta1, with gang scheduling on): kube-scheduler binds
    none of the attempt's pods until it can bind minCount of them, so a gang never half-starts and holds nothing
    while it waits. No Workload object: the group's spec carries the policy (workloadRef is optional)."""
    spec = job.spec
    labels = job_labels(job) | {api.LABEL.ATTEMPT: str(attempt)}
    group_spec: dict[str, Json] = {
        # An elastic job runs with minNodes; more pods join as they are placed.
        "schedulingPolicy": {"gang": {
            "minCount": spec.elastic.min_nodes if spec.elastic is not None else spec.nodes}},
    }
    if spec.scheduling.topology:  # every pod of the gang in one domain of that node label
        group_spec["schedulingConstraints"] = {"topology": [{"key": spec.scheduling.topology}]}
    return {
        "apiVersion": f"{api.PODGROUP.GROUP}/{api.PODGROUP.VERSION}",
        "kind": api.PODGROUP.KIND,
        "metadata": _metadata(job, pod_group_name(job.name, attempt), labels),
        "spec": group_spec,
    }


def _launcher(job: TrainingJob, index: int) -> dict[str, Json]:
    """The container's command: torchrun, with a name for this agent in the rendezvous (api.ENV.LOCAL_ADDR) that
    no other run of it shares: a replacement pod's (failures.replace_lost_pods), or this pod's after the kubelet
    restarted it in place, joins as a new member; torch would take one of the same name for the member it already
    has and skip the rendezvous. The shell's read draws a fresh suffix in every run, then hands over to torchrun.

    Not for node 0: its agent hosts the store, which a new run starts empty, and its name is the address the workers
    meet at (torch's default, its FQDN). The others' names start like their FQDN, so that torch, which ranks the
    agents by name, still makes node 0 global rank 0 (progress.py reads it there).
    """
    if index == RENDEZVOUS_HOST_INDEX:
        return {"command": ["torchrun"], "args": program_args(job)}
    script = (f'read -r run < /proc/sys/kernel/random/uuid && {api.ENV.LOCAL_ADDR}="${api.ENV.POD_NAME}.${{run%%-*}}" '
              'exec torchrun "$@"')
    return {"command": ["sh", "-c", script, "torchrun"], "args": program_args(job)}


def in_place_rule(job: TrainingJob, nodes_restart_in_place: bool) -> dict[str, Json]:
    """The container fields that have the kubelet restart the pod's containers in place when torchrun fails (it
    exits TORCHRUN_FAILED once its workers failed and its own --max-restarts are spent): the pod keeps its node, IP,
    volumes and devices (failures.handle_in_place_restarts accounts for it). The scheduler places such a pod only on a
    node whose kubelet declares the feature (nodes.IN_PLACE_FEATURE): the operator leaves the rule out unless every
    node does, and the gang then restarts with new pods as before."""
    if not (job.spec.failure_policy.restart_in_place and nodes_restart_in_place):
        return {}
    return {"restartPolicy": "Never",
            "restartPolicyRules": [{"action": "RestartAllContainers",
                                    "exitCodes": {"operator": "In", "values": [TORCHRUN_FAILED]}}]}


def _env(job: TrainingJob, index: int, attempt: int) -> list[dict[str, Json]]:
    placement = Placement(
        rendezvous_endpoint=f"{pod_name(job.name, RENDEZVOUS_HOST_INDEX)}.{job.name}:{api.RENDEZVOUS_PORT}",
        metrics_port=api.METRICS_PORT,
        checkpoint_dir=job.spec.checkpoint.path,
        data_dir=job.spec.data.path,
    )
    env: list[dict[str, Json]] = [{"name": name, "value": value}
                                  for name, value in launch_env(job, index, attempt, placement).items()]
    wait = lost_pod_wait_seconds(job)
    if wait is not None:  # a pod, unlike `kubetrain run`'s processes, is replaced when lost
        env.append({"name": api.ENV.REJOIN_TIMEOUT, "value": str(wait)})
    env += [
        {"name": api.ENV.NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": api.ENV.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": api.ENV.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": api.ENV.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    return env + [thaw(e) for e in job.spec.env]


def _ports(job: TrainingJob) -> list[dict[str, Json]]:
    ports = [{"name": "rendezvous", "containerPort": api.RENDEZVOUS_PORT, "protocol": "TCP"}]
    # One metrics endpoint per local rank: base port + local rank (no multiprocess files to clean).
    for local_rank in range(job.spec.procs_per_node):
        name = "metrics" if local_rank == 0 else f"metrics-{local_rank}"
        ports.append({"name": name, "containerPort": api.METRICS_PORT + local_rank, "protocol": "TCP"})
    return ports


def _resources(job: TrainingJob) -> dict[str, Json]:
    spec = job.spec
    amounts: dict[str, Json] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    limits = dict(amounts)
    if spec.gpus_per_node:
        limits[api.GPU_RESOURCE] = str(spec.gpus_per_node)
    # Requests equal limits: Guaranteed QoS, so training pods are the last to be evicted.
    return {"requests": dict(limits), "limits": limits}


def _volumes(job: TrainingJob) -> tuple[list[dict[str, Json]], list[dict[str, Json]]]:
    spec = job.spec
    volumes: list[dict[str, Json]] = [
        {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shared_memory}},
    ]
    mounts: list[dict[str, Json]] = [{"name": api.SHM_VOLUME, "mountPath": "/dev/shm"}]
    if spec.checkpoint.claim_name:
        volumes.append({"name": api.CHECKPOINT_VOLUME,
                        "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}})
    else:
        # Without a claim, checkpoints still guard against in-place worker restarts (maxRestarts).
        volumes.append({"name": api.CHECKPOINT_VOLUME, "emptyDir": {}})
    mounts.append({"name": api.CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.path})
    if spec.data.claim_name:
        volumes.append({"name": api.DATA_VOLUME,
                        "persistentVolumeClaim": {"claimName": spec.data.claim_name, "readOnly": True}})
        mounts.append({"name": api.DATA_VOLUME, "mountPath": spec.data.path, "readOnly": True})
    return volumes + [thaw(v) for v in spec.volumes], mounts + [thaw(m) for m in spec.volume_mounts]


def _tolerations(job: TrainingJob) -> list[dict[str, Json]]:
    spec = job.spec
    lost = spec.failure_policy.node_lost_timeout_seconds
    # Evict (and so gang-restart) soon after a node is lost, instead of the cluster's 300 s default.
    tolerations: list[dict[str, Json]] = [
        {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": lost}
        for taint in ("not-ready", "unreachable")
    ]
    if spec.gpus_per_node:
        tolerations.append({"key": api.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations + [thaw(t) for t in spec.scheduling.tolerations]


def _spread(job: TrainingJob) -> dict[str, Json]:
    """Prefer one pod per machine: two "nodes" of a job sharing a machine share its NICs and memory bandwidth."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": identity_labels(job)}},
    }]}}


def container_image(job: TrainingJob, default_image: str) -> str:
    """The job's own image, else the operator's (so a cluster sets its trainer image once, not per job)."""
    return job.spec.image or default_image


def build_pod(job: TrainingJob, index: int, attempt: int, *, default_image: str = api.DEFAULT_TRAINER_IMAGE,
              gang: bool = False, avoid: Sequence[str] = (), nodes_restart_in_place: bool = True) -> dict[str, Json]:
    """The pod for node ``index`` of attempt ``attempt``; ``default_image`` serves jobs without spec.image;
    with ``gang`` the pod belongs to its attempt's PodGroup (build_pod_group); it is not placed on the nodes
    named in ``avoid`` (the job's status.excludedNodes); ``nodes_restart_in_place``: every node's kubelet declares
    the in-place restart (in_place_rule)."""
    spec = job.spec
    name = pod_name(job.name, index)
    own = job_labels(job) | {api.LABEL.NODE_INDEX: str(index), api.LABEL.ATTEMPT: str(attempt)}
    metadata = _metadata(job, name, {**spec.scheduling.pod_labels, **own})
    metadata["annotations"] = {**spec.scheduling.pod_annotations,
                               f"{api.ANNOTATION_PREFIX}rendezvous-id": rendezvous_id(job, attempt)}
    volumes, mounts = _volumes(job)
    pod_spec: dict[str, Json] = {
        "hostname": name,
        "subdomain": job.name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": api.CONTAINER_NAME,
            "image": container_image(job, default_image),
            **_launcher(job, index),
            "env": _env(job, index, attempt),
            "ports": _ports(job),
            "resources": _resources(job),
            "volumeMounts": mounts,
            # A worker that dies without last words (segfault, SIGKILL, a user program's traceback) leaves
            # the tail of its log as the message, which the failure record keeps after the pod is gone.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            **in_place_rule(job, nodes_restart_in_place),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
            },
        }],
        "volumes": volumes,
        "tolerations": _tolerations(job),
        **_placement(job, avoid),
    }
    if gang:
        pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(job.name, attempt)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _placement(job: TrainingJob, avoid: Sequence[str]) -> dict[str, Json]:
    """The pod spec's scheduling fields: the job's own, else the operator's defaults; never on a node to avoid."""
    spec = job.spec
    scheduling = spec.scheduling
    placement: dict[str, Json] = {}
    if scheduling.node_selector:
        placement["nodeSelector"] = thaw(scheduling.node_selector)
    if scheduling.affinity:
        placement["affinity"] = thaw(scheduling.affinity)
    elif spec.nodes > 1 or spec.elastic is not None:
        placement["affinity"] = _spread(job)
    if avoid:
        placement["affinity"] = _avoiding(placement.get("affinity") or {}, avoid)
    if scheduling.priority_class_name:
        placement["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        placement["schedulerName"] = scheduling.scheduler_name
    return placement


def _avoiding(affinity: Mapping[str, Json], nodes: Sequence[str]) -> dict[str, Json]:
    """``affinity`` and never on ``nodes``: the rule joins every node selector term (the terms are ORed, so each
    must carry it). By name (matchFields metadata.name), as a node's hostname label may differ from its name."""
    rule = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), rule]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return {**affinity, "nodeAffinity": node_affinity}


def build_pods(job: TrainingJob, attempt: int, *, default_image: str = api.DEFAULT_TRAINER_IMAGE,
               gang: bool = False) -> Iterator[dict[str, Json]]:
    """Every pod of an attempt, one per desired node."""
    for index in range(job.spec.nodes):
        yield build_pod(job, index, attempt, default_image=default_image, gang=gang)
