"""The user's journey on the lab, exactly as a user takes it.

`helm install` the chart (monitoring on, namespaced RBAC, the operator run as a process with the chart's
ServiceAccount token since no image can run here), `kubectl apply -f examples/trainingjob-cpu.yaml` into a
namespace that enforces the restricted Pod Security profile, watch the real trainer rendezvous across the
lab's two nodes and finish, and check that Prometheus scraped it through the chart's PodMonitor and that
the shipped dashboards' queries return data. Then the same job again, with one worker killed mid-run.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lab.build import ensure_binary
from tests.lab.chart import CHART
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.operator_process import OperatorProcess
from tests.lab.prometheus import Prometheus, start_prometheus
from tests.monitoring import MONITORING_CRDS, pod_monitor_job, service_monitor_job

pytestmark = pytest.mark.lab
Json = Any
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainingjob-cpu.yaml"
CLAIM = ROOT / "examples" / "storage" / "checkpoints-pvc.yaml"
# The example's 300 steps take about 5 s here: about as long as Prometheus takes to discover the pods and
# scrape each rank twice (2 s apart), so a rank could be scraped once. The lab runs it for 900 steps.
MAX_STEPS = 900
RELEASE, RELEASE_NAMESPACE = "e2e", "kubetrain-e2e"
JOURNEY, FAULT = "e2e-journey", "e2e-fault"
# Panels that read GPU metrics (NVML, DCGM, allocator, MFU) cannot have data on this CPU-only machine.
GPU_METRICS = re.compile(r"trainer_gpu_|DCGM_|trainer_mfu_ratio")


@dataclass
class Platform:
    lab: Lab
    operator: OperatorProcess
    prometheus: Prometheus
    kubeconfig: Path


def helm(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(ensure_binary("helm")), f"--kubeconfig={lab.kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=180)


def _namespace(lab: Lab, name: str) -> None:
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    lab.wait_service_account(name)


@pytest.fixture(scope="module")
def platform(lab: Lab) -> Iterator[Platform]:
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": MONITORING_CRDS}))
    for name in (JOURNEY, FAULT):
        _namespace(lab, name)
    helm(lab, "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace", "--wait",
         "--set", "operator.replicas=0", "--set", f"watchNamespaces={{{JOURNEY},{FAULT}}}",
         "--set", "podMonitor.enabled=true", "--set", "podMonitor.interval=2s",
         "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
         "--set", "dashboards.enabled=true")
    account = lab.kubectl("get", "serviceaccount", "-n", RELEASE_NAMESPACE, "-l",
                          f"app.kubernetes.io/instance={RELEASE}", "-o",
                          "jsonpath={.items[0].metadata.name}").stdout.strip()
    assert account, "the chart creates a ServiceAccount"
    kubeconfig = lab.token_kubeconfig(RELEASE_NAMESPACE, account)
    operator = OperatorProcess(kubeconfig, lab.run_dir / "e2e-operator.log",
                               (f"--namespace={JOURNEY}", f"--namespace={FAULT}"))
    prometheus: Prometheus | None = None
    try:
        operator.start()
        pod_monitor = _one(lab, "podmonitors")
        service_monitor = _one(lab, "servicemonitors")
        rules = _one(lab, "prometheusrules")["spec"]["groups"]

        def monitors(pod_targets: Path) -> list[Json]:
            return [*pod_monitor_job(pod_monitor, pod_targets),
                    service_monitor_job(service_monitor, f"127.0.0.1:{operator.metrics_port}")]
        prometheus = start_prometheus(lab, monitors, rules=rules)
        yield Platform(lab, operator, prometheus, kubeconfig)
    finally:
        if prometheus is not None:
            prometheus.stop()
        operator.stop()
        helm(lab, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")


def _one(lab: Lab, plural: str) -> Json:
    items = lab.api.get(f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NAMESPACE}/{plural}")["items"]
    assert len(items) == 1, f"the chart should create one {plural}: {items}"
    return items[0]


def test_chart_identity_is_least_privilege(platform: Platform) -> None:
    def can(*args: str) -> str:
        answer = platform.lab.kubectl("auth", "can-i", *args, kubeconfig=platform.kubeconfig, check=False)
        return answer.stdout.strip()
    assert can("create", "pods", "-n", JOURNEY) == "yes"
    assert can("patch", "trainingjobs.kubetrain.io", "--subresource=status", "-n", FAULT) == "yes"
    assert can("get", "secrets", "-n", JOURNEY) == "no"
    assert can("create", "pods", "-n", "default") == "no"  # namespaced: nothing outside its namespaces
    assert can("list", "trainingjobs.kubetrain.io", "--all-namespaces") == "no"


def test_user_journey_from_kubectl_apply_to_grafana(platform: Platform) -> None:
    lab = platform.lab
    jobs = Jobs(lab, JOURNEY)
    lab.kubectl("apply", "-n", JOURNEY, "-f", str(CLAIM))  # bound by the lab's default storage class
    _apply_example(lab, JOURNEY)
    status = jobs.wait("digits", lambda s: s.get("progress", {}).get("step", 0) >= 120, "training past step 120",
                       timeout=300)
    pods = jobs.pods("digits")
    assert {p["spec"]["nodeName"] for p in pods} == set(lab.node_names), "one pod per lab node"
    assert len({p["status"]["podIP"] for p in pods}) == 2
    assert status["progress"]["totalSteps"] == MAX_STEPS and "lossText" in status["progress"]

    _wait_for_two_scrapes(platform.prometheus, "digits")
    missing = _panels_without_data(platform.prometheus, JOURNEY, "digits")
    assert not missing, f"dashboard panels without data: {missing}"
    ranks = platform.prometheus.query('count(trainer_step{training_job="digits", namespace="e2e-journey"})')
    assert float(ranks[0]["value"][1]) == 4, "all four ranks scraped through the PodMonitor"

    status = jobs.wait_phase("digits", "Succeeded", timeout=300)
    assert status["progress"]["percent"] == 100 and status["progress"]["step"] == MAX_STEPS
    table = lab.kubectl("get", "tj", "-n", JOURNEY).stdout
    row = next(line for line in table.splitlines() if line.startswith("digits"))
    assert "Succeeded" in row and f"100% ({MAX_STEPS}/{MAX_STEPS})" in row
    assert status["progress"]["lossText"] in row and float(status["progress"]["lossText"]) < 0.5
    warnings = lab.kubectl("get", "events", "-n", JOURNEY, "--field-selector",
                           "involvedObject.kind=TrainingJob,type=Warning", "--no-headers",
                           "-o", "custom-columns=REASON:.reason,MESSAGE:.message").stdout.splitlines()
    assert not warnings, f"a job that ran well warns of nothing (not even its trainer leaving at the end): {warnings}"


def _apply_example(lab: Lab, namespace: str) -> None:
    """`kubectl apply -f examples/trainingjob-cpu.yaml`, with only spec.trainer.maxSteps changed."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["trainer"]["maxSteps"] = MAX_STEPS
    lab.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(job))


