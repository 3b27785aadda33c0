"""Kubernetes' own gang scheduling, on a lab whose control plane serves scheduling.k8s.io/v1beta1 PodGroups.

One lab for the module (``Lab(gang=True)``: the GenericWorkload and TopologyAwareWorkloadScheduling feature gates
on the apiserver, scheduler and controller manager, the API enabled), three 16-CPU process nodes in two racks
(``example.com/rack``: a = lab-node-0 and lab-node-1, b = lab-node-2), and the operator with the chart's identity
and its default ``--gang-scheduling=auto``: it finds the API and uses it. Pods ask for 9 CPUs, so a node holds one.
What the tests see is kube-scheduler's own placement: zero pods bound while a gang cannot be placed whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.fixtures import jobs_namespace, own_operator_lab
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.pods import pod_manifest
from tests.lab.procs import wait_for
from tests.test_operator import condition, spec

pytestmark = [pytest.mark.lab]
Json = Any
RACK = "example.com/rack"
RACKS = {"lab-node-0": "a", "lab-node-1": "a", "lab-node-2": "b"}
POD_GROUPS = "/apis/scheduling.k8s.io/v1beta1/namespaces/{}/podgroups"
NINE_CPUS = {"cpu": "9", "memory": "512Mi", "sharedMemory": "64Mi"}
SAYS_WHY_WITHIN_S = 20  # on the 2-core machine, with other labs running


@pytest.fixture(scope="module")
def gang_lab() -> Iterator[Lab]:
    with own_operator_lab("gang", nodes=3, gang=True) as lab:
        for node, rack in RACKS.items():
            lab.api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {RACK: rack}}})
        yield lab


@pytest.fixture
def jobs(gang_lab: Lab) -> Iterator[Jobs]:
    with jobs_namespace(gang_lab, "gang") as namespace_jobs:
        yield namespace_jobs


def _blocker(jobs: Jobs, node: str) -> str:
    """A plain pod holding 9 of ``node``'s 16 CPUs; its name."""
    name = f"blocker-{node}"
    pod = pod_manifest(name, ["sleep", "600"], [], grace_s=0, nodeSelector={"kubernetes.io/hostname": node})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "9", "memory": "1Gi"}}
    jobs.lab.api.post(f"/api/v1/namespaces/{jobs.namespace}/pods", pod)
    wait_for(lambda: bool(_pod(jobs, name)["spec"].get("nodeName")), 60, f"{name} bound", interval=0.25)
    return name


def _pod(jobs: Jobs, name: str) -> Json:
    return jobs.lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods/{name}")


def _bound(jobs: Jobs, job: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in jobs.pods(job) if p["spec"].get("nodeName")}


def _group(jobs: Jobs, name: str) -> Json:
    return jobs.lab.api.get(POD_GROUPS.format(jobs.namespace) + f"/{name}")


def _unschedulable(jobs: Jobs, job: str, nodes: int) -> Json:
    """Wait until the job says that the scheduler cannot place its gang (within seconds); no pod of it may be
    bound then, nor a few seconds later (the scheduler has had its tries)."""
    started = time.monotonic()
    status = jobs.wait(job, lambda s: condition(s, "Running").get("reason") == "Unschedulable",
                       "the scheduler's reason in the status", timeout=SAYS_WHY_WITHIN_S)
    print(f"{job}: Unschedulable in the status {time.monotonic() - started:.1f} s after its creation")
    assert len(jobs.pods(job)) == nodes
    for _ in range(3):
        assert _bound(jobs, job) == {}, "a gang that cannot be placed whole binds no pod"
        time.sleep(1)
    return status


