"""TrainingJobs under the real Kueue (v0.17.0, docs/lab.md "Kueue"): the operator makes each queued job's Workload,
holds the job Queued until Kueue admits it, starts it where Kueue's flavor says, gives the quota back when it ends,
and gets out of the way of a higher-priority job (README, "Queues and gang scheduling").

The session's Kueue lab (tests/lab/fixtures.py: two process nodes of 4 GPUs each), the CRD, the operator with the
chart's identity. A ClusterQueue holds 4 GPUs, so two 4-GPU jobs never run together although the nodes have room
for both: a job that waits, waits for Kueue. The pods run in the exec-only image (one process each, no torch; it
has no python of its own, so the command names this one).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kubetrain.core.queueing import KUEUE, QUEUE_LABEL, read_admission, workload_name
from kubetrain.core.spec import parse
from tests.lab.chart import CRD, install_identity, wait_crd_established
from tests.lab.images import exec_only_image
from tests.lab.jobs import Jobs
from tests.lab.kueue import PODS_READY_TIMEOUT_S
from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for

pytestmark = pytest.mark.lab
Json = Any

KUEUE_API = f"/apis/{KUEUE.GROUP}/{KUEUE.VERSION}"
IMAGE = "test.kubetrain.io/exec-only:1"
NAMESPACE = "kueue-tj"
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "node-1-gpus", "gpus", "team"
# The flavor's nodes: Kueue's admission must put the pods there (the operator adds the flavor's node labels).
FLAVOR_NODE = "lab-node-1"


@pytest.fixture(scope="module")
def operator(kueue_lab: Lab) -> Iterator[OperatorProcess]:
    """The operator with the chart's cluster-wide identity (so the chart's RBAC is proven enough for Kueue's part)."""
    kueue_lab.kubectl("apply", "--server-side", "-f", str(CRD))
    wait_crd_established(kueue_lab)
    _, kubeconfig = install_identity(kueue_lab)
    kueue_lab.images.put_first(IMAGE, exec_only_image(kueue_lab.run_dir / "exec-only-image"))
    process = OperatorProcess(kubeconfig, kueue_lab.run_dir / "operator.log", (f"--namespace={NAMESPACE}",))
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def jobs(kueue_lab: Lab, operator: OperatorProcess) -> Iterator[Jobs]:
    """A namespace with a LocalQueue on a ClusterQueue of 4 GPUs, whose one flavor is lab-node-1's."""
    api = kueue_lab.api
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kueue_lab.wait_service_account(NAMESPACE)
    api.post(f"{KUEUE_API}/resourceflavors", {
        "apiVersion": KUEUE.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {"kubernetes.io/hostname": FLAVOR_NODE}}})
    quota = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"}
    api.post(f"{KUEUE_API}/clusterqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": list(quota), "flavors": [
                     {"name": FLAVOR, "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}]}]}})
    api.post(f"{KUEUE_API}/namespaces/{NAMESPACE}/localqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE}, "spec": {"clusterQueue": CLUSTER_QUEUE}})
    yield Jobs(kueue_lab, NAMESPACE)
    delete_namespace(kueue_lab, NAMESPACE)


def queued_job(jobs: Jobs, name: str, queue: str = LOCAL_QUEUE, priority_class: str | None = None, *,
               gpus: int = 4, node_selector: dict[str, str] | None = None, nodes: int = 1,
               elastic: dict[str, int] | None = None) -> Json:
    """A job of ``nodes`` nodes (one by default) of ``gpus`` GPUs in ``queue`` whose pods run until the file
    ``release/<name>`` exists."""
    release = jobs.lab.run_dir / "release"
    release.mkdir(exist_ok=True)
    wait = f"import os, time\nwhile not os.path.exists('/release/{name}'):\n    time.sleep(0.2)\n"
    body = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"nodes": nodes, "gpusPerNode": gpus, "image": IMAGE, "command": [sys.executable, "-c", wait],
                     "resources": {"cpu": "100m", "memory": "256Mi", "sharedMemory": "16Mi"},
                     "volumes": [{"name": "release", "hostPath": {"path": str(release), "type": "Directory"}}],
                     "volumeMounts": [{"name": "release", "mountPath": "/release"}],
                     "runPolicy": {"terminationGracePeriodSeconds": 5}}}
    if elastic is not None:
        body["spec"]["elastic"] = elastic
    scheduling = {"priorityClassName": priority_class, "nodeSelector": node_selector}
    if any(scheduling.values()):
        body["spec"]["scheduling"] = {key: value for key, value in scheduling.items() if value}
    created: Json = jobs.lab.api.post(jobs.base, body)
    return created


def release(jobs: Jobs, name: str) -> None:
    (jobs.lab.run_dir / "release" / name).touch()


def workload_path(job: Json) -> str:
    return f"{KUEUE_API}/namespaces/{NAMESPACE}/workloads/{workload_name(parse(job, check=False))}"


def workload_of(jobs: Jobs, job: Json) -> Json:
    workload: Json = jobs.lab.api.get(workload_path(job))
    return workload


def admitted(status: Json) -> Json:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), {})


