"""One pod's life on the process kubelet: sandbox, processes, status, deletion."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import requests

from tests.lab.dns import resolv_conf
from tests.lab.images import SYSTEM_PATH, ImageEnvironment
from tests.lab.network import Sandbox
from tests.lab.podspec import NotReadyYetError, PodSpecReader, container_mounts, expand
from tests.lab.rest import JSON, ApiError, pod_path

if TYPE_CHECKING:
    from tests.lab.kubelet import Kubelet, NodeInfo

log = logging.getLogger(__name__)
PODINIT = Path(__file__).resolve().parent / "podinit.py"
POD_MARKER = "KUBETRAIN_LAB_POD_UID"  # in every pod process's environment, to find them all
RUN_MARKER = "KUBETRAIN_LAB_RUN"  # the lab's run dir, to clean up after a lab whose owner died
OUR_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
POLL_S = 0.1
FINAL_DELETE_ATTEMPTS = 10  # backing off from 0.4 s to 5 s: about 35 s of retries
STATUS_RETRY_S = 120.0
# A container's /tmp is its own, as on its image's root filesystem: a per-container directory bound over /tmp in
# its mount namespace, removed with the pod (a shared /tmp let a user script resume from a snapshot that a pod
# of an earlier lab had left there).
CONTAINER_TMP = Path("/tmp")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_processes(uid: str) -> list[psutil.Process]:
    """Every live process of a pod, whatever its process group: they all carry the pod marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(POD_MARKER) == uid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _another_pod(error: ApiError) -> bool:
    """The write named a UID that the pod of that name does not have."""
    if error.status != 422:
        return False
    with contextlib.suppress(ValueError):
        causes = json.loads(error.body).get("details", {}).get("causes") or []
        return any(cause.get("field") == "metadata.uid" for cause in causes)
    return False


def signal_pod(uid: str, signum: int) -> None:
    for proc in pod_processes(uid):
        try:
            proc.send_signal(signum)
        except psutil.NoSuchProcess:
            continue