def test_a_gang_that_cannot_fit_binds_no_pod_says_why_and_starts_when_capacity_frees(jobs: Jobs) -> None:
    blocker = _blocker(jobs, "lab-node-2")
    job = jobs.create("three", spec("import time; time.sleep(3); print('trained')", nodes=3, resources=NINE_CPUS))
    status = _unschedulable(jobs, "three", 3)
    assert status["phase"] == "Pending"
    assert "minCount (3) cannot be satisfied" in status["message"], status["message"]
    assert "the scheduler: " in condition(status, "Running")["message"]
    group = _group(jobs, "three-gang-0")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert [(o["kind"], o["uid"]) for o in group["metadata"]["ownerReferences"]] == [
        ("TrainingJob", job["metadata"]["uid"])]
    assert group["metadata"]["labels"]["kubetrain.io/attempt"] == "0"
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in jobs.pods("three")} == {"three-gang-0"}
    scheduled = condition(group["status"], "PodGroupInitiallyScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")

    jobs.lab.api.delete(f"/api/v1/namespaces/{jobs.namespace}/pods/{blocker}")
    jobs.wait("three", lambda s: s.get("phase") in ("Running", "Succeeded"), "the gang placed", timeout=120)
    assert sorted(_bound(jobs, "three").values()) == sorted(RACKS)
    assert jobs.wait_phase("three", "Succeeded", timeout=120)["phase"] == "Succeeded"


def test_a_gang_restart_places_the_new_attempt_as_a_gang_of_its_own(jobs: Jobs) -> None:
    jobs.create("again", spec("import time; time.sleep(600)", nodes=2, resources=NINE_CPUS,
                              failurePolicy={"backoffLimit": 2}))
    jobs.wait("again", lambda s: s.get("phase") == "Running", "attempt 0 running")
    jobs.lab.kill_pod(jobs.namespace, "again-1")
    status = jobs.wait("again", lambda s: s.get("attempt") == 1 and s.get("phase") == "Running",
                       "attempt 1 running", timeout=120)
    assert status["restarts"] == 1
    pods = jobs.pods("again")
    assert {p["metadata"]["labels"]["kubetrain.io/attempt"] for p in pods} == {"1"}
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"again-gang-1"}
    group = _group(jobs, "again-gang-1")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert condition(group["status"], "PodGroupInitiallyScheduled")["status"] == "True"
    wait_for(lambda: not jobs.lab.api.exists(POD_GROUPS.format(jobs.namespace) + "/again-gang-0"), 60,
             "attempt 0's group deleted", interval=0.5)


