"""The chart and the user's journey on the real node, as a user runs them: the operator image built from the
project's Dockerfile runs inside the cluster (the chart's Deployment, its ServiceAccount through the
`kubernetes` Service), jobs run the trainer image built from trainer_image/Dockerfile as uid 1000, and
faults are real: the kernel's OOM killer, and a container SIGKILLed through containerd.

The one change to the README's example: each pod asks 2 CPUs, and the lab's real node is this machine (2 CPUs in
all, the operator's share included), so the test lowers `resources.cpu`. Everything else is applied unchanged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lab.build import ensure_binary
from tests.lab.chart import CHART
from tests.lab.jobs import Jobs, kill_workers
from tests.lab.lab import Lab
from tests.lab.oci import IMAGES
from tests.lab.procs import wait_for
from tests.lab.prometheus import Prometheus, start_prometheus
from tests.lab.rest import Rest
from tests.monitoring import MONITORING_CRDS, service_monitor_job
from tests.test_operator import evict

pytestmark = [pytest.mark.lab, pytest.mark.real_node]
Json = Any
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainingjob-cpu.yaml"
CLAIM = ROOT / "examples" / "storage" / "checkpoints-pvc.yaml"
RELEASE, RELEASE_NAMESPACE = "kubetrain", "kubetrain-system"
FITS_THE_NODE = "600m"  # two trainer pods and the operator on a 2-CPU machine


def repository_and_tag(name: str) -> tuple[str, str]:
    repository, tag = IMAGES[name].rsplit(":", 1)
    return repository.removeprefix("docker.io/"), tag


def local_image_values() -> list[str]:
    """`--set` arguments that point the chart at the images built here (never pulled: no registry)."""
    operator_repo, operator_tag = repository_and_tag("operator")
    trainer_repo, trainer_tag = repository_and_tag("trainer")
    return ["--set", f"image.repository={operator_repo}", "--set", f"image.tag={operator_tag}",
            "--set", "image.digest=", "--set", "image.pullPolicy=Never",
            "--set", f"trainer.image.repository={trainer_repo}", "--set", f"trainer.image.tag={trainer_tag}",
            "--set", "trainer.image.digest="]


def helm(lab: Lab, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [str(ensure_binary("helm")), f"--kubeconfig={lab.kubeconfig}", *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


@dataclass
class InCluster:
    lab: Lab
    prometheus: Prometheus
    operator_pod: Json


def operator_pods(api: Rest, namespace: str, release: str) -> list[Json]:
    pods: list[Json] = api.get(f"/api/v1/namespaces/{namespace}/pods",
                               labelSelector=f"app.kubernetes.io/instance={release}")["items"]
    return pods


def _service_endpoint(lab: Lab, service_monitor: Json) -> str:
    """Where prometheus-operator would scrape: the ready address and named port of the selected Service."""
    selector = ",".join(f"{k}={v}" for k, v in service_monitor["spec"]["selector"]["matchLabels"].items())
    (service,) = lab.api.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/services", labelSelector=selector)["items"]
    port_name = service_monitor["spec"]["endpoints"][0]["port"]
    slices = lab.api.get(f"/apis/discovery.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/endpointslices",
                         labelSelector=f"kubernetes.io/service-name={service['metadata']['name']}")["items"]
    port = next(p["port"] for s in slices for p in s.get("ports") or [] if p["name"] == port_name)
    address = next(a for s in slices for e in s.get("endpoints") or []
                   if e.get("conditions", {}).get("ready") for a in e["addresses"])
    return f"{address}:{port}"


@pytest.fixture(scope="module")
def in_cluster(real_lab: Lab) -> Iterator[InCluster]:
    lab = real_lab
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": MONITORING_CRDS}))
    helm(lab, "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace",
         "--wait", "--timeout=5m", *local_image_values(), "--set", "serviceMonitor.enabled=true",
         "--set", "podMonitor.enabled=true", "--set", "serviceMonitor.interval=2s",
         # A short probe period, so that the test can watch the probe's whole failure window pass; progress every
         # second (default 10 s), so that a checkpoint is seen before this short job ends.
         "--set", "operator.livenessProbe.initialDelaySeconds=5", "--set", "operator.livenessProbe.periodSeconds=5",
         "--set", "operator.extraArgs={--progress-interval=1}")
    prometheus: Prometheus | None = None
    try:
        (monitor,) = lab.api.get(
            f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NAMESPACE}/servicemonitors")["items"]
        wait_for(lambda: _ready_endpoints(lab), 60, "the operator Service's endpoints")
        target = _service_endpoint(lab, monitor)
        prometheus = start_prometheus(lab, lambda _pods: [service_monitor_job(monitor, target)])
        (pod,) = operator_pods(lab.api, RELEASE_NAMESPACE, RELEASE)
        yield InCluster(lab, prometheus, pod)
    finally:
        if prometheus is not None:
            prometheus.stop()
        helm(lab, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")


def _ready_endpoints(lab: Lab) -> bool:
    slices = lab.api.get(f"/apis/discovery.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/endpointslices")["items"]
    return any(e.get("conditions", {}).get("ready") for s in slices for e in s.get("endpoints") or [])


def test_operator_deployment_runs_in_cluster_and_is_scraped(in_cluster: InCluster) -> None:
    lab = in_cluster.lab
    deployment = lab.api.get(f"/apis/apps/v1/namespaces/{RELEASE_NAMESPACE}/deployments")["items"][0]
    available = {c["type"]: c["status"] for c in deployment["status"]["conditions"]}
    assert available["Available"] == "True"
    pod = in_cluster.operator_pod
    assert pod["spec"]["containers"][0]["image"] == IMAGES["operator"].removeprefix("docker.io/")
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The liveness probe has had its chances to fail (its initial delay, then failureThreshold periods).
    probe = pod["spec"]["containers"][0]["livenessProbe"]
    horizon = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"] + 5
    up = in_cluster.prometheus.wait_for('up{job=~"serviceMonitor/.*"} == 1', timeout=60)
    assert up
    wait_for(lambda: _running_for(lab, pod) > horizon, horizon + 30, "the liveness probe's window", interval=2)
    current = lab.api.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{pod['metadata']['name']}")
    assert current["status"]["containerStatuses"][0]["restartCount"] == 0
    unhealthy = [e for e in lab.api.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/events")["items"]
                 if e["reason"] == "Unhealthy"]
    assert not unhealthy, unhealthy
    assert in_cluster.prometheus.wait_for("kubetrain_reconcile_duration_seconds_count", timeout=30) is not None


def _running_for(lab: Lab, pod: Json) -> float:
    import datetime

    current = lab.api.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{pod['metadata']['name']}")
    started = current["status"]["containerStatuses"][0]["state"].get("running", {}).get("startedAt")
    if not started:
        return 0.0
    began = datetime.datetime.fromisoformat(started.replace("Z", "+00:00"))
    return (datetime.datetime.now(datetime.UTC) - began).total_seconds()


LOG_LEVELS = ("quiet", "normal", "verbose", "debug")
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def _values_prerequisites(lab: Lab, namespace: str, values: Path) -> None:
    """What a values file expects to exist already (its ServiceAccount, its watched namespaces)."""
    settings = yaml.safe_load(values.read_text()) or {}
    for watched in settings.get("watchNamespaces", []):
        lab.kubectl("create", "namespace", watched, check=False)
    account = settings.get("serviceAccount", {})
    if account.get("create") is False:
        lab.kubectl("create", "serviceaccount", "-n", namespace, account["name"])


MATRIX = [*(v.name for v in CI_VALUES), *(f"logLevel={level}" for level in LOG_LEVELS)]


def _operator_starts_with(lab: Lab, values: str) -> str | None:
    """Install the chart with one ci values file or log level: None if its operator pod is Ready, else why not."""
    slug = values.removesuffix("-values.yaml").replace("=", "-").lower()
    release, namespace = f"m-{slug}", f"matrix-{slug}"
    lab.kubectl("create", "namespace", namespace)
    extra = ["--set", f"operator.{values}"] if values.startswith("logLevel=") else ["-f", str(CHART / "ci" / values)]
    if not values.startswith("logLevel="):
        _values_prerequisites(lab, namespace, CHART / "ci" / values)
    try:
        # After the file: the images built here, and a schedulable pod on the lab (no pull secret can pull).
        helm(lab, "install", release, str(CHART), "--namespace", namespace, "--skip-crds", *extra,
             *local_image_values(), "--set", "imagePullSecrets=null", "--set", "priorityClassName=",
             "--wait", "--timeout=3m")
        (pod,) = operator_pods(lab.admin_rest(), namespace, release)  # a client per thread
        status = pod["status"]["containerStatuses"][0]
        logs = lab.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
        if not status["ready"] or status["restartCount"] or "Usage: kubetrain" in logs:  # click rejected an argument
            return f"not Ready or restarted: {status}\n{logs[-2000:]}"
        return None
    except AssertionError as error:  # helm failed (--wait timed out): its output says why
        return str(error)
    finally:
        helm(lab, "uninstall", release, "--namespace", namespace, "--wait")


# Before the job tests: these operators watch every namespace, and no job of another test should exist yet.
def test_every_ci_values_file_and_log_level_starts_the_operator(in_cluster: InCluster) -> None:
    with ThreadPoolExecutor(len(MATRIX)) as pool:  # all at once: each waits on its own pod
        outcomes = dict(zip(MATRIX, pool.map(partial(_operator_starts_with, in_cluster.lab), MATRIX), strict=True))
    failed = {case: why for case, why in outcomes.items() if why}
    assert not failed, failed


def example_job(*, cpu: str = FITS_THE_NODE, max_steps: int | None = None) -> str:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["resources"]["cpu"] = cpu
    if max_steps is not None:
        job["spec"]["trainer"]["maxSteps"] = max_steps
    return yaml.safe_dump(job)


# Long enough to kill a pod after the operator has seen a checkpoint: on a quiet machine the example's 300 steps
# take 2 s, less than the operator's 10 s between progress reads, and the job ended before one saw a checkpoint.
KILLED_JOURNEY_STEPS = 3000


def _processes_uids(lab: Lab, namespace: str, pod: str) -> set[str]:
    script = ("import glob\nuids = set()\nfor p in glob.glob('/proc/[0-9]*/status'):\n"
              "    try: uids.add(open(p).read().split('Uid:')[1].split()[0])\n"
              "    except OSError: pass\nprint(' '.join(sorted(uids)))")
    return set(lab.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", script).stdout.split())


def _kill_container_through_containerd(lab: Lab, namespace: str, pod: str) -> None:
    status = lab.api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["status"]
    container_id = status["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    assert lab.real_node is not None
    killed = lab.real_node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    assert killed.returncode == 0, killed.stderr


def test_user_journey_as_uid_1000_with_a_killed_pod_resuming(in_cluster: InCluster, real_namespace: str) -> None:
    lab = in_cluster.lab
    jobs = Jobs(lab, real_namespace)
    lab.kubectl("apply", "-n", real_namespace, "-f", str(CLAIM))
    lab.kubectl("apply", "-n", real_namespace, "-f", "-", stdin=example_job(max_steps=KILLED_JOURNEY_STEPS))
    following = _kubetrain_logs(lab, real_namespace, "digits", "--follow")  # before any pod exists
    status = jobs.wait("digits", lambda s: s.get("lastCheckpoint", {}).get("step", 0) >= 50,
                       "a first checkpoint", timeout=600)
    saved = status["lastCheckpoint"]["step"]
    pods = jobs.pods("digits")
    assert all(p["spec"]["containers"][0]["image"] == IMAGES["trainer"].removeprefix("docker.io/")
               for p in pods), "jobs without spec.image run the chart's trainer image"
    assert _processes_uids(lab, real_namespace, "digits-0") == {"1000"}, "every process runs as uid 1000"
    assert '"step"' in lab.kubectl("logs", "-n", real_namespace, "digits-0").stdout

    _kill_container_through_containerd(lab, real_namespace, "digits-1")
    status = jobs.wait_phase("digits", "Succeeded", timeout=900)
    assert status["restarts"] == 1 and status["attempt"] == 1
    (failure,) = status["failures"]
    assert failure["pod"] == "digits-1" and failure["exitCode"] == 137 and failure["counted"] is True
    assert status["progress"]["resumedFromStep"] >= saved
    table = lab.kubectl("get", "tj", "-n", real_namespace).stdout
    row = next(line for line in table.splitlines() if line.startswith("digits"))
    done = f"100% ({KILLED_JOURNEY_STEPS}/{KILLED_JOURNEY_STEPS})"
    assert "Succeeded" in row and done in row and status["progress"]["lossText"] in row
    assert '"step"' in lab.kubectl("logs", "-n", real_namespace, "digits-0").stdout, "attempt 1's output"
    _assert_checkpoints_written_by_uid_1000(lab, real_namespace)
    _assert_kubetrain_logs(lab, real_namespace, failure, following)


def _kubetrain_logs(lab: Lab, namespace: str, *args: str) -> subprocess.Popen[str]:
    """`kubetrain logs` as a user runs it, in its own process (the client reads KUBECONFIG at import)."""
    return subprocess.Popen([sys.executable, "-m", "kubetrain.cli.commands", "logs", "-n", namespace, *args],
                            env={**os.environ, "KUBECONFIG": str(lab.kubeconfig)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _output(process: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"exit {process.returncode}: {err[-2000:]}"
    return out


RANKED_LINE = re.compile(r"^(node-\d+) \| \[rank(\d+)\]: ")


def _ranks_by_node(output: str) -> dict[str, frozenset[int]]:
    """Which global ranks printed through which node (torchrun decides which node gets which ranks)."""
    ranks: dict[str, set[int]] = {}
    for match in filter(None, map(RANKED_LINE.match, output.splitlines())):
        ranks.setdefault(match.group(1), set()).add(int(match.group(2)))
    return {node: frozenset(found) for node, found in ranks.items()}


def _nodes(output: str) -> set[str]:
    return {line.split(" | ", 1)[0] for line in output.splitlines() if line.startswith("node-")}


def _assert_kubetrain_logs(lab: Lab, namespace: str, failure: Json, following: subprocess.Popen[str]) -> None:
    """Both nodes' output (the built-in trainer logs on rank 0 only; torchrun's own lines come from every
    node), rank 0 alone, the killed attempt's post-mortem, and a follow that went through the gang restart
    and ended with the job."""
    followed = _output(following, timeout=120)
    assert "--- attempt 1 ---" in followed, followed[-2000:]
    for attempt_output in followed.split("--- attempt 1 ---"):
        assert _nodes(attempt_output) == {"node-0", "node-1"}, attempt_output[:2000]
        # torchrun orders nodes by FQDN, so pod 0 holds rank 0, the one that serves the job-wide series.
        assert 0 in _ranks_by_node(attempt_output).get("node-0", set()), attempt_output[:2000]
    current = _output(_kubetrain_logs(lab, namespace, "digits"))
    assert '"step"' in current and _nodes(current) == {"node-0", "node-1"}, current[:2000]
    only_rank_0 = _output(_kubetrain_logs(lab, namespace, "digits", "--rank", "0")).splitlines()
    assert only_rank_0 and all(line.startswith("node-0 | [rank0]: ") for line in only_rank_0), only_rank_0[:20]
    assert len(only_rank_0) < len(current.splitlines()), "torchrun's unranked lines are left out"
    # The SIGKILLed container left no last words: the kubelet kept its log's tail, and the status keeps it.
    tail = failure.get("logTail", "").strip().splitlines()
    assert tail and "torch/distributed/run.py" in "\n".join(tail), failure  # torchrun's own lines, at least
    post_mortem = _output(_kubetrain_logs(lab, namespace, "digits", "--attempt", "0"))
    assert "pods of attempt 0 are gone" in post_mortem and "digits-1: " in post_mortem
    assert "exit code 137" in post_mortem and f"  {tail[-1]}" in post_mortem


def _assert_checkpoints_written_by_uid_1000(lab: Lab, namespace: str) -> None:
    claim = lab.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/digits-checkpoints")
    volume = lab.api.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
    files = [p for p in Path(volume["spec"]["hostPath"]["path"]).rglob("*") if p.is_file()]
    assert files, "checkpoints on the claim"
    assert {os.stat(p).st_uid for p in files} == {1000}


def _example_job_past_a_checkpoint(lab: Lab, jobs: Jobs) -> int:
    """The README's example (KILLED_JOURNEY_STEPS long) with its claim; the step of its first checkpoint."""
    lab.kubectl("apply", "-n", jobs.namespace, "-f", str(CLAIM))
    lab.kubectl("apply", "-n", jobs.namespace, "-f", "-", stdin=example_job(max_steps=KILLED_JOURNEY_STEPS))
    status = jobs.wait("digits", lambda s: s.get("lastCheckpoint", {}).get("step", 0) >= 50, "a first checkpoint",
                       timeout=600)
    return int(status["lastCheckpoint"]["step"])