def kill_pod_processes(uid: str, timeout: float = 10.0) -> None:
    """SIGKILL every process of the pod and wait until they are gone.

    The kubelet tears a pod's network down only after its containers stopped: a process killed while its
    veth is being deleted can lose its connections' FIN, and a peer (gloo, NCCL) then waits on it forever.
    """
    signal_pod(uid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pod_processes(uid) and time.monotonic() < deadline:
        time.sleep(POLL_S)


# As the kubelet: the default terminationMessagePath, and at most 4 KiB of message per container.
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096


@dataclass
class ContainerRun:
    name: str
    image: str
    popen: subprocess.Popen[bytes]
    started_at: str
    exit_code: int | None = None
    finished_at: str | None = None
    oom: bool = False
    extra: dict[str, Any] = field(default_factory=dict)



def _image_below_tmp(image: ImageEnvironment) -> list[JSON]:
    """An image whose files lie below the machine's /tmp (one a test wrote to its tmp_path) stays visible, read-only,
    once the container's own /tmp covers the machine's: a real image is the container's root filesystem."""
    if not image.prefix.is_relative_to(CONTAINER_TMP):
        return []
    return [{"source": str(image.prefix), "target": str(image.prefix), "readOnly": True}]

class PodWorker:
    def __init__(self, kubelet: Kubelet, pod: JSON, node: NodeInfo) -> None:
        self.kubelet = kubelet
        self.api = kubelet.api
        self.node = node
        self.latest = pod
        meta = pod["metadata"]
        self.uid, self.namespace, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.dir = kubelet.run_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.shm_dir = kubelet.shm_root / self.uid
        self.tmp_root = self.dir / "tmp"
        self.changed = threading.Event()
        self.removed = False  # the API object is gone (force-deleted)
        self.finished = threading.Event()
        self.deleted_from_api = False
        self.sandbox: Sandbox | None = None
        self.runs: dict[str, ContainerRun] = {}
        self.start_time: str | None = None
        self.waiting: tuple[str, str] = ("ContainerCreating", "")
        self.thread = threading.Thread(target=self._main, name=f"pod-{self.namespace}/{self.name}",
                                       daemon=True)
        self._lock = threading.Lock()

    # events from the kubelet's watch ------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def update(self, pod: JSON) -> None:
        self.latest = pod
        self.changed.set()
        if self.finished.is_set() and self._deletion_requested():
            # On a thread of its own: the final delete retries, and must not hold up the node's pod watch.
            threading.Thread(target=self._delete_from_api, name=f"delete-{self.name}", daemon=True).start()

    def remove(self) -> None:
        self.removed = True
        self.changed.set()

    def _deletion_requested(self) -> bool:
        return self.removed or bool(self.latest["metadata"].get("deletionTimestamp"))

    # the pod's life -----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._live()
        except Exception as error:  # a broken pod must not take the kubelet down; its status says why
            log.exception("pod %s/%s: kubelet worker failed", self.namespace, self.name)
            self._kill_all(0)
            self.waiting = ("CreateContainerError", f"lab kubelet: {error!r}")
            with contextlib.suppress(ApiError, requests.RequestException):  # best effort: already failing
                self._write_status()
        finally:
            self._teardown()
            self.finished.set()
            if self._deletion_requested():
                self._delete_from_api()

    def _live(self) -> None:
        if self.latest.get("status", {}).get("phase") in ("Succeeded", "Failed") or self._deletion_requested():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_status()
        while not self._start_containers():
            if self._deletion_requested():
                return
            self._write_status()
            self.changed.wait(1.0)
            self.changed.clear()
        self.start_time = self.start_time or now()
        self._write_status()
        self._supervise()
        self._write_status()

    def _start_containers(self) -> bool:
        """Create the sandbox and start every container; False when something isn't ready yet."""
        pod = self.latest
        reader = PodSpecReader(self.api, pod)
        try:
            volumes = {v["name"]: reader.volume_path(v, self.dir, self.shm_dir)
                       for v in pod["spec"].get("volumes") or []}
            if self.sandbox is None:
                self.sandbox = self._create_sandbox()
            pod = {**pod, "status": {**pod.get("status", {}), "podIP": self.sandbox.ip,
                                     "podIPs": [{"ip": self.sandbox.ip}], "hostIP": self.node.ip,
                                     "hostIPs": [{"ip": self.node.ip}]}}
            reader = PodSpecReader(self.api, pod)
            prepared = [self._prepare(reader, c, volumes) for c in pod["spec"]["containers"]]
        except NotReadyYetError as error:
            self.waiting = (error.reason, str(error))
            return False
        self.start_time = now()
        for container, spec_file in prepared:
            self._launch(container, spec_file)
        return True

    def _create_sandbox(self) -> Sandbox:
        spec = self.latest["spec"]
        hostname = spec.get("hostname") or self.name[:63]
        if spec.get("subdomain"):
            fqdn = f"{hostname}.{spec['subdomain']}.{self.namespace}.svc.cluster.local"
            names = f"{fqdn} {hostname}"
        else:
            names = hostname
        hosts = (f"# Kubernetes-managed hosts file (lab).\n127.0.0.1\tlocalhost\n"
                 f"::1\tlocalhost ip6-localhost ip6-loopback\n{{POD_IP}}\t{names}\n")
        network = self.kubelet.network
        return network.create_sandbox(self.uid.replace("-", "")[:8], self.node.index, hosts,
                                      resolv_conf(self.namespace, network.gateway))

    def _prepare(self, reader: PodSpecReader, container: JSON, volumes: dict[str, Path]) -> tuple[JSON, Path]:
        image = self.kubelet.images.resolve(container.get("image", ""))
        spec = self.latest["spec"]
        home = self.dir / "home" / container["name"]
        home.mkdir(parents=True, exist_ok=True)
        base = {**image.base_env(), "HOSTNAME": spec.get("hostname") or self.name[:63], "HOME": str(home),
                POD_MARKER: self.uid}
        env = reader.env(container, base, self.node.allocatable)
        env[POD_MARKER] = self.uid
        env[RUN_MARKER] = str(self.kubelet.run_dir)
        argv = [expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])]
        if not argv:
            raise NotReadyYetError("CreateContainerError",
                                   "lab images have no entrypoint: the pod must set command")
        mounts = container_mounts(container, volumes)
        for mount in mounts:
            self._make_host_mountpoint(mount.target)
        # The termination message: a file of this container's, bound at terminationMessagePath; its
        # content becomes state.terminated.message, as the kubelet does.
        message_file = self.termination_file(container["name"])
        message_file.touch()
        message_path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        self._make_host_mountpoint(message_path, is_file=True)
        working_dir = container.get("workingDir") or str(image.working_dir or home)
        self._make_host_mountpoint(working_dir)
        spec_file = self.dir / f"{container['name']}.spec.json"
        spec_file.write_text(json.dumps({
            "hostname": spec.get("hostname") or self.name[:63], "workingDir": working_dir, "argv": argv,
            "env": env, "mounts": [
                # /tmp first: a volume or the termination message may be mounted below it.
                {"source": str(self._container_tmp(container["name"])), "target": str(CONTAINER_TMP)},
                *_image_below_tmp(image),
                *({"source": str(m.source), "target": m.target, "readOnly": m.read_only} for m in mounts),
                {"source": str(message_file), "target": message_path, "file": True}],
        }))
        return container, spec_file

    def _container_tmp(self, container: str) -> Path:
        tmp = self.tmp_root / container
        tmp.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o1777)  # as /tmp: any user may write, only the owner may remove
        return tmp

    def _make_host_mountpoint(self, target: str, *, is_file: bool = False) -> None:
        """A mountPath missing on the host is made there (and removed at stop), except below /tmp: that is the
        container's own, where podinit makes it."""
        if not Path(target).is_relative_to(CONTAINER_TMP):
            self.kubelet.make_mountpoint(target, is_file=is_file)

    def _launch(self, container: JSON, spec_file: Path) -> None:
        assert self.sandbox is not None
        log_path = self.log_path(container["name"])
        # Pods run niced, as a node reserves CPU for its system daemons (kube-reserved): on a 2-core
        # machine a burst of pods must not starve the control plane the lab tests against.
        argv = ["nice", "-n", "10", "ip", "netns", "exec", self.sandbox.netns, "unshare", "--uts", "--",
                sys.executable, "-I", str(PODINIT), str(spec_file)]
        with log_path.open("ab") as output:
            popen = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={"PATH": SYSTEM_PATH, POD_MARKER: self.uid,
                                                                RUN_MARKER: str(self.kubelet.run_dir)})
        name = container["name"]
        self.runs[name] = ContainerRun(name, container.get("image", ""), popen, now())

    def termination_file(self, container: str) -> Path:
        return self.dir / f"{container}.termination-log"

    def _termination_message(self, container: JSON, exit_code: int) -> str:
        """What the container left at its terminationMessagePath (or its log's tail, if asked and failed)."""
        path = self.termination_file(container["name"])
        message = path.read_bytes()[:MAX_TERMINATION_MESSAGE].decode(errors="replace") if path.exists() else ""
        if not message.strip() and exit_code != 0 and \
                container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log_path = self.log_path(container["name"])
            tail = log_path.read_bytes()[-MAX_TERMINATION_MESSAGE:] if log_path.exists() else b""
            message = b"\n".join(tail.splitlines()[-80:]).decode(errors="replace")
        return message

    def log_path(self, container: str) -> Path:
        return self.dir / f"{container}.log"

    def _supervise(self) -> None:
        """Wait for the containers to exit, or for a deletion that stops them gracefully."""
        stopping = False
        while True:
            for run in self.runs.values():
                if run.exit_code is None and (code := run.popen.poll()) is not None:
                    # A process killed by signal N reports 128+N, as container runtimes do.
                    run.exit_code = 128 - code if code < 0 else code
                    run.finished_at = now()
                    self._write_status()
            if all(run.exit_code is not None for run in self.runs.values()):
                break
            if self._deletion_requested() and not stopping:
                stopping = True
                grace = self.latest["metadata"].get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = self.latest["spec"].get("terminationGracePeriodSeconds", 30)
                threading.Thread(target=self._kill_all, args=(0 if self.removed else int(grace),),
                                 daemon=True).start()
            self.changed.wait(POLL_S)
            self.changed.clear()
        # Like a container's cgroup going away: nothing of the pod survives its main processes.
        kill_pod_processes(self.uid)

    def _kill_all(self, grace: int) -> None:
        """SIGTERM every process of the pod, SIGKILL what is left after the grace period."""
        signal_pod(self.uid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.popen.poll() is None for r in self.runs.values()):
            time.sleep(POLL_S)
        kill_pod_processes(self.uid)

    def inject_signal(self, signum: int, oom: bool = False) -> None:
        for run in self.runs.values():
            run.oom = oom
            if run.popen.poll() is None:
                os.killpg(run.popen.pid, signum)
        if oom:
            signal_pod(self.uid, signal.SIGKILL)

    def _teardown(self) -> None:
        if self.sandbox is not None:
            self.kubelet.network.delete_sandbox(self.sandbox)
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def _delete_from_api(self) -> None:
        """After the processes are gone the kubelet removes the pod for good (grace period 0)."""
        with self._lock:
            if self.deleted_from_api or self.removed:
                return
            self.deleted_from_api = True
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}}
        # As the kubelet's status manager, retried until it lands: a pod whose final delete is lost stays in the
        # API, Terminating, for good (nothing else removes it), and whoever waits for it to go waits forever.
        for attempt in range(1, FINAL_DELETE_ATTEMPTS + 1):
            try:
                self.api.delete(pod_path(self.namespace, self.name), body)
                log.info("pod %s/%s: deleted from the API", self.namespace, self.name)
                return
            except ApiError as error:
                if error.status in (404, 409):  # gone already, or another pod of the same name
                    return
                failure: Exception = error
            except requests.RequestException as error:
                failure = error
            log.warning("pod %s/%s: final delete failed (attempt %d): %s", self.namespace, self.name, attempt,
                        failure)
            time.sleep(min(0.2 * 2 ** attempt, 5.0))

    # status -------------------------------------------------------------------------------------
    def _container_status(self, container: JSON) -> JSON:
        name = container["name"]
        run = self.runs.get(name)
        status: JSON = {"name": name, "image": container.get("image", ""), "imageID": "",
                        "restartCount": 0, "ready": False, "started": False}
        if run is None:
            reason, message = self.waiting
            status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            return status
        status["containerID"] = f"lab://{self.uid[:8]}-{name}-{run.popen.pid}"
        status["imageID"] = f"lab://{run.image}"
        if run.exit_code is None:
            status.update(ready=True, started=True, state={"running": {"startedAt": run.started_at}})
            return status
        reason = "OOMKilled" if run.oom else ("Completed" if run.exit_code == 0 else "Error")
        status["state"] = {"terminated": {"exitCode": run.exit_code, "reason": reason,
                                          "startedAt": run.started_at, "finishedAt": run.finished_at,
                                          "containerID": status["containerID"]}}
        message = self._termination_message(container, run.exit_code)
        if message:
            status["state"]["terminated"]["message"] = message
        return status

    def _phase(self) -> str:
        runs = self.runs.values()
        if not self.runs or len(self.runs) < len(self.latest["spec"]["containers"]):
            return "Pending"
        if any(r.exit_code is None for r in runs):
            return "Running"
        return "Succeeded" if all(r.exit_code == 0 for r in runs) else "Failed"

    def _conditions(self, phase: str, containers: list[JSON]) -> list[JSON]:
        def condition(kind: str, ok: bool, reason: str | None = None) -> JSON:
            previous = next((c for c in self.latest.get("status", {}).get("conditions") or []
                             if c["type"] == kind), None)
            status = "True" if ok else "False"
            since = previous["lastTransitionTime"] if previous and previous["status"] == status else now()
            result: JSON = {"type": kind, "status": status, "lastTransitionTime": since,
                            "lastProbeTime": None}
            if reason:
                result["reason"] = reason
            return result

        unready = [c["name"] for c in containers if not c["ready"]]
        terminal = phase in ("Succeeded", "Failed")
        ready_reason = "PodCompleted" if terminal else ("ContainersNotReady" if unready else None)
        others = [c for c in self.latest.get("status", {}).get("conditions") or []
                  if c["type"] not in OUR_CONDITIONS]
        return [
            *others,
            condition("PodReadyToStartContainers", self.sandbox is not None and not terminal),
            condition("Initialized", True),
            condition("ContainersReady", not unready, ready_reason),
            condition("Ready", not unready, ready_reason),
        ]

    def _write_status(self) -> None:
        containers = [self._container_status(c) for c in self.latest["spec"]["containers"]]
        phase = self._phase()
        status: JSON = {
            "phase": phase, "hostIP": self.node.ip, "hostIPs": [{"ip": self.node.ip}],
            "conditions": self._conditions(phase, containers), "containerStatuses": containers,
        }
        if qos := self.latest.get("status", {}).get("qosClass"):
            status["qosClass"] = qos  # set by the apiserver at creation; a null would erase it
        if self.start_time:
            status["startTime"] = self.start_time
        if self.sandbox is not None:
            status.update(podIP=self.sandbox.ip, podIPs=[{"ip": self.sandbox.ip}])
        # As the kubelet's status manager, the patch names the pod's UID: a terminal pod is deleted at once, and
        # its controller may create the next pod of the same name before this worker's last write, which the
        # apiserver must then refuse (422, the UID is immutable) rather than make the newcomer look dead.
        patch = {"metadata": {"uid": self.uid}, "status": status}
        deadline = time.monotonic() + STATUS_RETRY_S
        while True:
            try:
                self.latest = self.api.merge_patch(pod_path(self.namespace, self.name, "status"), patch)
                return
            except ApiError as error:
                if error.status == 404 or _another_pod(error):  # gone already, or another pod of its name
                    return
                if error.status < 500 or time.monotonic() > deadline:
                    raise
            except requests.RequestException:
                # The apiserver may be restarting (fault injection): keep the transition, retry.
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)
