"""The operator on the lab's real API server: lifecycle, every failure path, run policy, crash safety.

Pods run real torchrun (with --no-python and a small Python program), so each test proves the pod
contract too. The operator authenticates with the chart's ServiceAccount (see operator_fixtures).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubetrain.core import api
from tests.lab.images import exec_only_image
from tests.lab.jobs import Jobs, phase_recorder
from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]
Json = Any

# Succeeds from attempt 1 on; attempt 0 waits to be killed, evicted, suspended or declared stalled.
SECOND_ATTEMPT_SUCCEEDS = (
    "import os, time\n"
    "if os.environ['KUBETRAIN_ATTEMPT'] == '0':\n"
    "    time.sleep(600)\n"
)


# Serves a heartbeat that never advances on attempt 0 (a hung trainer); exits 0 from attempt 1 on.
FROZEN_HEARTBEAT = (
    "import os, sys, time\n"
    "if os.environ['KUBETRAIN_ATTEMPT'] != '0':\n"
    "    sys.exit(0)\n"
    "from prometheus_client import Gauge, start_http_server\n"
    "Gauge('trainer_step', 'step').set(7)\n"
    "Gauge('trainer_last_step_timestamp_seconds', 'heartbeat').set(time.time())\n"
    "start_http_server(int(os.environ['KUBETRAIN_METRICS_PORT']))\n"
    "time.sleep(600)\n"
)


EXEC_ONLY_IMAGE = "test.kubetrain.io/exec-only:1"


def spec(code: str, nodes: int = 1, **extra: Json) -> Json:
    """A job whose pods run ``python -c code`` under torchrun."""
    return {
        "nodes": nodes,
        "procsPerNode": 1,
        "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
        "command": ["python", "-c", code],
        **extra,
        "runPolicy": {"terminationGracePeriodSeconds": 5, **extra.get("runPolicy", {})},
    }


def condition(status: Json, kind: str) -> Json:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def running_pod(jobs: Jobs, name: str, index: int = 0) -> Json:
    def found() -> bool:
        return any(p["metadata"]["name"] == f"{name}-{index}" and p.get("status", {}).get("phase") == "Running"
                   for p in jobs.pods(name))
    wait_for(found, 120, f"pod {name}-{index} running", interval=0.25)
    return next(p for p in jobs.pods(name) if p["metadata"]["name"] == f"{name}-{index}")


def test_job_goes_pending_running_succeeded(lab: Lab, jobs: Jobs, operator: OperatorProcess) -> None:
    record = phase_recorder(jobs, "hello")
    jobs.create("hello", spec("import time; time.sleep(4); print('trained')", nodes=2))
    waited = lab.kubectl("wait", "-n", jobs.namespace, "--for=condition=Succeeded", "tj/hello", "--timeout=180s",
                         check=False, timeout=200)
    phases = record()
    assert waited.returncode == 0, (f"{waited.stderr}; phases {phases}; status {jobs.status('hello')}; "
                                    f"the operator's log ends: {operator.log()[-3000:]}")
    assert phases[0] == "Pending" and phases[-1] == "Succeeded"
    assert "Running" in phases
    status = jobs.status("hello")
    assert status["nodes"]["succeeded"] == 2
    assert status["restarts"] == 0 and status["completionTime"]
    table = lab.kubectl("get", "tj", "-n", jobs.namespace).stdout
    assert "hello" in table and "Succeeded" in table and "0/2" in table
    pods = jobs.pods("hello")
    assert {p["metadata"]["name"] for p in pods} == {"hello-0", "hello-1"}
    assert all(p["metadata"]["ownerReferences"][0]["name"] == "hello" for p in pods)
    managers = {m["manager"] for p in pods for m in p["metadata"]["managedFields"]}
    assert api.OPERATOR_COMPONENT in managers, f"the API server names the pods' writer: {managers}"
    assert "trained" in lab.pod_log(jobs.namespace, "hello-1").read_text()
    events = jobs.events("hello")
    assert {"PodsCreated", "AllPodsRunning", "AllPodsSucceeded"} <= {e["reason"] for e in events}
    # kopf posts its log lines about an object as its events: one per job event, saying nothing
    noise = [e["message"] for e in events if e["reason"] == "Logging"]
    assert not noise, noise
    assert "Handler 'job_changed' succeeded." not in operator.log(), "a line per job event that says nothing"


def test_failing_job_restarts_then_fails_with_a_post_mortem(jobs: Jobs) -> None:
    jobs.create("broken", spec("import sys; sys.exit(3)", failurePolicy={"backoffLimit": 1}))
    status = jobs.wait_phase("broken", "Failed", timeout=180)
    assert status["restarts"] == 1
    assert condition(status, "Failed")["reason"] == "BackoffLimitExceeded"
    failures = status["failures"]
    assert [f["attempt"] for f in failures] == [0, 1]
    assert all(f["pod"] == "broken-0" and f["exitCode"] != 0 and f["node"] for f in failures)
    assert "backoffLimit=1" in status["message"]


def evict(lab: Lab, namespace: str, pod: str) -> None:
    """What a drain or kube-scheduler's preemption does: the Eviction API (a DisruptionTarget, then deletion)."""
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
                 {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}})