def test_a_gang_with_a_topology_key_lands_inside_one_rack(jobs: Jobs) -> None:
    # Free: lab-node-0 (rack a) and lab-node-2 (rack b). Without the constraint the gang would take both at once.
    blocker = _blocker(jobs, "lab-node-1")
    jobs.create("rack", spec("import time; time.sleep(600)", nodes=2, resources=NINE_CPUS,
                             scheduling={"topology": RACK}))
    _unschedulable(jobs, "rack", 2)
    assert _group(jobs, "rack-gang-0")["spec"]["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    jobs.lab.api.delete(f"/api/v1/namespaces/{jobs.namespace}/pods/{blocker}")
    jobs.wait("rack", lambda s: s.get("phase") == "Running", "the gang placed in rack a", timeout=120)
    assert sorted(_bound(jobs, "rack").values()) == ["lab-node-0", "lab-node-1"]


def test_a_topology_key_no_node_has_is_said_and_holds_nothing(jobs: Jobs) -> None:
    jobs.create("nowhere", spec("print('never')", nodes=1, scheduling={"topology": "example.com/no-such-label"}))
    status = _unschedulable(jobs, "nowhere", 1)
    assert "no feasible placements found" in status["message"], status["message"]


def test_a_gang_larger_than_the_cluster_is_said_and_holds_nothing(jobs: Jobs) -> None:
    # Four pods of 9 CPUs on three 16-CPU nodes: no placement of the whole gang exists, whatever else runs.
    jobs.create("huge", spec("print('never')", nodes=4, resources=NINE_CPUS))
    status = _unschedulable(jobs, "huge", 4)
    assert status["phase"] == "Pending"
    assert "minCount (4) cannot be satisfied" in status["message"], status["message"]


def test_an_elastic_gang_starts_at_its_minimum_and_its_last_pod_joins_when_room_frees(jobs: Jobs) -> None:
    # Room for two of its three pods: the group's minCount is the job's minNodes, so two bind and run.
    blocker = _blocker(jobs, "lab-node-2")
    jobs.create("elastic", spec("import time; time.sleep(600)", nodes=3, resources=NINE_CPUS,
                                elastic={"minNodes": 2, "maxNodes": 3}))
    status = jobs.wait("elastic", lambda s: s.get("phase") == "Running", "the job running on its minimum",
                       timeout=120)
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["reason"] == "MinimumPodsRunning", running
    assert _group(jobs, "elastic-gang-0")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    bound = _bound(jobs, "elastic")
    assert sorted(bound.values()) == ["lab-node-0", "lab-node-1"], bound
    # The scheduler picks which pod waits; the message names that one.
    (waiting,) = {f"elastic-{i}" for i in range(3)} - set(bound)
    assert f"waiting for 1 pod(s) to be scheduled: {waiting}; the scheduler: " in status["message"], status["message"]

    jobs.lab.api.delete(f"/api/v1/namespaces/{jobs.namespace}/pods/{blocker}")
    status = jobs.wait("elastic", lambda s: (s.get("nodes") or {}).get("ready") == 3, "the third pod ready",
                       timeout=120)
    assert sorted(_bound(jobs, "elastic").values()) == sorted(RACKS)
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Running", 0, 0), "it joined; no restart"
    wait_for(lambda: "AllPodsRunning" in [e["reason"] for e in jobs.events("elastic")], 15,
             "the event of the last pod joining", interval=0.5)


# lab-node-2's "GPU" is broken: the program fails there with a device error, and trains anywhere else.
BROKEN_ON_NODE_2 = """
import os, sys
node = os.environ["KUBETRAIN_NODE_NAME"]
if node == "lab-node-2":
    sys.exit("RuntimeError: CUDA error: uncorrectable ECC error encountered")
print("trained on", node)
"""


def test_a_node_that_keeps_failing_the_job_is_excluded_and_its_next_pod_goes_elsewhere(jobs: Jobs) -> None:
    # The other two nodes are taken, so the scheduler can only place the pod on lab-node-2, twice.
    blockers = [_blocker(jobs, node) for node in ("lab-node-0", "lab-node-1")]
    jobs.create("ecc", spec(BROKEN_ON_NODE_2, nodes=1, resources=NINE_CPUS, failurePolicy={"backoffLimit": 4}))
    status = jobs.wait("ecc", lambda s: bool(s.get("excludedNodes")), "lab-node-2 excluded", timeout=180)
    (excluded,) = status["excludedNodes"]
    assert (excluded["node"], excluded["failures"]) == ("lab-node-2", 2), excluded
    assert excluded["reason"] == "device or driver error: uncorrectable ECC", excluded
    assert [(f["node"], f.get("nodeFault")) for f in status["failures"]] == [
        ("lab-node-2", "device or driver error: uncorrectable ECC")] * 2, status["failures"]
    assert status["restarts"] == 2
    # Its next pod may not go there: with the other nodes taken it waits, and the job says why.
    status = jobs.wait("ecc", lambda s: "this job avoids 1 node(s)" in s.get("message", ""),
                       "the job saying the exclusion keeps it waiting", timeout=60)
    assert status["phase"] == "Pending", status
    assert "didn't match Pod's node affinity" in status["message"], status["message"]
    (waiting,) = jobs.pods("ecc")
    assert not waiting["spec"].get("nodeName")
    terms = waiting["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": ["lab-node-2"]}]}]}, terms
    assert "NodeExcluded" in [e["reason"] for e in jobs.events("ecc")]

    jobs.lab.api.delete(f"/api/v1/namespaces/{jobs.namespace}/pods/{blockers[0]}")
    status = jobs.wait("ecc", lambda s: s.get("phase") == "Succeeded", "the job trained on lab-node-0", timeout=120)
    assert (status["restarts"], len(status["excludedNodes"])) == (2, 1)

    # The user clears the list (the CLI sets the annotation); the operator forgets the node and says so.
    cleared = subprocess.run(
        [sys.executable, "-m", "kubetrain.cli.commands", "clear-excluded-nodes", "ecc", "-n", jobs.namespace],
        env={**os.environ, "KUBECONFIG": str(jobs.lab.kubeconfig)}, capture_output=True, text=True, timeout=60,
        check=False)
    assert cleared.returncode == 0, cleared.stderr
    assert "node(s) lab-node-2 cleared" in cleared.stdout, cleared.stdout
    jobs.wait("ecc", lambda s: not s.get("excludedNodes"), "the exclusion forgotten", timeout=30)
    wait_for(lambda: "ExcludedNodesCleared" in [e["reason"] for e in jobs.events("ecc")], 15,
             "the event of the clear", interval=0.5)
