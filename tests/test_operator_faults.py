"""The operator on the lab when the API server refuses what it asks for, and when a job's name is reused.

Each test checks that the status tells the truth: a job whose pods are refused fails with the API's
message, a refusal that can lift (quota) is retried and says so, and a new job never takes the pods
of a deleted job of the same name.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.lab.jobs import Jobs, phase_recorder
from tests.lab.lab import Lab
from tests.lab.procs import wait_for
from tests.test_operator import condition, spec

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]
Json = Any

# Accepted by the CRD (volumes are core/v1 Volumes, checked by the API server only for pods).
TWO_SOURCES = [{"name": "scratch", "emptyDir": {}, "configMap": {"name": "settings"}}]


def test_job_whose_pods_the_api_server_refuses_fails_with_its_message(jobs: Jobs) -> None:
    jobs.create("refused", spec("print(1)", volumes=TWO_SOURCES))
    started = time.monotonic()
    status = jobs.wait_phase("refused", "Failed", timeout=30)
    assert time.monotonic() - started < 15
    failed = condition(status, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidPodSpec"
    assert "may not specify more than 1 volume type" in status["message"]
    assert "refused-0" in status["message"]
    events = [e for e in jobs.events("refused") if e["reason"] == "InvalidPodSpec"]
    assert events and "may not specify more than 1 volume type" in events[0]["message"]
    assert jobs.pods("refused") == []


def _quota(lab: Lab, namespace: str) -> str:
    """A ResourceQuota that allows no pods, once the quota controller has counted (so it is enforced)."""
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    lab.api.post(path, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
                        "spec": {"hard": {"pods": "0"}}})
    wait_for(lambda: "used" in (lab.api.get(f"{path}/no-pods").get("status") or {}), 60,
             "the quota to be counted", interval=0.25)
    return f"{path}/no-pods"


def test_pods_over_quota_are_retried_until_the_quota_is_lifted(lab: Lab, jobs: Jobs) -> None:
    quota = _quota(lab, jobs.namespace)
    jobs.create("quota", spec("print(1)"))
    status = jobs.wait("quota", lambda s: condition(s, "ReconcileError").get("status") == "True",
                       "the quota refusal in the status", timeout=30)
    error = condition(status, "ReconcileError")
    assert error["reason"] == "QuotaExceeded"
    assert "exceeded quota: no-pods" in error["message"] and error["message"].startswith("retrying in ")
    assert status["phase"] == "Pending" and status["message"].startswith("retrying in ")
    # retried with backoff (1 s, 2 s, 4 s, ...): the third refusal comes after the third, not sooner
    jobs.wait("quota", lambda s: condition(s, "ReconcileError")["message"].startswith("retrying in 4s"),
              "a third try, after backing off", timeout=30)
    refusals = [e for e in jobs.events("quota") if e["reason"] == "QuotaExceeded"]
    assert all("exceeded quota: no-pods" in e["message"] for e in refusals)
    assert 3 <= sum(e.get("count", 1) for e in refusals) <= 4, refusals
    lab.api.delete(quota)
    status = jobs.wait_phase("quota", "Succeeded", timeout=120)
    cleared = condition(status, "ReconcileError")
    assert cleared["status"] == "False" and cleared["reason"] == "Reconciled"


def test_new_job_with_the_name_of_an_orphaning_deleted_one_runs_its_own_pods(lab: Lab, jobs: Jobs) -> None:
    jobs.create("reborn", spec("print('first life')"))
    jobs.wait_phase("reborn", "Succeeded")
    (old_pod,) = jobs.pods("reborn")
    old_service = lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/services/reborn")
    lab.kubectl("delete", "tj", "reborn", "-n", jobs.namespace, "--cascade=orphan", "--wait=true")

    def orphaned() -> bool:  # the garbage collector strips the owner references of orphaned children
        return not jobs.pods("reborn")[0]["metadata"].get("ownerReferences")
    wait_for(orphaned, 60, "the old pod to be orphaned", interval=0.25)

    record = phase_recorder(jobs, "reborn")
    new_uid = jobs.create("reborn", spec("import time; time.sleep(3); print('second life')"))["metadata"]["uid"]
    status = jobs.wait_phase("reborn", "Succeeded", timeout=180)
    phases = record()
    assert phases[0] == "Pending" and "Running" in phases, phases
    (pod,) = jobs.pods("reborn")
    assert pod["metadata"]["uid"] != old_pod["metadata"]["uid"], "the old job's pod was taken as the new one's"
    assert pod["metadata"]["labels"]["kubetrain.io/job-uid"] == new_uid
    assert pod["metadata"]["ownerReferences"][0]["uid"] == new_uid
    assert status["nodes"]["succeeded"] == 1
    service = lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/services/reborn")
    assert service["metadata"]["uid"] != old_service["metadata"]["uid"]
    assert service["spec"]["selector"]["kubetrain.io/job-uid"] == new_uid