def _wait_for_two_scrapes(prometheus: Prometheus, job: str) -> None:
    """Rate panels need two scrapes in their window; a fast trainer reaches its step before that."""
    series = f'trainer_step{{training_job="{job}"}}'
    try:
        prometheus.wait_for(f"min(count_over_time({series}[1m])) >= 2", timeout=90)
    except TimeoutError as error:  # say which rank was missed, and what its target's last scrape said
        counts = {f"{s['metric'].get('pod')}/rank {s['metric'].get('rank')}": s["value"][1]
                  for s in prometheus.query(f"count_over_time({series}[10m])")}
        targets = [(t["labels"].get("pod"), t["scrapePool"], t["health"], t["lastError"])
                   for t in prometheus.targets()]
        raise AssertionError(f"{error}; samples per rank in 10 min: {counts}; targets: {targets}") from None


def _panels_without_data(prometheus: Prometheus, namespace: str, job: str) -> list[str]:
    """Titles of dashboard panels none of whose queries returns data (GPU-only panels excepted)."""
    variables = {"$namespace": namespace, "$job": job, "$rank": ".*", "$__rate_interval": "1m",
                 "$__range": "10m", "${datasource}": "", "$datasource": ""}
    missing = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            queries = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
            if not queries or all(GPU_METRICS.search(q) for q in queries):
                continue
            for template in queries:
                query = template
                for name, value in variables.items():
                    query = query.replace(name, value)
                if not GPU_METRICS.search(query) and prometheus.query(query):
                    break
            else:
                missing.append(f"{path.stem}: {panel['title']}")
    return missing


