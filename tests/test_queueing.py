"""Kueue's job contract, the pure side (core/queueing.py): the Workload made for a job, what Kueue's conditions mean,
where an admission puts the pods, and the status writes that give quota back. The Workloads read here have the
shape the lab's Kueue v0.17.0 wrote (docs/lab.md, "The Workload API that Kueue v0.17.0 serves")."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.core.lifecycle import reconcile
from kubetrain.core.manifests import build_pod
from kubetrain.core.queueing import (
    KUEUE,
    POD_SET,
    QUEUE_LABEL,
    Admission,
    Placement,
    QueuePosition,
    QueueState,
    build_workload,
    default_priority_class,
    finished_patch,
    placed,
    placement,
    pods_ready_patch,
    positions,
    queue_name,
    read_admission,
    release_patch,
    waiting_message,
    workload_name,
    workload_spec_patch,
)
from kubetrain.core.spec import TrainingJob, parse
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

Json = Any
NOW = datetime(2026, 12, 4, 19, 0, tzinfo=UTC)


def job(queue: str | None = "team-q", uid: str = "uid-1", **spec: Json) -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"namespace": "team-a", "uid": uid, "generation": 1}
    if queue is not None:
        document["metadata"]["labels"] = {QUEUE_LABEL: queue}
    document["spec"] |= {"gpusPerNode": 4, **spec}
    document["spec"].pop("procsPerNode")  # one process per GPU
    return parse(document)


def condition(kind: str, status: bool, reason: str, message: str = "") -> dict[str, Json]:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-04T18:59:00Z"}


def workload(*conditions: dict[str, Json], admission: Json = None, checks: Json = None) -> dict[str, Json]:
    status: dict[str, Json] = {"conditions": list(conditions)}
    if admission is not None:
        status["admission"] = admission
    if checks is not None:
        status["admissionChecks"] = checks
    return {"metadata": {"name": "trainingjob-valid-abcde", "resourceVersion": "42", "generation": 1},
            "spec": {"podSets": [{"name": POD_SET, "count": 2}]}, "status": status}


ADMISSION = {"clusterQueue": "gpus", "podSetAssignments": [{
    "name": POD_SET, "count": 2,
    "flavors": {"cpu": "default", "memory": "default", "nvidia.com/gpu": "h200"}}]}
RESERVED = condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpus")
ADMITTED = condition("Admitted", True, "Admitted", "The workload is admitted")


class TestTheWorkload:
    def test_a_job_without_the_queue_label_is_not_kueues(self) -> None:
        assert queue_name(job(queue=None)) is None
        assert queue_name(job()) == "team-q"

    def test_one_pod_set_of_every_node_with_the_pods_resources_owned_by_the_job(self) -> None:
        the_job = job()
        body = build_workload(the_job, build_pod(the_job, 0, 0), priority=0)
        assert body["apiVersion"] == "kueue.x-k8s.io/v1beta2" and body["kind"] == "Workload"
        assert body["metadata"]["namespace"] == "team-a"
        assert body["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == "uid-1"  # Kueue's messages name the job
        owner = body["metadata"]["ownerReferences"][0]
        assert owner | {} == {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "name": "valid",
                              "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
        spec = body["spec"]
        assert spec["queueName"] == "team-q" and spec["active"] is True
        [pod_set] = spec["podSets"]
        assert pod_set["name"] == POD_SET and pod_set["count"] == 2 and "minCount" not in pod_set
        resources = pod_set["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == "4" and resources["requests"]["cpu"] == "1"
        assert "hostname" not in pod_set["template"]["spec"]  # one template for every node
        # Always set, as Kueue's own integrations set it (its visibility API fails without it).
        assert spec["priority"] == 0 and "priorityClassRef" not in spec

    def test_an_elastic_job_may_be_admitted_from_its_minimum(self) -> None:
        elastic = job(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
        [pod_set] = build_workload(elastic, build_pod(elastic, 0, 0), priority=0)["spec"]["podSets"]
        assert (pod_set["count"], pod_set["minCount"]) == (4, 2)
        at_its_minimum = job(nodes=2, elastic={"minNodes": 2, "maxNodes": 4})
        [pod_set] = build_workload(at_its_minimum, build_pod(at_its_minimum, 0, 0), priority=0)["spec"]["podSets"]
        assert pod_set["count"] == 2 and "minCount" not in pod_set

    def test_the_priority_class_and_its_value(self) -> None:
        the_job = job(scheduling={"priorityClassName": "high"})
        spec = build_workload(the_job, build_pod(the_job, 0, 0), priority=1000)["spec"]
        assert spec["priorityClassRef"] == {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
        assert spec["priority"] == 1000

    def test_a_job_naming_no_class_gets_the_clusters_default_one_as_kueue_gives_it(self) -> None:
        classes = [{"metadata": {"name": "system-node-critical"}, "value": 2000001000},
                   {"metadata": {"name": "batch"}, "value": 50, "globalDefault": True},
                   {"metadata": {"name": "low"}, "value": 10, "globalDefault": True}]
        chosen = default_priority_class(classes)
        assert chosen is not None and chosen["metadata"]["name"] == "low"  # the lowest of the defaults
        assert default_priority_class(classes[:1]) is None
        the_job = job()
        spec = build_workload(the_job, build_pod(the_job, 0, 0), priority=10, class_name="low")["spec"]
        assert spec["priorityClassRef"]["name"] == "low" and spec["priority"] == 10
        named = job(scheduling={"priorityClassName": "high"})
        spec = build_workload(named, build_pod(named, 0, 0), priority=1000, class_name="high")["spec"]
        assert spec["priorityClassRef"]["name"] == "high"

    def test_a_job_of_the_same_name_gets_a_workload_of_its_own(self) -> None:
        first, second = workload_name(job(uid="uid-1")), workload_name(job(uid="uid-2"))
        assert first.startswith("trainingjob-valid-") and first != second
        assert len(first) <= 63

    def test_an_elastic_job_resized_while_waiting_updates_the_count(self) -> None:
        the_job = job(nodes=3, elastic={"minNodes": 1, "maxNodes": 4})
        patch = workload_spec_patch(workload(condition("QuotaReserved", False, "Pending")), the_job)
        assert patch is not None and patch["spec"] == {"podSets": [{"name": POD_SET, "count": 3, "minCount": 1}]}
        assert patch["metadata"]["resourceVersion"] == "42"
        assert workload_spec_patch(workload(RESERVED), the_job) is None  # Kueue refuses it while quota is held
        assert workload_spec_patch(workload(), job(nodes=2)) is None
        was_elastic = workload(condition("QuotaReserved", False, "Pending"))
        was_elastic["spec"]["podSets"][0]["minCount"] = 1
        patch = workload_spec_patch(was_elastic, job(nodes=2))
        assert patch is not None and patch["spec"] == {"podSets": [{"name": POD_SET, "count": 2}]}, "no minCount left"

    def test_a_suspended_job_deactivates_its_workload_and_a_resumed_one_activates_it(self) -> None:
        suspended = job(runPolicy={"suspend": True})
        patch = workload_spec_patch(workload(RESERVED), suspended)
        assert patch is not None and patch["spec"] == {"active": False}
        inactive = workload(RESERVED) | {"spec": {"active": False, "podSets": [{"name": POD_SET, "count": 2}]}}
        assert workload_spec_patch(inactive, suspended) is None
        assert workload_spec_patch(inactive, job()) == {"metadata": {"resourceVersion": "42"},
                                                        "spec": {"active": True}}


class TestWhatKueueSays:
    @pytest.mark.parametrize(("conditions", "state", "reason"), [
        ((), QueueState.WAITING, "WaitingForKueue"),
        ((condition("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set trainer: insufficient "
                    "unused quota for nvidia.com/gpu in flavor h200, 4 more needed"),), QueueState.WAITING, "Pending"),
        ((condition("QuotaReserved", False, "Inadmissible", "LocalQueue nope doesn't exist"),),
         QueueState.WAITING, "Inadmissible"),
        ((RESERVED, ADMITTED), QueueState.ADMITTED, "Admitted"),
        ((RESERVED, ADMITTED, condition("Evicted", True, "Preempted", "Preempted to accommodate a workload")),
         QueueState.EVICTED, "Preempted"),
        ((RESERVED, ADMITTED, condition("Finished", True, "Succeeded", "done")), QueueState.FINISHED, "Succeeded"),
        # Admitted again after an eviction: Kueue turns Evicted False ("Previously: ...").
        ((RESERVED, ADMITTED, condition("Evicted", False, "QuotaReserved", "Previously: Preempted")),
         QueueState.ADMITTED, "Admitted"),
    ])
    def test_states(self, conditions: tuple[dict[str, Json], ...], state: QueueState, reason: str) -> None:
        seen = read_admission(workload(*conditions, admission=ADMISSION if RESERVED in conditions else None))
        assert (seen.state, seen.reason) == (state, reason)

    def test_reserved_quota_waits_for_the_admission_checks_and_says_which(self) -> None:
        checks = [{"name": "capacity", "state": "Pending", "message": "waiting for 2 nodes"},
                  {"name": "budget", "state": "Ready"}, {"name": "retry", "state": "Retry"}]
        seen = read_admission(workload(RESERVED, admission=ADMISSION, checks=checks))
        assert (seen.state, seen.reason, seen.quota_reserved) == (QueueState.WAITING, "AdmissionChecksPending", True)
        assert seen.message == ("quota reserved, waiting for admission checks: capacity Pending: waiting for 2 "
                                "nodes; retry Retry")
        ready = [{"name": "capacity", "state": "Ready"}]
        assert read_admission(workload(RESERVED, admission=ADMISSION, checks=ready)).reason == "QuotaReserved"

    def test_no_workload_yet_is_waiting(self) -> None:
        assert read_admission(None).state is QueueState.WAITING

    def test_an_admission_names_its_flavors_once_and_its_updates(self) -> None:
        update = {"name": POD_SET, "nodeSelector": {"zone": "b"}}
        checks = [{"name": "prov", "state": "Ready", "podSetUpdates": [update, {"name": "other", "labels": {}}]}]
        seen = read_admission(workload(RESERVED, ADMITTED, admission=ADMISSION, checks=checks))
        assert seen.flavors == ("default", "h200") and seen.quota_reserved and seen.cluster_queue == "gpus"
        assert seen.pod_set_updates == (update,)
        assert seen.since == ADMITTED["lastTransitionTime"], "what tells one admission of the Workload from the next"

    def test_an_admission_says_how_many_pods_of_how_many(self) -> None:
        partial = {**ADMISSION, "podSetAssignments": [{**ADMISSION["podSetAssignments"][0], "count": 1}]}
        seen = read_admission(workload(RESERVED, ADMITTED, admission=partial))
        assert (seen.count, seen.requested) == (1, 2)
        assert placement(seen, FLAVORS).nodes == 1

    def test_the_message_says_which_queue_and_kueues_words(self) -> None:
        waiting = Admission(QueueState.WAITING, "Inadmissible", "LocalQueue nope doesn't exist")
        assert waiting_message(job(queue="nope"), waiting) == (
            "queued in Kueue LocalQueue nope: LocalQueue nope doesn't exist")
        evicted = Admission(QueueState.EVICTED, "Preempted", "Preempted to accommodate a higher priority Workload")
        assert waiting_message(job(), evicted).startswith("evicted by Kueue (Preempted), queued again in LocalQueue")

    def test_the_message_says_where_the_job_stands_when_kueue_says(self) -> None:
        third = Admission(QueueState.WAITING, "Pending", "insufficient quota", position=QueuePosition(3, 7))
        assert waiting_message(job(), third) == (
            "queued in Kueue LocalQueue team-q at position 3 (7 in its ClusterQueue): insufficient quota")
        evicted = replace(third, state=QueueState.EVICTED, reason="Preempted")
        assert waiting_message(job(), evicted).startswith(
            "evicted by Kueue (Preempted), queued again in LocalQueue team-q at position 3 (7 in its ClusterQueue)")


def test_positions_count_from_one_as_the_visibility_api_lists_them() -> None:
    """A PendingWorkloadsSummary as Kueue v0.17.0's visibility API answers (counted from 0)."""
    summary = {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta2", "items": [
        {"metadata": {"name": "trainingjob-a-11111", "namespace": "team-a"}, "priority": 0,
         "localQueueName": "team-q", "positionInClusterQueue": 0, "positionInLocalQueue": 0},
        {"metadata": {"name": "trainingjob-b-22222", "namespace": "team-a"}, "priority": 0,
         "localQueueName": "team-q", "positionInClusterQueue": 4, "positionInLocalQueue": 1}]}
    assert positions(summary) == {"trainingjob-a-11111": QueuePosition(1, 1),
                                  "trainingjob-b-22222": QueuePosition(2, 5)}
    assert positions({"items": []}) == {} and positions({}) == {}