def column(table: list[str], name: str) -> str:
    """The first row's cell under ``name`` in kubectl's aligned table (a cell may hold spaces)."""
    header, row = table[0], table[1]
    start = header.index(name)
    after = [header.index(f" {other}", start) + 1 for other in header[start:].split()[1:2]]
    return row[start:after[0] if after else None].strip()


def cleared(jobs: Jobs, names: tuple[str, ...]) -> None:
    """A test's jobs released, deleted and gone, whatever it left them doing: their quota free for the next tests."""
    for name in names:
        release(jobs, name)
    for name in names:
        with contextlib.suppress(Exception):
            jobs.lab.api.delete(f"{jobs.base}/{name}")
    wait_for(lambda: not any(jobs.lab.api.exists(f"{jobs.base}/{name}") for name in names), 60,
             f"jobs {', '.join(names)} gone", interval=0.5)


def urgent_class(jobs: Jobs) -> None:
    """PriorityClass ``urgent`` (value 1000), made once for the module's tests."""
    path = "/apis/scheduling.k8s.io/v1/priorityclasses/urgent"
    if not jobs.lab.api.exists(path):
        jobs.lab.api.post("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "urgent"},
            "value": 1000})


def test_a_job_waits_queued_for_quota_and_starts_when_the_running_one_ends(jobs: Jobs) -> None:
    first = queued_job(jobs, "first")
    jobs.wait_phase("first", "Running", timeout=90)
    [pod] = jobs.pods("first")
    # Kueue's flavor put it on its node: the operator added the flavor's node label to the pod.
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == FLAVOR_NODE
    assert pod["spec"]["nodeName"] == FLAVOR_NODE
    workload = workload_of(jobs, first)
    assert workload["spec"]["podSets"][0]["count"] == 1
    assert workload["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]
    assert workload["status"]["admission"]["clusterQueue"] == CLUSTER_QUEUE
    assert admitted(jobs.status("first")).get("status") == "True"

    second = queued_job(jobs, "second")
    status = jobs.wait("second", lambda s: s.get("phase") == "Queued" and admitted(s).get("reason") == "Pending",
                       "Queued with Kueue's reason", timeout=30)
    assert "insufficient unused quota for nvidia.com/gpu" in admitted(status)["message"], status
    assert "insufficient unused quota for nvidia.com/gpu" in status["message"]
    assert jobs.pods("second") == []  # it holds nothing while it waits

    release(jobs, "first")
    jobs.wait_phase("first", "Succeeded", timeout=60)
    wait_for(lambda: read_admission(workload_of(jobs, first)).state == "Finished", 30,
             "the first job's Workload to be Finished", interval=0.25)
    jobs.wait_phase("second", "Running", timeout=60)
    release(jobs, "second")
    jobs.wait_phase("second", "Succeeded", timeout=60)
    assert read_admission(workload_of(jobs, second)).state == "Finished"


def position(status: Json) -> Json:
    return status.get("queuePosition")


def test_a_waiting_job_shows_its_place_in_the_queue_from_kueues_visibility_api(jobs: Jobs) -> None:
    """Kueue's visibility API, served through the lab apiserver's aggregation layer and read with the chart's
    rights: each waiting job's position in its LocalQueue and ClusterQueue, moving up as the jobs ahead start."""
    names = ("ahead", "next", "after")
    try:
        queued_job(jobs, "ahead")
        jobs.wait_phase("ahead", "Running", timeout=90)
        queued_job(jobs, "next")
        queued_job(jobs, "after")
        waiting = {name: position(jobs.wait(name, lambda s: position(s) is not None, "a position", timeout=45))
                   for name in ("next", "after")}
        # Kueue orders by creation, to the second (then by name): whichever it lists first is admitted first.
        first, second = sorted(waiting, key=lambda name: waiting[name]["localQueue"])
        assert [waiting[first], waiting[second]] == [{"localQueue": 1, "clusterQueue": 1},
                                                     {"localQueue": 2, "clusterQueue": 2}], waiting
        assert jobs.status(first)["message"].startswith(
            f"queued in Kueue LocalQueue {LOCAL_QUEUE} at position 1 (1 in its ClusterQueue): ")
        shown = jobs.lab.kubectl("get", "tj", second, "-n", NAMESPACE, "-o", "wide").stdout.splitlines()
        assert (column(shown, "PHASE"), column(shown, "POSITION")) == ("Queued", "2"), shown

        release(jobs, "ahead")
        status = jobs.wait(first, lambda s: s.get("phase") == "Running", "Running", timeout=60)
        assert "queuePosition" not in status, "a position holds only while the job waits"
        assert jobs.status(second)["phase"] == "Queued"
        # Nothing of its own changes: the move is seen at the job's next look (within the 30 s resync) and read
        # again from Kueue.
        jobs.wait(second, lambda s: position(s) == {"localQueue": 1, "clusterQueue": 1}, "position 1", timeout=45)
    finally:
        cleared(jobs, names)


def test_an_elastic_job_is_admitted_in_part_and_runs_with_the_pods_kueue_admitted(jobs: Jobs) -> None:
    """Kueue's partial admission: an elastic job of 4 one-GPU nodes (at least 2), with 2 of the ClusterQueue's 4 GPUs
    taken, is admitted for 2 and runs with 2 pods, not waiting for 4."""
    names = ("holder", "elastic")
    try:
        queued_job(jobs, "holder", gpus=2)
        jobs.wait_phase("holder", "Running", timeout=90)
        job = queued_job(jobs, "elastic", gpus=1, nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
        status = jobs.wait_phase("elastic", "Running", timeout=90)
        assert len(jobs.pods("elastic")) == 2, [p["metadata"]["name"] for p in jobs.pods("elastic")]
        workload = workload_of(jobs, job)
        assert (workload["spec"]["podSets"][0]["count"], workload["spec"]["podSets"][0]["minCount"]) == (4, 2)
        assert workload["status"]["admission"]["podSetAssignments"][0]["count"] == 2
        assert admitted(status)["message"] == (f"admitted by Kueue in ClusterQueue {CLUSTER_QUEUE} for 2 of 4 nodes "
                                               "(partial admission of an elastic job: the quota left no room for "
                                               "more)")
        assert status["nodes"]["desired"] == 2, status["nodes"]
    finally:
        cleared(jobs, names)


def test_a_job_naming_no_priority_class_gets_the_clusters_default_one(jobs: Jobs) -> None:
    """As Kueue's own integrations: the globalDefault PriorityClass's value and name on the Workload."""
    path = "/apis/scheduling.k8s.io/v1/priorityclasses"
    jobs.lab.api.post(path, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                             "metadata": {"name": "cluster-default"}, "value": 7, "globalDefault": True})
    try:
        job = queued_job(jobs, "defaulted", queue="no-such-queue")  # never admitted: it holds nothing
        wait_for(lambda: jobs.lab.api.exists(workload_path(job)), 15, "its Workload", interval=0.2)
        spec = workload_of(jobs, job)["spec"]
        assert (spec["priority"], spec["priorityClassRef"]["name"]) == (7, "cluster-default"), spec
    finally:
        jobs.lab.api.delete(f"{path}/cluster-default")
        with contextlib.suppress(Exception):
            jobs.lab.api.delete(f"{jobs.base}/defaulted")


def test_a_queue_that_does_not_exist_is_said_at_once_and_holds_nothing(jobs: Jobs) -> None:
    job = queued_job(jobs, "lost", queue="no-such-queue")
    status = jobs.wait("lost", lambda s: admitted(s).get("reason") == "Inadmissible", "Kueue's reason", timeout=15)
    assert status["phase"] == "Queued"
    assert admitted(status)["status"] == "False"
    assert admitted(status)["message"] == status["message"] == (
        "queued in Kueue LocalQueue no-such-queue: LocalQueue no-such-queue doesn't exist")
    assert jobs.pods("lost") == []
    assert read_admission(workload_of(jobs, job)).quota_reserved is False
    shown = jobs.lab.kubectl("get", "tj", "lost", "-n", NAMESPACE, "-o", "wide").stdout.splitlines()
    assert (column(shown, "PHASE"), column(shown, "QUEUE")) == ("Queued", "no-such-queue"), shown
    jobs.lab.api.delete(f"{jobs.base}/lost")


def test_a_higher_priority_job_evicts_a_running_one_which_resumes_after_it(jobs: Jobs) -> None:
    """Kueue preempts within the ClusterQueue: the running job's pods go (SIGTERM and their grace period: the
    built-in trainer writes its checkpoint then), it waits Queued saying why, and comes back as a new attempt."""
    urgent_class(jobs)
    patient = queued_job(jobs, "patient")
    jobs.wait_phase("patient", "Running", timeout=90)
    assert jobs.status("patient")["attempt"] == 0
    urgent = queued_job(jobs, "urgent", priority_class="urgent")
    wait_for(lambda: jobs.lab.api.exists(workload_path(urgent)), 30, "the urgent job's Workload", interval=0.25)
    assert workload_of(jobs, urgent)["spec"]["priority"] == 1000  # its PriorityClass's value
    status = jobs.wait("patient", lambda s: s.get("phase") == "Queued" and admitted(s).get("reason") == "Preempted",
                       "evicted by the urgent job", timeout=60)
    assert status["message"].startswith("evicted by Kueue (Preempted)"), status["message"]
    assert "Evicted" in [e["reason"] for e in jobs.events("patient")]
    jobs.wait_phase("urgent", "Running", timeout=60)
    assert jobs.pods("patient") == []
    # The evicted job gave its quota back (Kueue's contract: the job's controller clears the admission).
    assert read_admission(workload_of(jobs, patient)).quota_reserved is False

    release(jobs, "urgent")
    jobs.wait_phase("urgent", "Succeeded", timeout=60)
    status = jobs.wait_phase("patient", "Running", timeout=60)
    assert status["attempt"] == 1 and admitted(status)["status"] == "True"
    release(jobs, "patient")
    jobs.wait_phase("patient", "Succeeded", timeout=60)


def test_an_evicted_trainer_checkpoints_in_its_grace_period_and_resumes_from_that_step(jobs: Jobs) -> None:
    """The built-in trainer under Kueue: it saves no periodic checkpoint (everySteps 0), only the one SIGTERM asks
    for, so a resumed step proves that the eviction's grace period wrote it to the job's claim."""
    urgent_class(jobs)
    jobs.lab.create_volume(NAMESPACE, "learner-checkpoints")
    body = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "learner", "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
            "spec": {"nodes": 1, "gpusPerNode": 4,  # no CUDA here: the trainer's 4 processes use gloo on the CPU
                     "resources": {"cpu": "1", "memory": "4Gi", "sharedMemory": "256Mi"},
                     "trainer": {"task": "digits", "maxSteps": 1_000_000, "batchSize": 32}, "data": {"workers": 0},
                     "checkpoint": {"claimName": "learner-checkpoints", "everySteps": 0},
                     "runPolicy": {"terminationGracePeriodSeconds": 60}}}
    jobs.lab.api.post(jobs.base, body)
    before = jobs.wait("learner", lambda s: int((s.get("progress") or {}).get("step", 0)) >= 20,
                       "the trainer past step 20", timeout=180)["progress"]["step"]

    queued_job(jobs, "urgent-2", priority_class="urgent")
    jobs.wait("learner", lambda s: s.get("phase") == "Queued" and admitted(s).get("reason") == "Preempted",
              "evicted by the urgent job", timeout=60)
    jobs.wait_phase("urgent-2", "Running", timeout=90)  # the learner's pod is gone: its SIGTERM save is done
    release(jobs, "urgent-2")
    jobs.wait_phase("urgent-2", "Succeeded", timeout=60)

    try:
        status = jobs.wait("learner", lambda s: s.get("attempt") == 1 and "resumedFromStep" in s.get("progress", {}),
                           "attempt 1 training from the checkpoint", timeout=180)
        assert status["restarts"] == 0, "an eviction is not a failure: it counts no restart"
        assert status["progress"]["resumedFromStep"] >= before, (before, status["progress"])
    finally:
        jobs.lab.api.delete(f"{jobs.base}/learner")
        wait_for(lambda: not jobs.pods("learner"), 90, "the learner's pod gone", interval=0.5)


