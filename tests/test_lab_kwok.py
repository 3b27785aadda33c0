"""Simulated nodes from kwok, the real tool (tests/lab/kwok.py): a lab of its own with 64 of them beside one
process node, and the operator with the chart's identity placing a TrainingJob there.

What kwok plays is what the tests check: a pod bound to a simulated node goes Running with an IP, ends with the exit
code a test asks for, and goes away when deleted; the operator sees those pods as it sees a kubelet's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.fixtures import jobs_namespace, own_operator_lab
from tests.lab.jobs import Jobs
from tests.lab.kwok import BLOCK_LABEL, EXIT_CODE_ANNOTATION, LEASE_DURATION_S, POD_CIDR, RACK_LABEL, ready_count
from tests.lab.lab import Lab
from tests.lab.pods import pod_manifest
from tests.lab.procs import wait_for
from tests.test_operator import spec

pytestmark = [pytest.mark.lab]
Json = Any
SIMULATED = 64
GANG = 32


@pytest.fixture(scope="module")
def kwok_lab() -> Iterator[Lab]:
    with own_operator_lab("kwok", nodes=1, kwok_nodes=SIMULATED) as lab:
        yield lab


@pytest.fixture
def jobs(kwok_lab: Lab) -> Iterator[Jobs]:
    with jobs_namespace(kwok_lab, "kwok") as namespace_jobs:
        yield namespace_jobs


def _pod(jobs: Jobs, name: str) -> Json:
    return jobs.lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods/{name}")


def _end(jobs: Jobs, name: str, exit_code: int) -> None:
    jobs.lab.api.merge_patch(f"/api/v1/namespaces/{jobs.namespace}/pods/{name}",
                             {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(exit_code)}}})


def test_simulated_nodes_are_ready_with_gpus_racks_and_blocks(kwok_lab: Lab) -> None:
    assert ready_count(kwok_lab.api) == SIMULATED
    names = kwok_lab.kwok_node_names
    assert len(names) == SIMULATED
    first, last = kwok_lab.node(names[0]), kwok_lab.node(names[-1])
    assert first["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert first["status"]["nodeInfo"]["kubeletVersion"].startswith("kwok-")
    racks = first["metadata"]["labels"][RACK_LABEL], last["metadata"]["labels"][RACK_LABEL]
    assert racks == ("rack-0000", "rack-0003")
    assert first["metadata"]["labels"][BLOCK_LABEL] == last["metadata"]["labels"][BLOCK_LABEL] == "block-000"
    lease = kwok_lab.api.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{names[0]}")
    assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION_S, "kwok keeps the node's lease"


def test_a_pod_on_a_simulated_node_runs_ends_with_the_asked_code_and_goes_away(jobs: Jobs) -> None:
    pod = pod_manifest("gpu-pod", ["sleep", "600"], [], grace_s=30)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    jobs.lab.api.post(f"/api/v1/namespaces/{jobs.namespace}/pods", pod)
    wait_for(lambda: _pod(jobs, "gpu-pod").get("status", {}).get("phase") == "Running", 60, "gpu-pod Running",
             interval=0.25)
    running = _pod(jobs, "gpu-pod")
    assert running["spec"]["nodeName"] in jobs.lab.kwok_node_names, "only simulated nodes have GPUs"
    assert ipaddress.ip_address(running["status"]["podIP"]) in ipaddress.ip_network(POD_CIDR)
    assert running["status"]["containerStatuses"][0]["state"]["running"]

    _end(jobs, "gpu-pod", 3)
    wait_for(lambda: _pod(jobs, "gpu-pod")["status"]["phase"] == "Failed", 60, "gpu-pod Failed", interval=0.25)
    terminated = _pod(jobs, "gpu-pod")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")

    # A graceful delete: kwok, like a kubelet, removes the object once its containers are gone.
    jobs.lab.api.delete(f"/api/v1/namespaces/{jobs.namespace}/pods/gpu-pod")
    wait_for(lambda: not jobs.lab.api.exists(f"/api/v1/namespaces/{jobs.namespace}/pods/gpu-pod"), 60,
             "gpu-pod gone", interval=0.25)


def test_a_training_job_runs_on_simulated_nodes_and_its_gang_restarts_there(jobs: Jobs) -> None:
    jobs.create("wide", spec("import time; time.sleep(3600)", nodes=GANG, gpusPerNode=8, procsPerNode=8,
                             resources={"cpu": "1", "memory": "1Gi", "sharedMemory": "1Gi"},
                             failurePolicy={"backoffLimit": 1}))
    status = jobs.wait("wide", lambda s: s.get("phase") == "Running", "all pods Running", timeout=120)
    assert status["gpus"] == GANG * 8
    pods = jobs.pods("wide")
    assert len(pods) == GANG
    assert {p["spec"]["nodeName"] for p in pods} <= set(jobs.lab.kwok_node_names)
    assert len({p["spec"]["nodeName"] for p in pods}) == GANG, "a pod of 8 GPUs fills a simulated node"

    _end(jobs, "wide-7", 1)
    status = jobs.wait("wide", lambda s: s.get("attempt") == 1 and s.get("phase") == "Running",
                       "attempt 1 Running", timeout=120)
    assert status["restarts"] == 1
    assert status["failures"][-1]["pod"] == "wide-7"
    assert status["failures"][-1]["exitCode"] == 1
    assert {p["metadata"]["labels"]["kubetrain.io/attempt"] for p in jobs.pods("wide")} == {"1"}