def test_sigkilled_pod_restarts_the_gang_and_the_job_recovers(lab: Lab, jobs: Jobs) -> None:
    jobs.create("killed", spec(SECOND_ATTEMPT_SUCCEEDS, nodes=2))
    jobs.wait_phase("killed", "Running")
    lab.kill_pod(jobs.namespace, "killed-1", signal.SIGKILL)
    status = jobs.wait_phase("killed", "Succeeded", timeout=180)
    assert status["restarts"] == 1 and status["attempt"] == 1
    (failure,) = [f for f in status["failures"] if f.get("pod") == "killed-1"]
    assert failure["counted"] is True


def test_oom_killed_pod_fails_the_job(lab: Lab, jobs: Jobs) -> None:
    jobs.create("hungry", spec("import time; time.sleep(600)"))
    jobs.wait_phase("hungry", "Running")
    lab.oom_kill_pod(jobs.namespace, "hungry-0")
    status = jobs.wait_phase("hungry", "Failed")
    assert condition(status, "Failed")["reason"] == "OOMKilled"
    assert status["failures"][-1]["reason"] == "OOMKilled"
    assert status["restarts"] == 0


def test_evicted_pod_restarts_without_counting(lab: Lab, jobs: Jobs) -> None:
    jobs.create("evicted", spec(SECOND_ATTEMPT_SUCCEEDS, failurePolicy={"backoffLimit": 0}))
    jobs.wait_phase("evicted", "Running")
    evict(lab, jobs.namespace, "evicted-0")
    status = jobs.wait_phase("evicted", "Succeeded", timeout=180)
    assert status["restarts"] == 0 and status["disruptions"] == 1
    assert status["failures"][0]["counted"] is False


def start_saving_on_request(lab: Lab, jobs: Jobs, name: str, *, nodes: int, max_steps: int) -> None:
    """The built-in trainer, one process per node, checkpointing on its claim only when asked or at SIGTERM."""
    lab.create_volume(jobs.namespace, f"{name}-checkpoints")
    jobs.create(name, {
        "nodes": nodes, "procsPerNode": 1,
        "resources": {"cpu": "100m", "memory": "1Gi", "sharedMemory": "64Mi"},
        "trainer": {"task": "digits", "maxSteps": max_steps, "batchSize": 32}, "data": {"workers": 0},
        "checkpoint": {"claimName": f"{name}-checkpoints", "everySteps": 0},
        "runPolicy": {"terminationGracePeriodSeconds": 30}})