def test_two_flavors_on_differently_labelled_nodes_put_each_job_where_kueue_assigned_it(jobs: Jobs) -> None:
    """A ClusterQueue of two flavors, 4 GPUs each, tried in order: the first job gets pool-a, the second, with
    pool-a's quota used, pool-b; each pod carries its flavor's node label and runs on that flavor's node."""
    api = jobs.lab.api
    pools = {"pool-a": "lab-node-0", "pool-b": "lab-node-1"}
    for flavor, node in pools.items():
        api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"example.com/pool": flavor}}})
        api.post(f"{KUEUE_API}/resourceflavors", {
            "apiVersion": KUEUE.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"example.com/pool": flavor}}})
    quota = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}
    api.post(f"{KUEUE_API}/clusterqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "ClusterQueue", "metadata": {"name": "pools"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": list(quota), "flavors": [
            {"name": flavor, "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}
            for flavor in pools]}]}})
    api.post(f"{KUEUE_API}/namespaces/{NAMESPACE}/localqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "LocalQueue",
        "metadata": {"name": "pools", "namespace": NAMESPACE}, "spec": {"clusterQueue": "pools"}})

    for name, flavor in (("in-a", "pool-a"), ("in-b", "pool-b")):
        job = queued_job(jobs, name, queue="pools")
        jobs.wait_phase(name, "Running", timeout=120)
        [pod] = jobs.pods(name)
        assert pod["spec"]["nodeSelector"]["example.com/pool"] == flavor
        assert pod["spec"]["nodeName"] == pools[flavor]
        [assignment] = workload_of(jobs, job)["status"]["admission"]["podSetAssignments"]
        assert assignment["flavors"]["nvidia.com/gpu"] == flavor
    for name in ("in-a", "in-b"):
        release(jobs, name)
        jobs.wait_phase(name, "Succeeded", timeout=60)


