"""The lab's process kubelet plays a faithful kubelet: phases, exit codes, signals, deletion, GC."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.lab import podworker
from tests.lab.fixtures import pod_log_text
from tests.lab.images import exec_only_image
from tests.lab.lab import Lab
from tests.lab.pods import get_pod, pod_manifest, terminated_state, wait_pod, wait_pod_gone
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError

pytestmark = pytest.mark.lab


def _create(lab: Lab, namespace: str, manifest: dict[str, object]) -> None:
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)


def test_pod_runs_then_succeeds(lab: Lab, namespace: str) -> None:
    script = ("import os, time; time.sleep(1.5); "
              "print('hello from', os.environ['POD_NAME'], os.environ['POD_IP'])")
    manifest = pod_manifest("hello", ["python"], ["-c", script])
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    _create(lab, namespace, manifest)

    running = wait_pod(lab.api, namespace, "hello", ("Running",))
    status = running["status"]
    assert status["startTime"] and status["podIP"].startswith("10.") and status["hostIP"]
    assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"

    done = wait_pod(lab.api, namespace, "hello", ("Succeeded",))
    state = terminated_state(done)
    assert (state["exitCode"], state["reason"]) == (0, "Completed")
    assert state["startedAt"] and state["finishedAt"]
    assert f"hello from hello {status['podIP']}" in pod_log_text(lab, namespace, "hello")


def test_exit_code_3_fails_the_pod(lab: Lab, namespace: str) -> None:
    _create(lab, namespace, pod_manifest("three", ["python"], ["-c", "raise SystemExit(3)"]))
    state = terminated_state(wait_pod(lab.api, namespace, "three", ("Failed",)))
    assert (state["exitCode"], state["reason"]) == (3, "Error")


@pytest.mark.parametrize(("oom", "reason"), [(False, "Error"), (True, "OOMKilled")])
def test_killed_pod_reports_137(lab: Lab, namespace: str, oom: bool, reason: str) -> None:
    _create(lab, namespace, pod_manifest("victim", ["python"], ["-c", "import time; time.sleep(600)"]))
    wait_pod(lab.api, namespace, "victim", ("Running",))
    if oom:
        lab.oom_kill_pod(namespace, "victim")
    else:
        lab.kill_pod(namespace, "victim", signal.SIGKILL)
    state = terminated_state(wait_pod(lab.api, namespace, "victim", ("Failed",)))
    assert (state["exitCode"], state["reason"]) == (137, reason)


def test_deleting_a_pod_stops_its_processes(lab: Lab, namespace: str) -> None:
    # The child ignores SIGTERM, so only the SIGKILL after the grace period stops it.
    script = ("import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "subprocess.Popen(['sleep', '600']); time.sleep(600)")
    _create(lab, namespace, pod_manifest("stubborn", ["python"], ["-c", script], grace_s=2))
    wait_pod(lab.api, namespace, "stubborn", ("Running",))
    deadline = time.monotonic() + 10
    while len(pids := lab.pod_processes(namespace, "stubborn")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) >= 2

    started = time.monotonic()
    lab.api.delete(f"/api/v1/namespaces/{namespace}/pods/stubborn")
    wait_pod_gone(lab.api, namespace, "stubborn", timeout=30)
    assert time.monotonic() - started >= 1.5  # the grace period was honoured
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_deleting_the_owner_collects_its_pods(lab: Lab, namespace: str) -> None:
    owner = lab.api.post(f"/api/v1/namespaces/{namespace}/configmaps",
                         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    manifest = pod_manifest("owned", ["python"], ["-c", "import time; time.sleep(600)"], grace_s=1)
    manifest["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]
    _create(lab, namespace, manifest)
    wait_pod(lab.api, namespace, "owned", ("Running",))
    pids = lab.pod_processes(namespace, "owned")

    lab.api.delete(f"/api/v1/namespaces/{namespace}/configmaps/owner")
    wait_pod_gone(lab.api, namespace, "owned", timeout=120)
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert get_pod(lab.api, namespace, "owned") is None


def test_volumes_downward_api_and_gpus(lab: Lab, namespace: str) -> None:
    host_dir = lab.create_volume(namespace, "checkpoints")
    script = ("import os, socket; open('/checkpoints/owner', 'w').write(os.environ['UID']); "
              "open('/dev/shm/x', 'w').write('shm'); open('/scratch/x', 'w').write('scratch'); "
              "print(socket.gethostname(), os.environ['APP'], os.environ['CPUS'], flush=True)")
    manifest = pod_manifest("volumes", ["python"], ["-c", script], labels={"app": "demo"}, hostname="worker-0")
    container = manifest["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    container["env"] = [
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ]
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                 {"name": "ckpt", "mountPath": "/checkpoints"},
                                 {"name": "scratch", "mountPath": "/scratch"}]
    manifest["spec"]["volumes"] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    _create(lab, namespace, manifest)
    pod = wait_pod(lab.api, namespace, "volumes", ("Succeeded", "Failed"))
    log = pod_log_text(lab, namespace, "volumes")
    assert pod["status"]["phase"] == "Succeeded", log
    assert (host_dir / "owner").read_text() == pod["metadata"]["uid"]
    assert "worker-0 demo 1" in log


def test_each_container_has_a_private_tmp_removed_with_its_pod(lab: Lab, namespace: str) -> None:
    """As on a container's own root filesystem: what a pod leaves in /tmp is seen by no other pod, not by the
    machine, and goes with the pod (a shared /tmp let a user script resume from an earlier lab's snapshot)."""
    marker, scratch = f"/tmp/kubetrain-lab-tmp-{namespace}", f"/tmp/kubetrain-lab-scratch-{namespace}"
    writer = (f"import os, time; open({marker!r}, 'w').write('mine'); os.makedirs('/tmp/ckpt', exist_ok=True); "
              f"open({scratch!r} + '/y', 'w').write('volume'); "
              f"print('wrote', open({marker!r}).read(), os.stat('/tmp').st_mode & 0o7777 == 0o1777, flush=True); "
              "time.sleep(300)")
    manifest = pod_manifest("writer", ["python"], ["-c", writer])
    # A volume below /tmp is mounted inside the container's own /tmp, not made on the machine.
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": scratch}]
    manifest["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    _create(lab, namespace, manifest)
    wait_pod(lab.api, namespace, "writer", ("Running",))
    wait_for(lambda: "wrote" in pod_log_text(lab, namespace, "writer"), 60, "the writer to write /tmp",
             interval=0.2)
    assert "wrote mine True" in pod_log_text(lab, namespace, "writer")
    pod_tmp = lab.pod_log(namespace, "writer").parent / "tmp"
    assert not Path(marker).exists(), "the pod wrote to the machine's /tmp"
    assert not Path(scratch).exists(), "a mountPath below /tmp was made on the machine"
    assert (pod_tmp / "trainer" / Path(marker).name).read_text() == "mine"

    reader = (f"import os, sys; print('sees', os.path.exists({marker!r}), os.path.exists('/tmp/ckpt'), flush=True); "
              f"open({marker!r}, 'w').write('theirs')")
    _create(lab, namespace, pod_manifest("reader", ["python"], ["-c", reader]))
    wait_pod(lab.api, namespace, "reader", ("Succeeded",))
    assert "sees False False" in pod_log_text(lab, namespace, "reader")
    assert (pod_tmp / "trainer" / Path(marker).name).read_text() == "mine", "the reader wrote the writer's /tmp"

    lab.api.delete(f"/api/v1/namespaces/{namespace}/pods/writer")
    wait_pod_gone(lab.api, namespace, "writer", timeout=60)
    assert not pod_tmp.exists(), "the pod's /tmp outlived it"
    assert not Path(marker).exists()


def test_an_image_whose_files_lie_below_the_machines_tmp_still_runs(lab: Lab, namespace: str,
                                                                    tmp_path: Path) -> None:
    """The container's own /tmp covers the machine's, but not an image written to a test's tmp_path: its files stay
    visible, read-only, as a real image's root filesystem would be."""
    image = exec_only_image(tmp_path / "image")
    lab.images.put_first("test.kubetrain.io/tmp-image:1", image)
    manifest = pod_manifest("from-tmp", ["torchrun"], ["--no-python", "sh", "-c", "echo ran from an image below /tmp"])
    manifest["spec"]["containers"][0]["image"] = "test.kubetrain.io/tmp-image:1"
    _create(lab, namespace, manifest)
    pod = wait_pod(lab.api, namespace, "from-tmp", ("Succeeded", "Failed"))
    log = pod_log_text(lab, namespace, "from-tmp")
    assert pod["status"]["phase"] == "Succeeded", log
    assert "ran from an image below /tmp" in log


def test_termination_message_lands_in_the_container_status(lab: Lab, namespace: str) -> None:
    code = "open('/dev/termination-log', 'w').write('{\"reason\": \"Done\"}'); raise SystemExit(3)"
    _create(lab, namespace, pod_manifest("last-words", ["python"], ["-c", code]))
    state = terminated_state(wait_pod(lab.api, namespace, "last-words", ("Failed",)))
    assert state["exitCode"] == 3
    assert state["message"] == '{"reason": "Done"}'


def test_the_final_delete_is_retried_until_it_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod whose final delete is lost stays Terminating for good: the kubelet retries it, and so does the lab's.
    (No lab needed: a worker whose API refuses twice, a reset connection then a 503.)"""
    answers: list[Exception | None] = [requests.ConnectionError("connection reset"), ApiError(503, "busy", "DELETE"),
                                       None]
    calls: list[str] = []

    class FlakyApi:
        def delete(self, path: str, body: dict[str, object]) -> dict[str, object]:
            calls.append(path)
            if (answer := answers.pop(0)) is not None:
                raise answer
            return {}

    worker = podworker.PodWorker.__new__(podworker.PodWorker)  # only what _delete_from_api reads
    worker.api, worker.namespace, worker.name, worker.uid = FlakyApi(), "ns", "victim", "uid-1"  # type: ignore[assignment]
    worker._lock, worker.deleted_from_api, worker.removed = threading.Lock(), False, False
    monkeypatch.setattr(podworker.time, "sleep", lambda _s: None)
    worker._delete_from_api()
    assert calls == ["/api/v1/namespaces/ns/pods/victim"] * 3
    worker._delete_from_api()  # once it landed, never again
    assert len(calls) == 3


def test_a_dead_pods_late_status_write_never_lands_on_the_next_pod_of_its_name(lab: Lab, namespace: str) -> None:
    # A failed pod is deleted at once (no grace for a terminal pod) and its controller may create the next pod of
    # the same name before the old worker's last status write: that write must not mark the newcomer failed.
    _create(lab, namespace, pod_manifest("twin", ["python"], ["-c", "raise SystemExit(3)"]))
    wait_pod(lab.api, namespace, "twin", ("Failed",))
    old = lab._kubelet.worker(namespace, "twin")
    lab.api.delete(f"/api/v1/namespaces/{namespace}/pods/twin")
    wait_pod_gone(lab.api, namespace, "twin", timeout=30)
    _create(lab, namespace, pod_manifest("twin", ["python"], ["-c", "import time; time.sleep(600)"]))
    wait_pod(lab.api, namespace, "twin", ("Running",))

    old._write_status()
    pod = get_pod(lab.api, namespace, "twin")
    assert pod is not None and pod["metadata"]["uid"] != old.uid
    assert pod["status"]["phase"] == "Running", pod["status"]