def test_an_evicted_pod_is_replaced_alone_while_the_others_wait_and_resume_with_it(lab: Lab, jobs: Jobs) -> None:
    """The built-in trainer on 3 nodes, checkpointing only when SIGTERM asks (everySteps 0): pod 1 is evicted,
    the gang saves that step, pods 0 and 2 wait alive (same uids) for pod 1's replacement at the same attempt, and
    all three resume from that step and finish."""
    start_saving_on_request(lab, jobs, "replaced", nodes=3, max_steps=600)
    before = jobs.wait("replaced", lambda s: int((s.get("progress") or {}).get("step", 0)) >= 20,
                       "the trainer past step 20", timeout=180)["progress"]["step"]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("replaced")}
    evict(lab, jobs.namespace, "replaced-1")
    replacing = jobs.wait("replaced", lambda s: s.get("phase") == "Restarting", "replacing pod 1", timeout=30)
    assert condition(replacing, "Restarting")["reason"] == "PodReplaced", replacing

    status = jobs.wait_phase("replaced", "Succeeded", timeout=300)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("replaced")}
    assert [after[f"replaced-{i}"] == uids[f"replaced-{i}"] for i in range(3)] == [True, False, True], (uids, after)
    assert (status["attempt"], status["restarts"], status["disruptions"]) == (0, 0, 1), status
    (failure,) = status["failures"]
    assert (failure["pod"], failure["podUID"], failure["recovery"]) == (
        "replaced-1", uids["replaced-1"], "PodReplaced")
    assert status["progress"]["resumedFromStep"] >= before, (before, status["progress"])
    assert {"Disrupted", "PodReplaced"} <= {e["reason"] for e in jobs.events("replaced")}


def test_a_drain_announced_by_a_cordon_has_the_gang_checkpoint_before_the_eviction(lab: Lab, jobs: Jobs) -> None:
    """Checkpoints only on request or SIGTERM (everySteps 0): pod 1's node is cordoned, the operator asks rank 0,
    the gang saves at its next step and trains on; the drain's eviction then costs only the steps after it."""
    start_saving_on_request(lab, jobs, "drained", nodes=2, max_steps=100000)
    jobs.wait("drained", lambda s: int((s.get("progress") or {}).get("step", 0)) >= 20, "past step 20", timeout=180)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("drained")}
    node = lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods/drained-1")["spec"]["nodeName"]
    lab.kubectl("cordon", node)
    try:
        status = jobs.wait("drained", lambda s: (s.get("lastCheckpoint") or {}).get("step", 0)
                           >= (s.get("checkpointRequest") or {}).get("step", 1 << 62) > 0,
                           "the checkpoint asked for after the cordon", timeout=60)
        request, saved = status["checkpointRequest"], status["lastCheckpoint"]
        assert (request["node"], request["reason"], request["attempt"]) == (node, "is cordoned (a drain begins)", 0)
        assert saved["path"] == f"/checkpoints/step_{saved['step']:09d}" and saved["claimName"] == "drained-checkpoints"
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("drained")} == uids
        assert (status["restarts"], status.get("disruptions", 0), status["phase"]) == (0, 0, "Running"), status
        events = [json.loads(line[line.index("{"):]) for line in
                  lab.pod_log(jobs.namespace, "drained-0").read_text().splitlines() if '{"event": ' in line]
        asked = [e["step"] for e in events if e["event"] == "checkpoint_asked"]
        assert asked == [saved["step"]] and saved["step"] in [e["step"] for e in events if e["event"] == "checkpoint"]
        wait_for(lambda: any(e["reason"] == "CheckpointRequested" for e in jobs.events("drained")), 30,
                 "the CheckpointRequested event", interval=0.5)
        evict(lab, jobs.namespace, "drained-1")  # the drain goes on
        resumed = jobs.wait("drained", lambda s: int((s.get("progress") or {}).get("resumedFromStep", 0)) > 0,
                            "the resume after the eviction", timeout=180)["progress"]["resumedFromStep"]
        assert resumed >= saved["step"], (resumed, saved)
    finally:
        lab.kubectl("uncordon", node)
        lab.api.delete(f"{jobs.base}/drained")


