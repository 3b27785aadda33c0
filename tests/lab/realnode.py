"""The lab's real node: containerd, kubelet and kube-proxy built from their Go modules, running the project's
own images with Debian's runc, next to the process nodes.

Everything it holds is keyed by the lab: a network namespace (kube-proxy's iptables rules, the CNI bridge,
the kubelet's ports), a cgroup root, containerd's root, state and socket, the kubelet's root and pod logs.
:func:`remove_leftovers` undoes all of it, also for a lab whose process died.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from tests.lab.build import ensure_binary
from tests.lab.kubeconfig import write_kubeconfig
from tests.lab.network import NodeNamespace, PodNetwork
from tests.lab.nodeconfig import (
    KubeletSettings,
    NodeFiles,
    cni_conflist,
    containerd_toml,
    kube_proxy_config,
    kubelet_config,
)
from tests.lab.pause import IMAGE_NAME as SANDBOX_IMAGE
from tests.lab.pause import ensure_pause_archive
from tests.lab.pki import Pki
from tests.lab.procs import ManagedProcess, wait_for
from tests.lab.runpaths import lab_key

log = logging.getLogger(__name__)
NODE_NAME = "lab-real-node"
NODE_LABELS = {"kubetrain.dev/lab": "true", "kubetrain.dev/node-kind": "real"}
CGROUP_FS = Path("/sys/fs/cgroup")
CONTAINER_LOGS = Path("/var/log/containers")  # the kubelet's links to pod logs; fixed path, so we tidy ours


@dataclass(frozen=True)
class RealNodeLayout:
    """Everything the node keeps outside its processes, derived from the lab's run directory."""

    files: NodeFiles
    cgroup_root: str

    @classmethod
    def of(cls, run_dir: Path) -> RealNodeLayout:
        key = lab_key(run_dir)
        return cls(NodeFiles(root=run_dir / "real-node", state=Path("/run") / f"kubetrain-lab-{key}"),
                   cgroup_root=f"/kubetrain-lab-{key}")


class RealNode:
    def __init__(self, run_dir: Path, network: PodNetwork, pki: Pki, server: str, *, index: int,
                 images: list[Path]) -> None:
        self.run_dir = run_dir
        self.layout = RealNodeLayout.of(run_dir)
        self.network = network
        self.pki = pki
        self.server = server
        self.index = index
        self.images = images
        self.namespace: NodeNamespace | None = None
        self.processes: dict[str, ManagedProcess] = {}

    @property
    def files(self) -> NodeFiles:
        return self.layout.files

    def start(self) -> None:
        self.namespace = self.network.create_node_namespace(self.index)
        for directory in (self.files.root, self.files.state, self.files.cni_conf_dir, self.files.kubelet_root):
            directory.mkdir(parents=True, exist_ok=True)
        make_cgroup_root(self.layout.cgroup_root)
        self._start_containerd()
        for archive in [ensure_pause_archive(), *self.images]:
            self.import_image(archive)
        self._start_kubelet()
        self._start_kube_proxy()

    def _run(self, name: str, argv: list[str]) -> ManagedProcess:
        """Start a component inside the node's network namespace (nsenter execs it: the pid is the binary's)."""
        assert self.namespace is not None
        proc = ManagedProcess(name, ["nsenter", f"--net={self.namespace.path}", "--", *argv],
                              self.run_dir / "logs" / f"{name}.log")
        self.processes[name] = proc
        proc.start()
        return proc

    def _start_containerd(self) -> None:
        assert self.namespace is not None
        config = self.files.root / "containerd.toml"
        config.write_text(containerd_toml(self.files, SANDBOX_IMAGE))
        (self.files.cni_conf_dir / "10-kubetrain-lab.conflist").write_text(
            cni_conflist(self.namespace.pod_cidr, self.files.root / "cni" / "ipam"))
        proc = self._run("containerd", [str(ensure_binary("containerd")), f"--config={config}"])

        def ready() -> bool:
            proc.check_alive()
            return self._ctr_ok()
        wait_for(ready, 60, "containerd", interval=0.25)

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(ensure_binary("ctr")), f"--address={self.files.containerd_socket}", "--namespace=k8s.io",
                *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def _ctr_ok(self) -> bool:
        return self.files.containerd_socket.exists() and self.ctr("version", timeout=10).returncode == 0

    def import_image(self, archive: Path) -> None:
        # Large images (the trainer carries torch) take minutes to unpack on a busy machine.
        result = self.ctr("images", "import", "--all-platforms", str(archive), timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed: {result.stderr.strip()}")

    def _start_kubelet(self) -> None:
        assert self.namespace is not None
        node_ip = self.namespace.ip
        serving = self.pki.issue("real-node-serving", NODE_NAME, server=True, dns_names=(NODE_NAME,),
                                 ips=(node_ip,))
        client = self.pki.issue("real-node-client", f"system:node:{NODE_NAME}", "system:nodes")
        kubeconfig = write_kubeconfig(self.files.root / "kubelet.kubeconfig", self.server, self.pki.ca.cert,
                                      user=f"system:node:{NODE_NAME}", cert=client.cert, key=client.key)
        resolv_conf = self.files.root / "resolv.conf"
        resolv_conf.write_text("")
        settings = KubeletSettings(node_ip=node_ip, cgroup_root=self.layout.cgroup_root,
                                   cluster_dns=self.network.gateway, ca_file=self.pki.ca.cert,
                                   serving_cert=serving.cert, serving_key=serving.key, resolv_conf=resolv_conf)
        config = self.files.root / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.files, settings)))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._run("kubelet", [
            str(ensure_binary("kubelet")), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.files.kubelet_root}", f"--cert-dir={self.files.root / 'kubelet-pki'}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={node_ip}", f"--node-labels={labels}", "--v=1",
        ])

    def _start_kube_proxy(self) -> None:
        assert self.namespace is not None
        client = self.pki.issue("kube-proxy", "system:kube-proxy")
        kubeconfig = write_kubeconfig(self.files.root / "kube-proxy.kubeconfig", self.server, self.pki.ca.cert,
                                      user="system:kube-proxy", cert=client.cert, key=client.key)
        config = self.files.root / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig, NODE_NAME, self.namespace.ip,
                                                           str(self.network.subnet))))
        self._run("kube-proxy", [str(ensure_binary("kube-proxy")), f"--config={config}", "--v=1"])

    def stop(self) -> None:
        for name in ("kubelet", "kube-proxy"):
            if name in self.processes:
                self.processes[name].stop(grace=5)
        kill_containers(self.layout)
        if "containerd" in self.processes:
            self.processes["containerd"].stop(grace=5)
        remove_leftovers(self.layout)


