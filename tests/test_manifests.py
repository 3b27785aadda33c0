"""The Service and pods built from a spec: golden files plus the pod contract, rule by rule."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.core import api
from kubetrain.core.manifests import build_pod, build_pod_group, build_pods, build_service
from kubetrain.core.spec import TrainingJob, parse
from tests.invalid_specs import base_job

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _job(document: dict[str, Any], uid: str = "6b1f3c1e-0000-4000-8000-000000000001") -> TrainingJob:
    document = json.loads(json.dumps(document))
    document["metadata"] |= {"namespace": "team-a", "uid": uid, "generation": 1}
    return parse(document)


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_manifests_match_golden_file(path: Path) -> None:
    job = _job(yaml.safe_load(path.read_text()))
    rendered = yaml.safe_dump_all([build_service(job), *build_pods(job, attempt=1)], sort_keys=False)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.exists(), f"run UPDATE_GOLDEN=1 pytest {__file__} to create {golden}"
    assert rendered == golden.read_text(), f"{golden} differs; review and run with UPDATE_GOLDEN=1"


def test_one_pod_per_node_with_stable_dns_names() -> None:
    job = _job(base_job())
    pods = list(build_pods(job, attempt=0))
    assert [p["metadata"]["name"] for p in pods] == ["valid-0", "valid-1"]
    for index, pod in enumerate(pods):
        assert pod["spec"]["hostname"] == f"valid-{index}"
        assert pod["spec"]["subdomain"] == "valid"
        assert pod["metadata"]["labels"][api.LABEL.NODE_INDEX] == str(index)


def test_headless_service_publishes_unready_pods() -> None:
    job = _job(base_job())
    service = build_service(job)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    # Only this job's pods: never those of an earlier job of the same name.
    assert service["spec"]["selector"] == {api.LABEL.JOB_NAME: "valid", api.LABEL.JOB_UID: job.uid}


def test_gang_pods_point_at_their_attempts_pod_group() -> None:
    document = base_job()
    assert "schedulingGroup" not in build_pod(_job(document), 0, attempt=0)["spec"]
    for attempt in (0, 3):  # each attempt is a gang of its own
        for pod in build_pods(_job(document), attempt, gang=True):
            assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"valid-gang-{attempt}"}
            assert "schedulerName" not in pod["spec"]  # the default scheduler places gangs


@pytest.mark.parametrize(("spec", "min_count", "constraints"), [
    ({}, 2, None),
    ({"elastic": {"minNodes": 1, "maxNodes": 4}}, 1, None),  # an elastic job runs with minNodes
    ({"scheduling": {"topology": "example.com/rack"}}, 2, {"topology": [{"key": "example.com/rack"}]}),
])
def test_the_pod_group_of_an_attempt(spec: dict[str, Any], min_count: int, constraints: Any) -> None:
    document = base_job()
    document["spec"] |= spec
    job = _job(document)
    group = build_pod_group(job, 3)
    assert (group["apiVersion"], group["kind"]) == ("scheduling.k8s.io/v1beta1", "PodGroup")
    assert group["metadata"]["name"] == "valid-gang-3"
    assert group["metadata"]["labels"] == {api.LABEL.JOB_NAME: "valid", api.LABEL.JOB_UID: job.uid,
                                           api.LABEL.MANAGED_BY: "kubetrain", api.LABEL.ATTEMPT: "3"}
    assert group["metadata"]["ownerReferences"][0]["uid"] == job.uid
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": min_count}}
    assert group["spec"].get("schedulingConstraints") == constraints


def test_every_child_carries_the_job_uid_and_selects_by_it() -> None:
    job = _job(base_job(), uid="uid-7")
    pod = build_pod(job, 1, attempt=0)
    assert pod["metadata"]["labels"][api.LABEL.JOB_UID] == "uid-7"
    assert build_service(job)["metadata"]["labels"][api.LABEL.JOB_UID] == "uid-7"
    term = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"][api.LABEL.JOB_UID] == "uid-7"


def test_torchrun_is_configured_through_pet_variables() -> None:
    job = _job(base_job())
    env = _env(build_pod(job, 1, attempt=3))
    assert env["PET_NNODES"] == "2"
    assert env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "valid-0.valid:29400"
    assert env["PET_RDZV_ID"] == f"{job.uid}-3"
    assert env["KUBETRAIN_ATTEMPT"] == "3"
    assert env["KUBETRAIN_NODE_INDEX"] == "1"
    assert json.loads(env["KUBETRAIN_CONFIG"])["trainer"]["task"] == "digits"
    assert env["KUBETRAIN_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_rendezvous_id_changes_with_every_attempt() -> None:
    job = _job(base_job())
    ids = {_env(build_pod(job, 0, attempt))["PET_RDZV_ID"] for attempt in range(3)}
    assert len(ids) == 3


def _images(pods: list[dict[str, Any]]) -> set[str]:
    return {pod["spec"]["containers"][0]["image"] for pod in pods}


def test_jobs_without_an_image_run_the_operators_trainer_image() -> None:
    job = _job(base_job())
    configured = "registry.example.com/kubetrain/trainer:0.1.0"
    assert _images(list(build_pods(job, 0, default_image=configured))) == {configured}
    assert _images(list(build_pods(job, 0))) == {api.DEFAULT_TRAINER_IMAGE}


def test_a_jobs_own_image_wins_over_the_operators() -> None:
    document = base_job()
    document["spec"]["image"] = "registry.example.com/team/trainer:7"
    pods = list(build_pods(_job(document), 0, default_image="registry.example.com/kubetrain/trainer:0.1.0"))
    assert _images(pods) == {"registry.example.com/team/trainer:7"}


def test_elastic_job_passes_a_node_range() -> None:
    document = base_job()
    document["spec"]["elastic"] = {"minNodes": 1, "maxNodes": 4}
    assert _env(build_pod(_job(document), 0, 0))["PET_NNODES"] == "1:4"


def test_user_command_runs_under_torchrun_without_python_wrapper() -> None:
    document = base_job()
    del document["spec"]["trainer"]
    document["spec"] |= {"command": ["python", "train.py"], "args": ["--lr", "0.1"]}
    job = _job(document)
    container = build_pod(job, 0, 0)["spec"]["containers"][0]
    assert container["command"] == ["torchrun"]
    assert container["args"] == ["--no-python", "python", "train.py", "--lr", "0.1"]
    other = build_pod(job, 1, 0)["spec"]["containers"][0]  # through sh, which names its agent, then torchrun
    assert other["command"][:2] == ["sh", "-c"] and other["command"][2].endswith('exec torchrun "$@"')
    assert other["args"] == container["args"]


def test_gpus_become_limits_and_a_toleration() -> None:
    document = base_job()
    document["spec"]["gpusPerNode"] = 8
    del document["spec"]["procsPerNode"]
    pod = build_pod(_job(document), 0, 0)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert [p["name"] for p in container["ports"]][:3] == ["rendezvous", "metrics", "metrics-1"]
    assert len(container["ports"]) == 1 + 8


def test_restricted_pod_security_and_restart_policy() -> None:
    pod = build_pod(_job(base_job()), 0, 0)
    spec = pod["spec"]
    container = spec["containers"][0]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
    }
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


@pytest.mark.parametrize(("in_place", "rule"), [
    (None, [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}]),
    (False, None),
])
def test_torchruns_failure_restarts_the_pods_containers_in_place_unless_turned_off(in_place: bool | None,
                                                                                   rule: Any) -> None:
    document = base_job()
    if in_place is not None:
        document["spec"]["failurePolicy"] = {"restartInPlace": in_place}
    container = build_pod(_job(document), 1, 0)["spec"]["containers"][0]
    assert container.get("restartPolicyRules") == rule
    assert container.get("restartPolicy") == ("Never" if rule else None)
    # Nor where a node does not declare the feature: the scheduler would not place the pod there.
    elsewhere = build_pod(_job(document), 1, 0, nodes_restart_in_place=False)["spec"]["containers"][0]
    assert "restartPolicyRules" not in elsewhere


def test_children_are_owned_by_the_job() -> None:
    job = _job(base_job())
    for child in (build_service(job), build_pod(job, 0, 0)):
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "name": "valid",
                         "uid": job.uid, "controller": True, "blockOwnerDeletion": True}


def test_checkpoint_claim_is_mounted_at_the_checkpoint_path() -> None:
    document = base_job()
    document["spec"]["checkpoint"] = {"claimName": "ckpt", "path": "/ckpt"}
    pod = build_pod(_job(document), 0, 0)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
    assert volume["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert _env(pod)["KUBETRAIN_CHECKPOINT_DIR"] == "/ckpt"


def test_user_env_volumes_and_scheduling_are_passed_through() -> None:
    document = base_job()
    document["spec"] |= {
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "scheduling": {"nodeSelector": {"pool": "a100"}, "priorityClassName": "high",
                       "tolerations": [{"key": "dedicated", "operator": "Exists"}]},
    }
    spec = build_pod(_job(document), 0, 0)["spec"]
    assert _env({"spec": spec})["NCCL_DEBUG"] == "INFO"
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    assert spec["nodeSelector"] == {"pool": "a100"}
    assert spec["priorityClassName"] == "high"
    assert {"key": "dedicated", "operator": "Exists"} in spec["tolerations"]


def test_multi_node_pods_prefer_separate_machines_unless_affinity_is_given() -> None:
    pod = build_pod(_job(base_job()), 0, 0)
    term = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    document = base_job()
    document["spec"]["scheduling"] = {"affinity": {"nodeAffinity": {}}}
    assert build_pod(_job(document), 0, 0)["spec"]["affinity"] == {"nodeAffinity": {}}
    single = base_job()
    single["spec"]["nodes"] = 1
    assert "affinity" not in build_pod(_job(single), 0, 0)["spec"]


def test_node_loss_toleration_follows_the_policy() -> None:
    document = base_job()
    document["spec"]["failurePolicy"] = {"nodeLostTimeoutSeconds": 15}
    tolerations = build_pod(_job(document), 0, 0)["spec"]["tolerations"]
    unreachable = next(t for t in tolerations if t["key"] == "node.kubernetes.io/unreachable")
    assert unreachable["tolerationSeconds"] == 15