def test_a_job_evicted_over_and_over_ends_with_a_reason(lab: Lab, jobs: Jobs) -> None:
    jobs.create("evictedforever", spec("import time; time.sleep(600)", failurePolicy={"disruptionLimit": 1}))
    for attempt in (0, 1):
        jobs.wait(
            "evictedforever", lambda s, a=attempt: s.get("attempt") == a and s.get("phase") == "Running",
            f"attempt {attempt} running", timeout=120)
        evict(lab, jobs.namespace, "evictedforever-0")
    status = jobs.wait_phase("evictedforever", "Failed", timeout=120)
    assert condition(status, "Failed")["reason"] == "TooManyDisruptions"
    assert "failurePolicy.disruptionLimit is 1" in status["message"], status["message"]
    assert status["restarts"] == 0 and status["attempt"] == 1


def test_a_gang_the_cluster_cannot_place_fails_with_rendezvous_timeout(lab: Lab, jobs: Jobs) -> None:
    nodes = len(lab.node_names) + 1  # one pod per machine, required: one of them is never scheduled
    one_per_machine = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"kubetrain.io/job-name": "unplaceable"}}}]}}
    jobs.create("unplaceable", spec("print('never')", nodes=nodes, scheduling={"affinity": one_per_machine},
                                    failurePolicy={"rendezvousTimeoutSeconds": 10}))
    status = jobs.wait_phase("unplaceable", "Failed", timeout=120)
    failed = condition(status, "Failed")
    assert failed["reason"] == "RendezvousTimeout", status
    # The scheduler leaves any one of them out; if it is node 0 (the rendezvous host), the others cannot even
    # reach the rendezvous: the same verdict.
    assert any(f"unplaceable-{i} never started in time" in status["message"] for i in range(nodes)), status["message"]
    assert status["restarts"] == 0 and status["attempt"] == 0, status.get("failures")


def test_node_loss_restarts_the_gang_on_a_healthy_node(lab: Lab, jobs: Jobs) -> None:
    jobs.create("nodeloss", spec(SECOND_ATTEMPT_SUCCEEDS, failurePolicy={"nodeLostTimeoutSeconds": 2}))
    node = running_pod(jobs, "nodeloss")["spec"]["nodeName"]
    lab.stop_node_heartbeats(node)
    try:
        status = jobs.wait(
            "nodeloss", lambda s: s.get("attempt", 0) >= 1, "a new attempt after the node was lost", timeout=150)
        assert status.get("disruptions", 0) == 1 and status["restarts"] == 0
        assert status["failures"][0]["node"] == node
    finally:
        lab.resume_node_heartbeats(node)
    jobs.wait_phase("nodeloss", "Succeeded", timeout=180)


def test_deadline_fails_the_job_and_stops_its_pods(jobs: Jobs) -> None:
    jobs.create("slow", spec("import time; time.sleep(600)", runPolicy={"activeDeadlineSeconds": 8}))
    status = jobs.wait_phase("slow", "Failed", timeout=120)
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: not jobs.pods("slow"), 60, "the pods to be deleted", interval=0.5)


def test_finished_job_is_deleted_after_its_ttl(lab: Lab, jobs: Jobs) -> None:
    jobs.create("shortlived", spec("print('done')", runPolicy={"ttlSecondsAfterFinished": 2}))
    jobs.wait_phase("shortlived", "Succeeded")

    def deleted() -> bool:
        return "shortlived" not in lab.kubectl("get", "tj", "-n", jobs.namespace, "-o", "name").stdout
    wait_for(deleted, 60, "the job to be deleted by its TTL", interval=0.5)