def pods_ready(workload: Json) -> Json:
    return next((c for c in workload["status"].get("conditions") or [] if c["type"] == "PodsReady"), {})


def test_under_wait_for_pods_ready_a_running_job_keeps_its_quota_and_one_that_cannot_start_gives_it_back(
        jobs: Jobs) -> None:
    """The lab's Kueue evicts an admitted Workload whose PodsReady is not True within PODS_READY_TIMEOUT_S: the
    operator says PodsReady for a running job, as Kueue's integrations do; a job whose pod no node can take is
    evicted when the timeout passes, says so, and holds nothing. Two 2-GPU jobs: Kueue admits both at once."""
    steady = queued_job(jobs, "steady", gpus=2)
    stuck = queued_job(jobs, "stuck", gpus=2, node_selector={"example.com/pool": "nowhere"})
    jobs.wait_phase("steady", "Running", timeout=60)
    wait_for(lambda: pods_ready(workload_of(jobs, steady)).get("status") == "True", 15,
             "the running job's Workload PodsReady", interval=0.25)
    assert pods_ready(workload_of(jobs, steady))["reason"] == "Started"

    status = jobs.wait("stuck", lambda s: admitted(s).get("reason") == "PodsReadyTimeout",
                       "evicted by waitForPodsReady", timeout=PODS_READY_TIMEOUT_S + 60)
    assert status["phase"] == "Queued"
    assert status["message"].startswith("evicted by Kueue (PodsReadyTimeout)"), status["message"]
    assert "Exceeded the PodsReady timeout" in status["message"], status["message"]
    wait_for(lambda: not jobs.pods("stuck"), 30, "the stuck job's pod gone", interval=0.5)
    wait_for(lambda: not read_admission(workload_of(jobs, stuck)).quota_reserved, 15, "its quota given back",
             interval=0.25)

    # The running job was admitted no later than the stuck one, so its timeout has passed too: it stays.
    status = jobs.status("steady")
    assert (status["phase"], status["attempt"], admitted(status).get("status")) == ("Running", 0, "True"), status
    assert read_admission(workload_of(jobs, steady)).state.value == "Admitted"
    jobs.lab.api.delete(f"{jobs.base}/stuck")
    release(jobs, "steady")
    jobs.wait_phase("steady", "Succeeded", timeout=60)


