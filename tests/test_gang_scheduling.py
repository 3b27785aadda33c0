"""Gang scheduling through scheduler-plugins' coscheduling: the PodGroup the operator makes, and its pods.

The lab installs the PodGroup CRD from scheduler-plugins' own module and runs a second operator with
``--pod-group-scheduler`` for a namespace of its own. The coscheduling scheduler itself does not run here
(see tests/lab/build.py: its module needs a Kubernetes module the proxy refuses), so the pods it would place
stay Pending, and the job says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.build import pod_group_crd
from tests.lab.chart import install_identity, wait_crd_established
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for
from tests.test_operator import spec

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("crd")]
Json = Any
SCHEDULER = "scheduler-plugins-scheduler"
POD_GROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{}/podgroups"


@pytest.fixture
def gang_namespace(lab: Lab) -> Iterator[str]:
    """A namespace outside the session operator's test-* pattern, watched by an operator of its own."""
    lab.kubectl("apply", "--server-side", "-f", str(pod_group_crd()))
    wait_crd_established(lab, name="podgroups.scheduling.x-k8s.io")
    name = f"gang-{uuid.uuid4().hex[:6]}"
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    _, kubeconfig = install_identity(lab)
    operator = OperatorProcess(kubeconfig, lab.run_dir / f"operator-{name}.log",
                               (f"--namespace={name}", f"--pod-group-scheduler={SCHEDULER}"))
    operator.start()
    try:
        yield name
    finally:
        operator.stop()
        delete_namespace(lab, name)


def test_each_job_gets_a_pod_group_and_its_pods_wait_for_the_gang_scheduler(lab: Lab, gang_namespace: str) -> None:
    jobs = Jobs(lab, gang_namespace)
    job = jobs.create("gang", spec("print('placed together')", nodes=3, elastic={"minNodes": 2, "maxNodes": 3},
                                   failurePolicy={"rendezvousTimeoutSeconds": 120}))
    wait_for(lambda: len(jobs.pods("gang")) == 3, 60, "the job's three pods", interval=0.25)
    group = lab.api.get(POD_GROUPS.format(gang_namespace) + "/gang")
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 120}, "elastic: the gang is minNodes"
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("TrainingJob", job["metadata"]["uid"])
    for pod in jobs.pods("gang"):
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang"
        assert pod["spec"]["schedulerName"] == SCHEDULER
    status = jobs.wait("gang", lambda s: "to be scheduled" in s.get("message", ""), "the wait to be told")
    assert status["phase"] == "Pending" and "waiting for 3 pod(s) to be scheduled" in status["message"]


def test_a_jobs_own_scheduler_name_wins(lab: Lab, gang_namespace: str) -> None:
    jobs = Jobs(lab, gang_namespace)
    jobs.create("own", spec("print('placed by the default scheduler')",
                            scheduling={"schedulerName": "default-scheduler"}))
    assert jobs.wait_phase("own", "Succeeded", timeout=120)["phase"] == "Succeeded"
    assert lab.api.get(POD_GROUPS.format(gang_namespace) + "/own")["spec"]["minMember"] == 1
