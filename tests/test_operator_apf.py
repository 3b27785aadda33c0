"""API Priority and Fairness on the lab's real kube-apiserver: the chart's FlowSchema takes the operator's requests.

The operator fixture runs with the identity the chart renders (tests/lab/chart.install_identity), its FlowSchema
and PriorityLevelConfiguration included; the API server's own counters say which schema each request matched.
"""

from __future__ import annotations

import pytest
import requests
import yaml

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