def make_cgroup_root(cgroup_root: str) -> None:
    """The kubelet wants its cgroupRoot to exist in every controller; cpuset needs its cpus and mems filled."""
    for controller in _controllers():
        path = controller / cgroup_root.lstrip("/")
        path.mkdir(exist_ok=True)
        if controller.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                (path / name).write_text((controller / name).read_text())


def _controllers() -> list[Path]:
    return [d for d in sorted(CGROUP_FS.iterdir()) if d.is_dir() and d.name != "unified"]


def _cgroups_deepest_first(top: Path) -> list[Path]:
    """Every cgroup under ``top`` (not itself), children before parents. os.walk, unlike Path.rglob, passes over a
    cgroup that containerd removes while the walk goes (a container that just died)."""
    return [Path(root) / name for root, dirs, _ in os.walk(top, topdown=False) for name in dirs]


def _cgroup_pids(layout: RealNodeLayout) -> set[int]:
    pids: set[int] = set()
    top = CGROUP_FS / "pids" / layout.cgroup_root.lstrip("/")
    for cgroup in [top, *_cgroups_deepest_first(top)]:
        try:
            pids.update(int(line) for line in (cgroup / "cgroup.procs").read_text().split())
        except OSError:
            continue
    return pids


def kill_containers(layout: RealNodeLayout) -> None:
    """SIGKILL every process in the node's pods (by cgroup), then the node's shims (by containerd address)."""
    def kill_all() -> bool:
        pids = _cgroup_pids(layout)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return not pids
    try:
        wait_for(kill_all, 30, "the real node's containers to die", interval=0.2)
    except TimeoutError:
        log.warning("real node: processes still in %s: %s", layout.cgroup_root, sorted(_cgroup_pids(layout)))
    address = str(layout.files.containerd_socket)
    shims = [p for p in psutil.process_iter(["cmdline"]) if address in (p.info["cmdline"] or [])]
    for shim in shims:
        try:
            shim.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(shims, timeout=10)


def _mounts_under(*roots: Path) -> list[str]:
    prefixes = tuple(str(root) + "/" for root in roots)
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        points = [line.split()[4].replace("\\040", " ") for line in mountinfo]
    return [p for p in points if (p + "/").startswith(prefixes)]


def remove_leftovers(layout: RealNodeLayout) -> None:
    """Unmount what the kubelet and containerd mounted, remove the cgroups, images, state and log links.

    The processes must be gone already (see :func:`kill_containers`); the node's log files stay.
    """
    files = layout.files
    for point in sorted(_mounts_under(files.root, files.state), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    for controller in [*_controllers(), CGROUP_FS / "unified"]:  # runc makes the container's there too
        top = controller / layout.cgroup_root.lstrip("/")
        for cgroup in _cgroups_deepest_first(top):
            _rmdir_quietly(cgroup)
        _rmdir_quietly(top)
    if CONTAINER_LOGS.is_dir():
        for link in CONTAINER_LOGS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(files.root)):
                link.unlink(missing_ok=True)
    for directory in (files.containerd_root, files.kubelet_root, files.state):
        subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], check=False, capture_output=True)


def _rmdir_quietly(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("real node: cgroup %s not removed: %s", path, error)
