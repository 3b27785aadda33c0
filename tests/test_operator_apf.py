"""API Priority and Fairness on the lab's real kube-apiserver: the chart's FlowSchema takes the operator's requests.

The operator fixture runs with the identity the chart renders (tests/lab/chart.install_identity), its FlowSchema
and PriorityLevelConfiguration included; the API server's own counters say which schema each request matched.
"""

from __future__ import annotations

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.lab.chart import RELEASE, operator_requests
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]

FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
LEVEL = RELEASE  # the chart's fullname for the release the lab renders


def test_the_flow_schema_is_bound_to_its_level(lab: Lab) -> None:
    schema = lab.api.get(f"{FLOWCONTROL}/flowschemas/{LEVEL}")
    conditions = {c["type"]: c["status"] for c in schema.get("status", {}).get("conditions", [])}
    assert conditions.get("Dangling") == "False", schema.get("status")
    level = lab.api.get(f"{FLOWCONTROL}/prioritylevelconfigurations/{LEVEL}")
    assert level["spec"]["limited"]["limitResponse"]["type"] == "Queue"


def test_a_request_with_the_operators_token_matches_the_flow_schema(lab: Lab, operator: OperatorProcess) -> None:
    config = yaml.safe_load(operator.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    answer = requests.get(cluster["server"] + "/api/v1/namespaces/default/pods", timeout=30,
                          verify=cluster["certificate-authority"], headers={"Authorization": f"Bearer {user['token']}"})
    schema = lab.api.get(f"{FLOWCONTROL}/flowschemas/{LEVEL}")
    level = lab.api.get(f"{FLOWCONTROL}/prioritylevelconfigurations/{LEVEL}")
    assert answer.headers.get("X-Kubernetes-PF-FlowSchema-UID") == schema["metadata"]["uid"], answer.headers
    assert answer.headers.get("X-Kubernetes-PF-PriorityLevel-UID") == level["metadata"]["uid"], answer.headers


def test_the_operators_requests_run_in_its_own_priority_level(lab: Lab, jobs: Jobs) -> None:
    before = operator_requests(lab)
    jobs.create("apf", {"nodes": 2, "resources": {"cpu": "100m", "memory": "512Mi"},
                        "command": ["python", "-c", "print('hello')"]})
    jobs.wait_phase("apf", "Succeeded", timeout=120)
    # two pods and a Service created, status written: by the operator, whose account only this schema matches
    wait_for(lambda: operator_requests(lab) >= before + 4, 30, "the operator's requests under its FlowSchema")


def _rejected(lab: Lab, level: str = LEVEL) -> int:
    """Requests the API server refused in ``level`` (APF's rejected-requests counter, from its /metrics)."""
    text = lab.api.session.get(lab.api.server + "/metrics", verify=lab.api.verify, timeout=30).text
    return round(sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                     if sample.name == "apiserver_flowcontrol_rejected_requests_total"
                     and sample.labels.get("priority_level") == level))


def _throttled(operator: OperatorProcess) -> int:
    """The operator's calls answered 429, by its own count (kubetrain_api_requests_total)."""
    return round(sum(sample.value for family in text_string_to_metric_families(operator.metrics())
                     for sample in family.samples
                     if sample.name == "kubetrain_api_requests_total" and sample.labels.get("code") == "429"))


def test_calls_the_api_server_refuses_are_tried_again_and_every_job_still_runs(lab: Lab, jobs: Jobs,
                                                                               operator: OperatorProcess) -> None:
    """The chart's priority level shrunk to its least (about 3 seats) and set to reject rather than queue: the real
    API server answers some of the operator's calls 429 (its own counter says so), the operator waits the
    Retry-After and sends them again, and a burst of jobs all succeed."""
    path = f"{FLOWCONTROL}/prioritylevelconfigurations/{LEVEL}"
    kept = lab.api.get(path)["spec"]
    rejected, throttled = _rejected(lab), _throttled(operator)
    lab.api.merge_patch(path, {"spec": {"limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                              "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject",
                                                                                            "queuing": None}}}})
    names = [f"apf-burst-{number}" for number in range(16)]
    try:
        for name in names:
            jobs.create(name, {"nodes": 1, "resources": {"cpu": "100m", "memory": "256Mi"},
                               "command": ["python", "-c", "print('hello')"]})
        for name in names:
            jobs.wait_phase(name, "Succeeded", timeout=240)
    finally:
        lab.api.put(path, {**lab.api.get(path), "spec": kept})
    assert _rejected(lab) > rejected, "the API server refused none of the operator's requests: nothing was shown"
    assert _throttled(operator) > throttled