FLAVORS: dict[str, Json] = {
    "default": {"spec": {}},
    "h200": {"spec": {"nodeLabels": {"gpu": "h200"},
                      "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
}


# What Kueue's ProvisioningRequest admission check gives the pods: the capacity the cluster autoscaler made for them.
PROVISIONED = {"cluster-autoscaler.kubernetes.io/consume-provisioning-request": "job-a-1",
               "cluster-autoscaler.kubernetes.io/provisioning-class-name": "queued-provisioning.gke.io"}


class TestWhereAnAdmissionPutsThePods:
    def test_flavor_labels_and_tolerations_then_the_checks_updates(self) -> None:
        update: dict[str, Json] = {"name": POD_SET, "nodeSelector": {"zone": "b"},
                  "tolerations": [{"key": "spot", "operator": "Exists"}]}
        seen = Admission(QueueState.ADMITTED, "Admitted", "", True, "gpus", ("default", "h200"), (update,))
        where = placement(seen, FLAVORS)
        assert where.node_selector == {"gpu": "h200", "zone": "b"}
        assert list(where.tolerations) == [FLAVORS["h200"]["spec"]["tolerations"][0], update["tolerations"][0]]

    def test_the_pods_get_them_next_to_the_jobs_own(self) -> None:
        the_job = job(scheduling={"nodeSelector": {"rack": "r1"},
                                  "tolerations": [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}]})
        where = Placement({"gpu": "h200"}, ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},))
        pod = build_pod(placed(the_job, where), 1, 0)
        assert pod["spec"]["nodeSelector"] == {"rack": "r1", "gpu": "h200"}
        keys = [t["key"] for t in pod["spec"]["tolerations"]]
        assert keys[-2:] == ["team", "gpu"]
        assert build_pod(the_job, 1, 0)["spec"]["nodeSelector"] == {"rack": "r1"}  # the job itself is unchanged

    def test_the_checks_pod_labels_and_annotations_reach_every_pod(self) -> None:
        update = {"name": POD_SET, "labels": {"team": "vision"}, "annotations": PROVISIONED}
        seen = Admission(QueueState.ADMITTED, "Admitted", "", True, "gpus", ("default",), (update,))
        for index in (0, 1):
            pod = build_pod(placed(job(), placement(seen, FLAVORS)), index, 3)
            annotations = pod["metadata"]["annotations"]
            assert annotations.pop("kubetrain.io/rendezvous-id") and annotations == PROVISIONED
            assert pod["metadata"]["labels"]["team"] == "vision"
            assert pod["metadata"]["labels"]["kubetrain.io/node-index"] == str(index)  # the operator's own stay
        assert "team" not in build_pod(job(), 0, 3)["metadata"]["labels"]  # the job itself is unchanged

    @pytest.mark.parametrize("update", [
        {"labels": {"kubetrain.io/attempt": "0"}},
        {"annotations": {"kubetrain.io/rendezvous-id": "x"}},
    ])
    def test_a_check_cannot_set_the_operators_own_keys(self, update: dict[str, Json]) -> None:
        seen = Admission(QueueState.ADMITTED, "Admitted", "", True, "gpus", (), ({"name": POD_SET, **update},))
        with pytest.raises(ValueError, match="a key the operator owns"):
            placed(job(), placement(seen, FLAVORS))

    def test_two_checks_that_disagree_on_an_annotation_are_a_conflict(self) -> None:
        updates = ({"name": POD_SET, "annotations": {"a": "1"}}, {"name": POD_SET, "annotations": {"a": "2"}})
        seen = Admission(QueueState.ADMITTED, "Admitted", "", True, "gpus", (), updates)
        with pytest.raises(ValueError, match="pod annotation a=2, which conflicts with a=1"):
            placement(seen, FLAVORS)

    def test_the_pods_are_no_more_than_kueue_admitted(self) -> None:
        elastic = job(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
        assert placed(elastic, Placement({}, nodes=3)).spec.nodes == 3
        assert placed(elastic, Placement({}, nodes=None)).spec.nodes == 4
        assert placed(job(nodes=2, elastic={"minNodes": 1, "maxNodes": 4}), Placement({}, nodes=3)).spec.nodes == 2

    def test_a_node_label_the_job_sets_otherwise_is_a_conflict(self) -> None:
        the_job = job(scheduling={"nodeSelector": {"gpu": "a100"}})
        with pytest.raises(ValueError, match="gpu=h200, which conflicts with gpu=a100"):
            placed(the_job, Placement({"gpu": "h200"}))


class TestGivingQuotaBack:
    EVICTED = condition("Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: x) due to "
                        "prioritization in the ClusterQueue")

    def test_after_an_eviction_the_admission_is_cleared(self) -> None:
        patch = release_patch(workload(RESERVED, ADMITTED, self.EVICTED, admission=ADMISSION), NOW)
        assert patch is not None
        assert patch["metadata"]["resourceVersion"] == "42"  # Kueue writes the same conditions: no blind write
        status = patch["status"]
        assert status["admission"] is None
        by_type = {c["type"]: c for c in status["conditions"]}
        assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
        assert by_type["Admitted"]["status"] == "False"
        assert by_type["Requeued"]["status"] == "True" and by_type["Requeued"]["reason"] == "Preempted"
        assert by_type["Evicted"]["status"] == "True"  # Kueue's own, kept

    def test_a_deactivated_workload_is_not_requeued(self) -> None:
        evicted = condition("Evicted", True, "Deactivated", "The workload is deactivated")
        patch = release_patch(workload(RESERVED, ADMITTED, evicted, admission=ADMISSION), NOW)
        assert patch is not None
        assert {c["type"]: c["status"] for c in patch["status"]["conditions"]}["Requeued"] == "False"

    def test_nothing_to_give_back(self) -> None:
        assert release_patch(workload(RESERVED, ADMITTED, admission=ADMISSION), NOW) is None  # not evicted
        released = condition("QuotaReserved", False, "Pending")
        assert release_patch(workload(released, self.EVICTED), NOW) is None  # given back already

    def test_a_finished_job_finishes_its_workload_once(self) -> None:
        patch = finished_patch(workload(RESERVED, ADMITTED), False, "BackoffLimitExceeded: pod valid-0 failed", NOW)
        assert patch is not None
        finished = next(c for c in patch["status"]["conditions"] if c["type"] == "Finished")
        assert (finished["status"], finished["reason"]) == ("True", "Failed")
        assert finished["message"].startswith("BackoffLimitExceeded")
        done = condition("Finished", True, "Succeeded", "done")
        assert finished_patch(workload(RESERVED, ADMITTED, done), True, "done", NOW) is None


class TestPodsReady:
    """Kueue's waitForPodsReady evicts an admitted Workload whose PodsReady is not True within its timeout."""

    @staticmethod
    def ready(*conditions: dict[str, Json], running: bool) -> tuple[str, str] | None:
        patch = pods_ready_patch(workload(RESERVED, ADMITTED, *conditions, admission=ADMISSION), running, NOW)
        if patch is None:
            return None
        assert patch["metadata"]["resourceVersion"] == "42"
        found = next(c for c in patch["status"]["conditions"] if c["type"] == "PodsReady")
        return found["status"], found["reason"]

    @pytest.mark.parametrize(("before", "running", "after"), [
        ((), True, ("True", "Started")),  # the pods run: Kueue stops its clock
        ((), False, ("False", "WaitForStart")),  # starting: said, as Kueue's integrations say it
        ((condition("PodsReady", True, "Started"),), False, ("False", "WaitForRecovery")),  # a gang restart
        ((condition("PodsReady", False, "WaitForRecovery"),), True, ("True", "Recovered")),
        ((condition("PodsReady", True, "Recovered"),), False, ("False", "WaitForRecovery")),
        ((condition("PodsReady", False, "WaitForStart"),), True, ("True", "Started")),
    ])
    def test_it_follows_the_pods(self, before: tuple[dict[str, Json], ...], running: bool,
                                 after: tuple[str, str]) -> None:
        assert self.ready(*before, running=running) == after

    @pytest.mark.parametrize(("before", "running"), [
        (condition("PodsReady", True, "Started"), True),
        (condition("PodsReady", False, "WaitForStart"), False),
        (condition("PodsReady", False, "WaitForRecovery"), False),
    ])
    def test_it_is_written_only_when_it_changes(self, before: dict[str, Json], running: bool) -> None:
        assert self.ready(before, running=running) is None

    def test_an_eviction_waits_for_the_next_admissions_pods_afresh(self) -> None:
        evicted = TestGivingQuotaBack.EVICTED
        patch = release_patch(workload(RESERVED, ADMITTED, condition("PodsReady", True, "Started"), evicted,
                                       admission=ADMISSION), NOW)
        assert patch is not None
        ready = next(c for c in patch["status"]["conditions"] if c["type"] == "PodsReady")
        assert (ready["status"], ready["reason"]) == ("False", "WaitForStart")
        never = release_patch(workload(RESERVED, ADMITTED, evicted, admission=ADMISSION), NOW)
        assert never is not None and "PodsReady" not in {c["type"] for c in never["status"]["conditions"]}


def test_the_api_names() -> None:
    assert (KUEUE.GROUP, KUEUE.VERSION, KUEUE.WORKLOADS) == ("kueue.x-k8s.io", "v1beta2", "workloads")


class TestTheQueuedJobsLifecycle:
    """lifecycle.reconcile with Kueue's answer (``queue=``)."""

    WAITING = Admission(QueueState.WAITING, "Pending", "couldn't assign flavors to pod set trainer: insufficient "
                        "unused quota for nvidia.com/gpu in flavor h200, 4 more needed")
    ADMITTED = Admission(QueueState.ADMITTED, "Admitted", "The workload is admitted", True, "gpus", ("h200",))
    EVICTED = Admission(QueueState.EVICTED, "Preempted", "Preempted to accommodate a workload (UID: x, JobUID: y) "
                        "due to prioritization in the ClusterQueue", True)

    def test_a_job_kueue_has_not_admitted_makes_no_pods_and_says_why(self) -> None:
        decision = reconcile(job(), {}, [], NOW, queue=self.WAITING)
        assert decision.create == () and decision.status["phase"] == "Queued"
        assert decision.status["message"].startswith("queued in Kueue LocalQueue team-q: couldn't assign flavors")
        admitted = next(c for c in decision.status["conditions"] if c["type"] == "Admitted")
        assert (admitted["status"], admitted["reason"]) == ("False", "Pending")
        assert [e.reason for e in decision.events] == ["Queued"]
        assert decision.status["gpus"] == 0
        assert_valid_status(decision.status)

    def test_its_position_is_in_the_status_while_it_waits_and_goes_when_admitted(self) -> None:
        second = replace(self.WAITING, position=QueuePosition(2, 5))
        queued = reconcile(job(), {}, [], NOW, queue=second).status
        assert queued["queuePosition"] == {"localQueue": 2, "clusterQueue": 5}
        assert_valid_status(queued)
        unknown = reconcile(job(), queued, [], NOW, queue=self.WAITING).status
        assert "queuePosition" not in unknown, "no answer from Kueue: no position, not an old one"
        started = reconcile(job(), queued, [], NOW, queue=self.ADMITTED).status
        assert "queuePosition" not in started

    def test_admitted_it_starts_attempt_0(self) -> None:
        queued = reconcile(job(), {}, [], NOW, queue=self.WAITING).status
        decision = reconcile(job(), queued, [], NOW, queue=self.ADMITTED)
        assert decision.create == (0, 1) and decision.status["attempt"] == 0
        admitted = next(c for c in decision.status["conditions"] if c["type"] == "Admitted")
        assert (admitted["status"], admitted["message"]) == ("True", "admitted by Kueue in ClusterQueue gpus")
        assert "Admitted" in [e.reason for e in decision.events]

    def test_an_elastic_job_admitted_in_part_starts_with_the_pods_admitted_and_says_so(self) -> None:
        elastic = job(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
        admitted = replace(self.ADMITTED, count=2, requested=4)
        decision = reconcile(placed(elastic, placement(admitted, FLAVORS)), {}, [], NOW, queue=admitted)
        assert decision.create == (0, 1)
        condition = next(c for c in decision.status["conditions"] if c["type"] == "Admitted")
        assert condition["message"] == ("admitted by Kueue in ClusterQueue gpus for 2 of 4 nodes (partial admission "
                                        "of an elastic job: the quota left no room for more)")

    def test_evicted_its_pods_go_and_admitted_again_it_resumes_in_a_new_attempt(self) -> None:
        running = {"phase": "Running", "attempt": 0, "restarts": 0, "startTime": "2026-12-04T18:00:00Z",
                   "attemptStartTime": "2026-12-04T18:00:00Z", "nodes": {"desired": 2}}
        decision = reconcile(job(), running, states(pod(0), pod(1)), NOW, queue=self.EVICTED)
        assert sorted(decision.delete) == ["valid-0", "valid-1"]  # SIGTERM and their grace period to checkpoint
        assert decision.status["phase"] == "Queued"
        assert decision.status["message"].startswith("evicted by Kueue (Preempted), queued again in LocalQueue")
        assert [(e.type, e.reason) for e in decision.events] == [("Warning", "Evicted")]
        assert decision.status["restarts"] == 0  # an eviction is no failure of the job
        resumed = reconcile(job(), decision.status, [], NOW, queue=self.ADMITTED)
        assert resumed.status["attempt"] == 1 and resumed.create == (0, 1)
        assert "Resumed" in [e.reason for e in resumed.events]

    def test_suspension_wins_and_a_job_in_no_queue_is_untouched(self) -> None:
        suspended = reconcile(job(runPolicy={"suspend": True}), {}, [], NOW, queue=self.WAITING)
        assert suspended.status["phase"] == "Suspended"
        plain = reconcile(job(queue=None), {}, [], NOW)
        assert plain.create == (0, 1) and not any(c["type"] == "Admitted" for c in plain.status["conditions"])
