"""Kueue runs in the lab as it runs in a cluster: its webhooks suspend a queued Job, its scheduler admits
within a ClusterQueue's GPU quota and holds the next Job until quota frees (docs/lab.md, "Kueue")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.procs import wait_for
from tests.lab.rest import JSON

pytestmark = pytest.mark.lab

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPUS_PER_JOB = 4
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "lab-flavor", "lab-gpus", "lab-queue"
NAMESPACE = "kueue-lab-test"


@pytest.fixture(scope="module")
def queue(kueue_lab: Lab) -> Iterator[str]:
    """A namespace with a LocalQueue on a ClusterQueue of 4 GPUs (cpu and memory covered too)."""
    api = kueue_lab.api
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kueue_lab.wait_service_account(NAMESPACE)
    api.post(f"{KUEUE_API}/resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
    quota = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": str(GPUS_PER_JOB)}
    api.post(f"{KUEUE_API}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": list(quota),
            "flavors": [{"name": FLAVOR, "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}],
        }]},
    })
    api.post(f"{KUEUE_API}/namespaces/{NAMESPACE}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE}, "spec": {"clusterQueue": CLUSTER_QUEUE}})
    yield NAMESPACE
    delete_namespace(kueue_lab, NAMESPACE)


def gpu_job(name: str, release_dir: Path) -> JSON:
    """A Job in the queue whose one pod needs 4 GPUs and runs until ``release_dir/<name>`` exists."""
    wait = f"import os, time\nwhile not os.path.exists('/release/{name}'):\n    time.sleep(0.2)\n"
    container = {
        "name": "main", "image": "kubetrain/trainer:lab", "command": ["python", "-c", wait],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(GPUS_PER_JOB)},
                      "limits": {"nvidia.com/gpu": str(GPUS_PER_JOB)}},
        "volumeMounts": [{"name": "release", "mountPath": "/release"}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "containers": [container],
            "volumes": [{"name": "release", "hostPath": {"path": str(release_dir), "type": "Directory"}}],
        }}},
    }


def workload_of(lab: Lab, namespace: str, job: JSON) -> JSON | None:
    """The Workload Kueue made for the job: the one the job controls."""
    for workload in lab.api.get(f"{KUEUE_API}/namespaces/{namespace}/workloads")["items"]:
        if any(ref["uid"] == job["metadata"]["uid"] for ref in workload["metadata"].get("ownerReferences") or []):
            return dict(workload)
    return None


def condition(workload: JSON | None, kind: str) -> JSON:
    found = [c for c in (workload or {}).get("status", {}).get("conditions") or [] if c["type"] == kind]
    return found[0] if found else {}


def job_pods(lab: Lab, namespace: str, name: str) -> list[JSON]:
    return list(lab.api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={name}")["items"])


def wait_admitted(lab: Lab, namespace: str, job: JSON, timeout: float = 60) -> JSON:
    """Kueue admits the job's Workload and unsuspends the job; its pod runs."""
    name = job["metadata"]["name"]
    wait_for(lambda: condition(workload_of(lab, namespace, job), "Admitted").get("status") == "True", timeout,
             f"Kueue to admit job {name}'s Workload", interval=0.25)
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
    wait_for(lambda: lab.api.get(path)["spec"].get("suspend") is False, 30, f"job {name} unsuspended")
    wait_for(lambda: any(p["status"].get("phase") == "Running" for p in job_pods(lab, namespace, name)), 60,
             f"job {name}'s pod running", interval=0.25)
    workload = workload_of(lab, namespace, job)
    assert workload is not None
    return workload


def test_kueue_admits_within_gpu_quota_and_queues_the_next_job(kueue_lab: Lab, queue: str) -> None:
    lab, namespace = kueue_lab, queue
    release_dir = lab.run_dir / "kueue-release"
    release_dir.mkdir(exist_ok=True)
    jobs_path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    first = lab.api.post(jobs_path, gpu_job("first", release_dir))
    # Kueue's mutating webhook suspends a queued job as it is created.
    assert first["spec"]["suspend"] is True, first["spec"]
    admitted = wait_admitted(lab, namespace, first)
    assert admitted["spec"]["queueName"] == LOCAL_QUEUE
    assert admitted["status"]["admission"]["clusterQueue"] == CLUSTER_QUEUE
    assignment = admitted["status"]["admission"]["podSetAssignments"][0]
    assert assignment["flavors"]["nvidia.com/gpu"] == FLAVOR
    assert assignment["resourceUsage"]["nvidia.com/gpu"] == str(GPUS_PER_JOB)
    # The storage version is v1beta2; reading v1beta1 goes through Kueue's conversion webhook.
    old = lab.api.get(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads/"
                      f"{admitted['metadata']['name']}")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1" and old["status"]["admission"]["clusterQueue"]

    second = lab.api.post(jobs_path, gpu_job("second", release_dir))
    wait_for(lambda: condition(workload_of(lab, namespace, second), "QuotaReserved").get("status") == "False",
             30, "the second job's Workload to be pending", interval=0.25)
    time.sleep(3)  # Kueue had every chance to admit it: the quota holds it back, not a slow scheduler
    pending = condition(workload_of(lab, namespace, second), "QuotaReserved")
    assert pending["status"] == "False" and pending["reason"] == "Pending", pending
    assert "insufficient unused quota for nvidia.com/gpu" in pending["message"], pending
    assert lab.api.get(f"{jobs_path}/second")["spec"]["suspend"] is True
    assert job_pods(lab, namespace, "second") == []

    (release_dir / "first").touch()
    wait_for(lambda: condition(workload_of(lab, namespace, first), "Finished").get("status") == "True", 60,
             "the first job's Workload to finish", interval=0.25)
    wait_admitted(lab, namespace, second)
    (release_dir / "second").touch()
    wait_for(lambda: condition(workload_of(lab, namespace, second), "Finished").get("status") == "True", 60,
             "the second job's Workload to finish", interval=0.25)