def test_suspend_deletes_pods_and_resume_continues(jobs: Jobs) -> None:
    jobs.create("pausable", spec(SECOND_ATTEMPT_SUCCEEDS, nodes=2))
    jobs.wait_phase("pausable", "Running")
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": True}})
    status = jobs.wait_phase("pausable", "Suspended")
    jobs.patch_spec("pausable", {"nodes": 1})  # a fixed-size job may be resized while suspended
    assert condition(status, "Suspended")["status"] == "True"
    wait_for(lambda: not jobs.pods("pausable"), 60, "the pods to be deleted", interval=0.5)
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": False}})
    status = jobs.wait_phase("pausable", "Succeeded", timeout=180)
    assert status["restarts"] == 0 and status["attempt"] == 1
    assert status["nodes"]["desired"] == 1


def test_stalled_job_is_restarted(jobs: Jobs) -> None:
    jobs.create("stuck", spec(FROZEN_HEARTBEAT, failurePolicy={"stallTimeoutSeconds": 15}))
    status = jobs.wait("stuck", lambda s: "heartbeatTime" in s.get("progress", {}), "progress scraped from rank 0")
    assert status["progress"]["step"] == 7
    status = jobs.wait_phase("stuck", "Succeeded", timeout=180)
    assert status["restarts"] == 1
    assert status["failures"][0]["reason"] == "NoHeartbeat"
    # prometheus_client's server answers every path with its metrics: no stack, and the record says so.
    assert status["failures"][0]["hang"]["culprits"][0]["where"] == (
        "local rank 0 did not answer (its port serves no stack: not kubetrain_trainer's server)")
    assert condition(status, "Stalled")["status"] == "False"  # the new attempt is healthy again