def test_killed_worker_resumes_from_its_checkpoint(platform: Platform) -> None:
    lab = platform.lab
    jobs = Jobs(lab, FAULT)
    lab.kubectl("apply", "-n", FAULT, "-f", str(CLAIM))
    _apply_example(lab, FAULT)
    status = jobs.wait("digits", lambda s: s.get("lastCheckpoint", {}).get("step", 0) >= 100,
                       "a checkpoint at step 100 or later", timeout=300)
    saved = status["lastCheckpoint"]["step"]
    lab.kill_pod(FAULT, "digits-1", signal.SIGKILL)

    steps_after_restart: list[int] = []

    def resumed(current: Json) -> bool:
        if current.get("attempt", 0) >= 1 and "resumedFromStep" in current.get("progress", {}):
            steps_after_restart.append(current["progress"]["step"])
        return bool(current.get("phase") == "Succeeded")
    status = jobs.wait("digits", resumed, "success after the restart", timeout=400)
    assert status["restarts"] == 1 and status["attempt"] == 1
    (failure,) = status["failures"]
    assert failure["pod"] == "digits-1" and failure["exitCode"] == 137 and failure["counted"] is True
    assert status["progress"]["resumedFromStep"] >= saved
    assert steps_after_restart and min(steps_after_restart) >= saved, "the step went back past the checkpoint"
    assert status["progress"]["percent"] == 100
    restarts = platform.prometheus.query('kubetrain_restarts_total{reason="PodFailed"}')
    assert restarts and float(restarts[0]["value"][1]) >= 1


# A user's own program (spec.command) that reports with kubetrain_trainer.report: 120 steps, 0.25 s each.
REPORTING_PROGRAM = (
    "import time\n"
    "from kubetrain_trainer import report\n"
    "for step in range(1, 121):\n"
    "    time.sleep(0.25)\n"
    "    report(step=step, total_steps=120, loss=3.0 / step, samples=32, epoch=step // 40)\n"
)
# Panels a reporting program must fill: every one whose series report() serves (see UNREPORTED).
USER_PROGRAM_PANELS = {"Progress", "Step", "Epoch", "ETA", "Last step", "Loss", "Throughput", "Step duration"}


def _families(query: str) -> set[str]:
    """The metric families a query reads (histogram and counter suffixes removed)."""
    names = re.findall(r"\btrainer_[a-z_]+", query)
    return {re.sub(r"_(bucket|count|sum|total)$", "", name) for name in names}


def _panels_a_reporting_program_fills() -> set[str]:
    from kubetrain_trainer.reporting import UNREPORTED

    dashboard = json.loads((CHART / "dashboards" / "training-job.json").read_text())
    filled = set()
    for panel in dashboard["panels"]:
        for query in (t["expr"] for t in panel.get("targets", []) if t.get("expr")):
            families = _families(query)
            if families and not families & UNREPORTED and not GPU_METRICS.search(query):
                filled.add(panel["title"])  # _panels_without_data: one query with data fills a panel
    return filled


def test_a_user_programs_job_fills_the_dashboard(platform: Platform) -> None:
    jobs = Jobs(platform.lab, JOURNEY)
    jobs.create("mine", {
        "nodes": 1, "procsPerNode": 1, "command": ["python", "-c", REPORTING_PROGRAM],
        "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
    })
    jobs.wait("mine", lambda s: s.get("progress", {}).get("step", 0) >= 60, "step 60 reported", timeout=180)
    _wait_for_two_scrapes(platform.prometheus, "mine")
    expected = _panels_a_reporting_program_fills()
    assert expected >= USER_PROGRAM_PANELS, f"report() no longer serves what these panels read: {expected}"
    missing = {title.split(": ", 1)[1] for title in _panels_without_data(platform.prometheus, JOURNEY, "mine")
               if title.startswith("training-job: ")}
    assert not missing & expected, f"panels a reporting program should fill, without data: {missing & expected}"
    assert jobs.wait_phase("mine", "Succeeded", timeout=120)["progress"]["step"] == 120