def test_an_evicted_container_pod_is_replaced_alone_while_the_other_waits(in_cluster: InCluster,
                                                                           real_namespace: str) -> None:
    """Issue 29.2 with containers: each agent's pid is its container's own, so a replacement may have the pid of
    the pod it replaces; named by pod and uid in the rendezvous, it joins as a new member."""
    lab = in_cluster.lab
    jobs = Jobs(lab, real_namespace)
    saved = _example_job_past_a_checkpoint(lab, jobs)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("digits")}
    evict(lab, real_namespace, "digits-1")
    status = jobs.wait_phase("digits", "Succeeded", timeout=900)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("digits")}
    assert after["digits-0"] == uids["digits-0"] and after["digits-1"] != uids["digits-1"], (uids, after)
    assert (status["attempt"], status["restarts"], status["disruptions"]) == (0, 0, 1), status
    (failure,) = status["failures"]
    assert (failure["pod"], failure["recovery"]) == ("digits-1", "PodReplaced"), failure
    assert status["progress"]["resumedFromStep"] >= saved, status["progress"]


def test_a_failed_worker_has_its_pod_restarted_in_place_and_the_gang_resumes(in_cluster: InCluster,
                                                                              real_namespace: str) -> None:
    """Issue 29.1: a worker of pod 1 dies (SIGKILL), torchrun exits 1, and the kubelet restarts the pod's containers
    where it stands (RestartAllContainers): same uid and IP; its new agent joins the rendezvous as a new member,
    pod 0's waiting worker is restarted by its agent, and the gang resumes from the checkpoint at the same attempt."""
    lab = in_cluster.lab
    jobs = Jobs(lab, real_namespace)
    saved = _example_job_past_a_checkpoint(lab, jobs)
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], p["status"]["podIP"]) for p in jobs.pods("digits")}
    kill_workers(lab, real_namespace, "digits-1")
    status = jobs.wait_phase("digits", "Succeeded", timeout=900)
    pods = jobs.pods("digits")
    after = {p["metadata"]["name"]: (p["metadata"]["uid"], p["status"]["podIP"]) for p in pods}
    assert after == before, "no pod was made again: same uids, same IPs"
    # The whole gang ran again in place: pod 1's next run may end once more on the rendezvous its agent closed,
    # before pod 0's agent, restarted, serves it afresh; those runs are not counted.
    restarted = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}
    assert restarted["digits-0"] >= 1 and restarted["digits-1"] >= 1, restarted
    assert (status["attempt"], status["restarts"], status.get("disruptions", 0)) == (0, 1, 0), status
    (failure,) = [f for f in status["failures"] if f["counted"]]
    assert (failure["pod"], failure["recovery"], failure["containerRestarts"]) == (
        "digits-1", "InPlaceRestart", 1), failure
    # The kubelet shows how the run ended only while it restarts the pod (about a second); a busy kubelet may fold
    # that into one status update, and then only the restart itself is known.
    assert failure.get("exitCode", 1) == 1, failure
    assert all(f["recovery"] == "InPlaceRestart" for f in status["failures"]), status["failures"]
    assert status["progress"]["resumedFromStep"] >= saved, status["progress"]


def test_job_over_its_memory_limit_fails_oomkilled(in_cluster: InCluster, real_namespace: str) -> None:
    lab = in_cluster.lab
    jobs = Jobs(lab, real_namespace)
    spec = yaml.safe_load(example_job())["spec"]
    spec.update(nodes=1, procsPerNode=1, resources={"cpu": "500m", "memory": "200Mi"})
    spec.pop("checkpoint")
    jobs.create("hungry", spec)
    status = jobs.wait_phase("hungry", "Failed", timeout=300)
    assert status["failures"][0]["reason"] == "OOMKilled", status
    assert "OOMKilled" in status["message"] or any(c.get("reason") == "OOMKilled" for c in status["conditions"])