def test_job_managed_by_another_controller_is_left_alone(jobs: Jobs) -> None:
    jobs.create("foreign", spec("print(1)", runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"}))
    hello = jobs.create("control", spec("print(1)"))
    assert hello["metadata"]["name"] == "control"
    jobs.wait_phase("control", "Succeeded")
    assert jobs.status("foreign") == {} and jobs.pods("foreign") == []


def reconcile_errors(operator: OperatorProcess) -> float:
    return sum(float(line.split()[-1]) for line in operator.metrics().splitlines()
               if line.startswith("kubetrain_reconcile_errors_total{"))


def test_a_job_whose_namespace_is_being_deleted_is_let_go(lab: Lab, operator: OperatorProcess) -> None:
    """Deleting a namespace removes the pods before the job: the operator asks the API server (a dry-run pod
    create, refused there) and lets the job go: no gang restart, no failed reconcile, no event it cannot post
    (kopf would retry each for a minute), nothing in its status that speaks of eviction or refusal."""
    namespace = f"test-doomed-{uuid.uuid4().hex[:5]}"  # the test operator watches test-*
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    lab.wait_service_account(namespace)
    held = f"/api/v1/namespaces/{namespace}/configmaps"  # keeps the namespace terminating while we look
    lab.api.post(held, {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "held", "finalizers": ["test.kubetrain.io/hold"]}})
    doomed = Jobs(lab, namespace)
    try:
        doomed.create("doomed", spec(SECOND_ATTEMPT_SUCCEEDS, nodes=2))
        doomed.wait_phase("doomed", "Running")
        errors = reconcile_errors(operator)
        statuses: list[Json] = []

        def job_gone() -> bool:
            try:
                statuses.append(doomed.status("doomed"))
            except ApiError as error:
                return error.status == 404
            return False
        delete_namespace(lab, namespace)  # the namespace, then its pods at once (as the bench does)
        wait_for(job_gone, 60, "the namespace controller deleted the job")
        time.sleep(2)  # retries (with backoff from 1 s) would have come by now
        assert reconcile_errors(operator) == errors
        assert {s.get("phase") for s in statuses} <= {"Running"}, "no gang restart"
        messages = [c.get("message", "") for s in statuses for c in s.get("conditions", [])]
        assert not [m for m in messages if "evict" in m or "forbidden" in m.lower()], messages
        refused = [line for line in operator.log().splitlines() if namespace in line and "events" in line]
        assert not refused, refused[:3]
    finally:
        lab.api.merge_patch(f"{held}/held", {"metadata": {"finalizers": None}})


def test_a_namespaces_pod_watch_ends_with_its_last_job(jobs: Jobs, operator: OperatorProcess) -> None:
    """An operator that runs for months sees many short-lived namespaces: it watches one's pods while the
    namespace has a job, not for good."""
    started = f"watching the pods of jobs in {jobs.namespace}"
    stopped = f"stopped watching pods in {jobs.namespace}: its last job is gone"
    for name in ("first", "second"):
        jobs.create(name, spec("pass"))
    jobs.wait_phase("first", "Succeeded")
    jobs.lab.api.delete(f"{jobs.base}/first")
    jobs.wait_phase("second", "Succeeded")
    assert operator.log().count(started) == 1 and stopped not in operator.log(), "the second job is still there"
    jobs.lab.api.delete(f"{jobs.base}/second")
    wait_for(lambda: stopped in operator.log(), 30, "the namespace's pod watch stopped")
    jobs.create("third", spec("pass"))  # the namespace is watched again
    jobs.wait_phase("third", "Succeeded")
    assert operator.log().count(started) == 2


def test_operator_killed_while_50_jobs_are_created_makes_no_duplicates(
    lab: Lab, jobs: Jobs, operator: OperatorProcess, tmp_path: Path,
) -> None:
    names = [f"burst-{i:02d}" for i in range(50)]
    # The operator is under test, not torchrun: the pods run `true` in the exec-only image, all 50 at once
    # (50 torchrun agents would need ~20 GiB, so they had to run 10 at a time: 80 s instead of about 20).
    lab.images.put_first(EXEC_ONLY_IMAGE, exec_only_image(tmp_path / "image"))
    burst = {**spec(""), "image": EXEC_ONLY_IMAGE, "command": ["true"],
             "resources": {"cpu": "10m", "memory": "32Mi", "sharedMemory": "1Mi"}}
    for number, name in enumerate(names):
        jobs.create(name, burst)
        if number == 20:
            operator.kill(signal.SIGKILL)
    operator.start()
    seen_uids: dict[str, set[str]] = {name: set() for name in names}

    def all_done() -> bool:
        for pod in lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods")["items"]:
            seen_uids[pod["metadata"]["labels"]["kubetrain.io/job-name"]].add(pod["metadata"]["uid"])
        listing = lab.api.get(f"/apis/kubetrain.io/v1alpha1/namespaces/{jobs.namespace}/trainingjobs")["items"]
        return sum(1 for j in listing if (j.get("status") or {}).get("phase") == "Succeeded") == len(names)
    wait_for(all_done, 420, "all 50 jobs to succeed", interval=1.0)
    pods = lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods")["items"]
    per_job = Counter(p["metadata"]["labels"]["kubetrain.io/job-name"] for p in pods)
    assert per_job == Counter(dict.fromkeys(names, 1))
    # Each job had exactly one pod over its whole life: no second pod was created and deleted.
    assert all(len(uids) == 1 for uids in seen_uids.values()), seen_uids
    statuses = [jobs.status(name) for name in names]
    assert all(s["restarts"] == 0 and s["attempt"] == 0 for s in statuses)
    exposed = samples(operator.metrics())
    created = exposed[("kubetrain_pod_creations_total", ())]
    assert created >= 1
    # Every pod it made is one successful create call in its count of API requests, by verb and resource.
    assert exposed[("kubetrain_api_requests_total", (("code", "2xx"), ("resource", "pods"), ("verb", "create")))] == (
        created)
    assert exposed[("kubetrain_api_requests_total", (("code", "2xx"), ("resource", "trainingjobs/status"),
                                                     ("verb", "patch")))] >= created


def samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus' text exposition as {(sample name, sorted labels): value}."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(exposition) for sample in family.samples}


# Waits for the second node; when it joins, torchrun re-rendezvous and both workers see WORLD_SIZE=2.
UNTIL_TWO_NODES = (
    "import os, sys, time\n"
    "print('world size', os.environ['WORLD_SIZE'], flush=True)\n"
    "sys.exit(0) if os.environ['WORLD_SIZE'] == '2' else time.sleep(600)\n"
)


def _rescale(lab: Lab, jobs: Jobs, name: str, program: str, nodes: tuple[int, int]) -> Json:
    """Run ``program`` on nodes[0] nodes of an elastic job ranging between both counts, scale it to nodes[1] once
    its workers started, and wait for its success; checks that torchrun re-rendezvoused in place. Its status."""
    jobs.create(name, spec(program, nodes=nodes[0], elastic={"minNodes": min(nodes), "maxNodes": max(nodes)}))
    jobs.wait_phase(name, "Running", timeout=180)
    wait_for(lambda: f"world size {nodes[0]}" in lab.pod_log(jobs.namespace, f"{name}-0").read_text(), 120,
             f"the workers to start with world size {nodes[0]}", interval=0.5)
    lab.kubectl("scale", "-n", jobs.namespace, f"tj/{name}", f"--replicas={nodes[1]}")
    status: Json = jobs.wait_phase(name, "Succeeded", timeout=240)
    assert status["attempt"] == 0 and status["restarts"] == 0, "torchrun re-rendezvous in place"
    assert status["nodes"]["desired"] == nodes[1]
    return status


def test_elastic_job_grows_through_the_scale_subresource(lab: Lab, jobs: Jobs) -> None:
    _rescale(lab, jobs, "growing", UNTIL_TWO_NODES, (1, 2))
    assert "world size 2" in lab.pod_log(jobs.namespace, "growing-0").read_text()
    scale = lab.api.get(f"/apis/kubetrain.io/v1alpha1/namespaces/{jobs.namespace}/trainingjobs/growing/scale")
    assert scale["spec"]["replicas"] == 2


# gloo all-reduces until it has run with two processes: a peer that leaves fails the survivors' next one.
UNTIL_SHRUNK_TO_TWO = (
    "import time, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "size = dist.get_world_size()\n"
    "print('world size', size, flush=True)\n"
    "for step in range(100000):\n"
    "    dist.all_reduce(torch.ones(1))\n"
    "    if size == 2 and step >= 5: break\n"
    "    time.sleep(0.2)\n"
    "dist.destroy_process_group()\n"
)


def test_elastic_job_shrinks_in_place_without_a_restart(lab: Lab, jobs: Jobs) -> None:
    status = _rescale(lab, jobs, "shrinking", UNTIL_SHRUNK_TO_TWO, (3, 2))
    assert not status.get("failures") and not status.get("disruptions")
    assert "world size 2" in lab.pod_log(jobs.namespace, "shrinking-1").read_text()
    assert "ScaledDown" in {e["reason"] for e in jobs.events("shrinking")}


def test_watch_follows_a_job_to_its_end(lab: Lab, jobs: Jobs) -> None:
    jobs.create("watched", spec("import time; time.sleep(3)"))
    watcher = subprocess.run(
        [sys.executable, "-m", "kubetrain.cli.commands", "watch", "watched", "-n", jobs.namespace, "--timeout=180"],
        env={**os.environ, "KUBECONFIG": str(lab.kubeconfig), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=200, check=False,
    )
    assert watcher.returncode == 0, watcher.stdout + watcher.stderr
    assert "watched: Succeeded" in watcher.stdout
    assert "watched: Running" in watcher.stdout or "watched: Pending" in watcher.stdout