# An admission check's answer as Kueue's ProvisioningRequest check gives it: the capacity the autoscaler made.
PROVISIONED = {"cluster-autoscaler.kubernetes.io/consume-provisioning-request": "checked-1",
               "cluster-autoscaler.kubernetes.io/provisioning-class-name": "check-capacity.autoscaling.x-k8s.io"}


def test_an_admission_check_holds_the_job_and_its_pod_set_updates_reach_the_pods(jobs: Jobs) -> None:
    """A ClusterQueue with an admission check, whose controller the test plays: Kueue reserves quota, the job waits
    Queued saying which check it waits for, with no pods; the check says Ready with podSetUpdates, Kueue admits,
    and the pod carries the update's annotations, label, node selector and toleration."""
    api, now = jobs.lab.api, "2026-12-05T00:00:00Z"
    api.post(f"{KUEUE_API}/admissionchecks", {
        "apiVersion": KUEUE.API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": "capacity"},
        "spec": {"controllerName": "example.com/capacity"}})
    api.merge_patch(f"{KUEUE_API}/admissionchecks/capacity/status", {"status": {"conditions": [
        {"type": "Active", "status": "True", "reason": "Active", "message": "played by the test",
         "lastTransitionTime": now}]}})
    quota = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"}
    api.post(f"{KUEUE_API}/clusterqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "ClusterQueue", "metadata": {"name": "checked"},
        "spec": {"namespaceSelector": {}, "admissionChecksStrategy": {"admissionChecks": [{"name": "capacity"}]},
                 "resourceGroups": [{"coveredResources": list(quota), "flavors": [
                     {"name": FLAVOR, "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}]}]}})
    api.post(f"{KUEUE_API}/namespaces/{NAMESPACE}/localqueues", {
        "apiVersion": KUEUE.API_VERSION, "kind": "LocalQueue",
        "metadata": {"name": "checked", "namespace": NAMESPACE}, "spec": {"clusterQueue": "checked"}})

    job = queued_job(jobs, "checked", queue="checked", gpus=2)
    status = jobs.wait("checked", lambda s: admitted(s).get("reason") == "AdmissionChecksPending",
                       "waiting for the admission check", timeout=60)
    assert status["phase"] == "Queued" and jobs.pods("checked") == []
    assert status["message"] == ("queued in Kueue LocalQueue checked: quota reserved, waiting for admission "
                                 "checks: capacity Pending"), status["message"]

    api.merge_patch(f"/api/v1/nodes/{FLAVOR_NODE}", {"metadata": {"labels": {"example.com/capacity": "made"}}})
    update = {"name": "trainer", "labels": {"example.com/provisioned": "yes"}, "annotations": PROVISIONED,
              "nodeSelector": {"example.com/capacity": "made"},
              "tolerations": [{"key": "example.com/capacity", "operator": "Exists", "effect": "NoSchedule"}]}
    api.merge_patch(f"{workload_path(job)}/status", {"status": {"admissionChecks": [
        {"name": "capacity", "state": "Ready", "message": "capacity made", "lastTransitionTime": now,
         "podSetUpdates": [update]}]}})
    try:
        jobs.wait_phase("checked", "Running", timeout=60)
        [pod] = jobs.pods("checked")
        assert PROVISIONED.items() <= pod["metadata"]["annotations"].items(), pod["metadata"]["annotations"]
        assert pod["metadata"]["labels"]["example.com/provisioned"] == "yes"
        assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": FLAVOR_NODE, "example.com/capacity": "made"}
        assert update["tolerations"][0] in pod["spec"]["tolerations"]
        assert pod["spec"]["nodeName"] == FLAVOR_NODE
        release(jobs, "checked")
        jobs.wait_phase("checked", "Succeeded", timeout=60)
    finally:
        api.merge_patch(f"/api/v1/nodes/{FLAVOR_NODE}", {"metadata": {"labels": {"example.com/capacity": None}}})
