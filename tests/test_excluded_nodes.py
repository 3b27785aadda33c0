"""Bad nodes remembered per job (core/nodes.py): which failures point at a node, when the job avoids it, how its
pods avoid it, and how a user clears the list. The lab shows it against kube-scheduler: test_excluded_nodes_lab.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.controller.jobstate import JobRecord
from kubetrain.core.lifecycle import reconcile
from kubetrain.core.manifests import build_pod
from kubetrain.core.nodes import CLEAR_ANNOTATION, needs_ready_nodes, node_fault, ready_node_names
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.core.status_policy import Decision
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

NOW = datetime(2026, 11, 1, 10, 10, tzinfo=UTC)
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
CLUSTER = frozenset({"node-0", "node-1", "node-2", "node-3"})
Json = Any


def job(annotations: dict[str, str] | None = None, **failure_policy: Json) -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"uid": "uid-1", "generation": 2, "annotations": annotations or {}}
    document["spec"]["failurePolicy"] = failure_policy
    return parse(document)


def running(attempt: int = 1, **extra: Json) -> dict[str, Json]:
    return {"phase": "Running", "attempt": attempt, "restarts": attempt, "startTime": "2026-11-01T10:00:00Z",
            "runningTime": "2026-11-01T10:01:00Z", "nodes": {"desired": 2}} | extra


def earlier_fault(node: str, attempt: int = 0, time: str = "2026-11-01T10:03:00Z") -> dict[str, Json]:
    return {"attempt": attempt, "pod": "valid-1", "node": node, "reason": "Error", "counted": True, "time": time,
            "message": "pod valid-1 failed", "nodeFault": "device or driver error: uncorrectable ECC"}


def ecc_failure(node: str = "node-1", attempt: int = 1) -> list[Json]:
    return states(pod(0, attempt=attempt), pod(1, "Failed", exit_code=1, message=ECC, node=node, attempt=attempt))


def reasons(decision: Decision) -> list[str]:
    return [e.reason for e in decision.events]


def messages(decision: Decision) -> str:
    return " | ".join(e.message for e in decision.events)


@pytest.mark.parametrize(("the_pod", "fault"), [
    (pod(0, "Failed", exit_code=1, message=ECC), "device or driver error: uncorrectable ECC"),
    (pod(0, "Failed", exit_code=1, message="... Failed to initialize NVML: Driver/library version mismatch"),
     "device or driver error: Failed to initialize NVML"),
    (pod(0, "Failed", exit_code=1, message="NVRM: Xid 79, pid=1234, GPU has fallen off the bus."),
     "device or driver error: fallen off the bus"),
    (pod(0, "Failed", exit_code=1, message="kernel: NVRM: Xid 48, an uncorrected double bit error"),
     "device or driver error: Xid 48"),
    (pod(0, "Failed", pod_reason="UnexpectedAdmissionError"), "the kubelet could not give the pod its devices"),
    (pod(0, deleting="2026-11-01T10:09:00Z", disrupted=True, disruption_reason="DeletionByTaintManager"),
     "the node stopped answering (NotReady or unreachable)"),
    (pod(0, "Failed", exit_code=1, message="ZeroDivisionError: division by zero"), None),
    (pod(0, "Failed", exit_code=137, reason="OOMKilled"), None),
    (pod(0, "Failed", exit_code=143, disrupted=True), None),  # an eviction says nothing of the node
])
def test_which_failures_point_at_the_node(the_pod: Json, fault: str | None) -> None:
    (state,) = states(the_pod)
    assert node_fault(state) == fault
    assert needs_ready_nodes([state], 0) is (fault is not None)
    assert not needs_ready_nodes([state], 1), "a pod of an earlier attempt was recorded when it failed"


def test_a_node_failing_the_job_in_two_attempts_is_excluded_and_said() -> None:
    status = running(failures=[earlier_fault("node-1")])
    decision = reconcile(job(), status, ecc_failure(), NOW, ready_nodes=CLUSTER)
    assert decision.status["phase"] == "Restarting" and decision.status["restarts"] == 2
    assert decision.status["failures"][-1]["nodeFault"] == "device or driver error: uncorrectable ECC"
    assert decision.status["excludedNodes"] == [{"node": "node-1", "failures": 2, "time": "2026-11-01T10:10:00Z",
                                                 "reason": "device or driver error: uncorrectable ECC"}]
    assert sorted(reasons(decision)) == ["NodeExcluded", "PodFailed"]
    assert "node node-1 excluded from this job's next placements after failures in 2 attempts" in messages(decision)
    assert_valid_status(decision.status)


def test_one_fault_is_not_enough_and_other_failures_never_count() -> None:
    decision = reconcile(job(), running(), ecc_failure(), NOW, ready_nodes=CLUSTER)
    assert "excludedNodes" not in decision.status
    status = running(failures=[earlier_fault("node-1") | {"nodeFault": None}])  # an ordinary error there before
    decision = reconcile(job(), status, ecc_failure(), NOW, ready_nodes=CLUSTER)
    assert "excludedNodes" not in decision.status
    plain = states(pod(0, attempt=1), pod(1, "Failed", exit_code=1, message="boom", node="node-1", attempt=1))
    decision = reconcile(job(), running(failures=[earlier_fault("node-1")]), plain, NOW, ready_nodes=CLUSTER)
    assert "excludedNodes" not in decision.status and "nodeFault" not in decision.status["failures"][-1]


def test_faults_count_attempts_not_pods() -> None:
    # Two pods on one machine that went away: one incident, so one attempt of two.
    lost = {"deleting": "2026-11-01T10:09:00Z", "disrupted": True, "disruption_reason": "DeletionByTaintManager",
            "node": "node-2"}
    decision = reconcile(job(), running(attempt=0), states(pod(0, **lost), pod(1, **lost)), NOW, ready_nodes=CLUSTER)
    assert [f["nodeFault"] for f in decision.status["failures"]] == ["the node stopped answering (NotReady or "
                                                                     "unreachable)"] * 2
    assert "excludedNodes" not in decision.status
    assert decision.status["disruptions"] == 1


def test_a_node_is_kept_when_the_gang_would_not_fit_without_it() -> None:
    status = running(failures=[earlier_fault("node-1")])
    decision = reconcile(job(), status, ecc_failure(), NOW, ready_nodes=frozenset({"node-0", "node-1"}))
    assert "excludedNodes" not in decision.status
    assert sorted(reasons(decision)) == ["NodeNotExcluded", "PodFailed"]
    assert "only 1 ready node(s) would be left for the 2 pod(s) the job needs" in messages(decision)
    unknown = reconcile(job(), status, ecc_failure(), NOW, ready_nodes=None)
    assert "excludedNodes" not in unknown.status
    assert "could not list the cluster's nodes" in messages(unknown)


def test_exclusion_can_be_turned_off() -> None:
    decision = reconcile(job(excludeNodeAfter=0), running(failures=[earlier_fault("node-1")]), ecc_failure(), NOW,
                         ready_nodes=CLUSTER)
    assert "excludedNodes" not in decision.status and reasons(decision) == ["PodFailed"]


def test_clearing_forgets_the_exclusions_and_faults_made_before_it() -> None:
    excluded = [{"node": "node-1", "reason": "x", "failures": 2, "time": "2026-11-01T10:04:00Z"},
                {"node": "node-3", "reason": "x", "failures": 2, "time": "2026-11-01T10:06:00Z"}]
    cleared = job({CLEAR_ANNOTATION: "2026-11-01T10:05:00Z"})
    status = running(excludedNodes=excluded, failures=[earlier_fault("node-1", time="2026-11-01T10:04:00Z")])
    decision = reconcile(cleared, status, states(pod(0, attempt=1), pod(1, attempt=1)), NOW)
    assert decision.status["excludedNodes"] == excluded[1:]
    assert reasons(decision) == ["ExcludedNodesCleared"]
    # The fault before the clear no longer counts: one more is the first.
    decision = reconcile(cleared, decision.status, ecc_failure(), NOW, ready_nodes=CLUSTER)
    assert [e["node"] for e in decision.status["excludedNodes"]] == ["node-3"]
    # Without the annotation the same history excludes node-1.
    decision = reconcile(job(), status, ecc_failure(), NOW, ready_nodes=CLUSTER)
    assert [e["node"] for e in decision.status["excludedNodes"]] == ["node-1", "node-3"]
    # A value that is not a time clears nothing.
    decision = reconcile(job({CLEAR_ANNOTATION: "yes"}), status, states(pod(0, attempt=1), pod(1, attempt=1)), NOW)
    assert decision.status["excludedNodes"] == excluded


def test_a_gang_the_exclusions_keep_waiting_says_so() -> None:
    why = "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient cpu."
    status = running(phase="Pending", excludedNodes=[{"node": "node-1", "reason": "x", "failures": 2,
                                                       "time": "2026-11-01T10:04:00Z"}])
    pods = states(pod(0, "Pending", unschedulable=why, attempt=1), pod(1, "Pending", unschedulable=why, attempt=1))
    decision = reconcile(job(), status, pods, NOW)
    assert decision.status["phase"] == "Pending"
    assert decision.status["message"].endswith(
        "; this job avoids 1 node(s) after failures there (node-1: status.excludedNodes; `kubetrain "
        "clear-excluded-nodes` lets it use them again)")


def test_the_pods_avoid_the_excluded_nodes_by_name_within_the_users_affinity() -> None:
    spec = build_pod(job(), 0, 1, avoid=["node-3", "node-1"])["spec"]
    rule = {"key": "metadata.name", "operator": "NotIn", "values": ["node-1", "node-3"]}
    assert spec["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [rule]}]}}
    assert "podAntiAffinity" in spec["affinity"]  # the spread across machines stays
    assert "nodeAffinity" not in build_pod(job(), 0, 1)["spec"]["affinity"]

    document = base_job()
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    gpu = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    document["spec"]["scheduling"] = {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone, gpu]}}}}
    terms = build_pod(parse(document), 0, 1, avoid=["node-1"])["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    rule["values"] = ["node-1"]
    assert terms == [zone | {"matchFields": [rule]}, gpu | {"matchFields": [rule]}]  # each ORed term carries it
    assert document["spec"]["scheduling"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [zone, gpu]  # the spec untouched


def test_the_pod_knows_its_node() -> None:
    env = build_pod(job(), 0, 0)["spec"]["containers"][0]["env"]
    assert {"name": "KUBETRAIN_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env


def test_ready_nodes_are_ready_and_open_to_pods() -> None:
    def node(name: str, ready: str = "True", cordoned: bool = False) -> Json:
        return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    listing = [node("a"), node("b", ready="False"), node("c", cordoned=True), node("d", ready="Unknown"), node("e")]
    assert ready_node_names(listing) == {"a", "e"}


def test_a_new_clear_annotation_is_seen_without_a_new_generation() -> None:
    record = JobRecord()
    document = base_job()
    document["metadata"] |= {"uid": "uid-1", "generation": 2}
    assert CLEAR_ANNOTATION not in record.parsed(document).annotations
    document["metadata"]["annotations"] = {CLEAR_ANNOTATION: "2026-11-01T10:05:00Z"}
    assert record.parsed(document).annotations[CLEAR_ANNOTATION] == "2026-11-01T10:05:00Z"
