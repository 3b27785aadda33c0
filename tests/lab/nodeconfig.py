"""The real node's configuration files as pure functions: containerd, CNI, kubelet and kube-proxy.

Every setting that differs from the defaults is here because this machine kind needs it (see
../shared/REALNODE.md in the project's notes and docs/lab.md): cgroup v1 with the cgroupfs driver, root
without CAP_SYS_RESOURCE, no registry, and a namespace of the node's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RUNC = "/usr/bin/runc"  # Debian's runc: crun fails here ("cgroups in hybrid mode not supported")
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
KUBELET_PORT = 10250


@dataclass(frozen=True)
class NodeFiles:
    """Where a real node keeps what it writes; ``state`` is on tmpfs with a short path (unix sockets)."""

    root: Path
    state: Path

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"


def containerd_toml(files: NodeFiles, sandbox_image: str) -> str:
    """containerd 2.x (config version 3) with a root, state and socket of its own."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "{files.containerd_root}"
state = "{files.state / 'containerd'}"
# NRI and tracing would open sockets at fixed, machine-wide paths.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{files.containerd_socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox_image}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri_runtime}]
  # The kubelet asks for oom_score_adj -998 for sandboxes; lowering it needs CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not the machine's /run/netns.
  netns_mounts_under_state_dir = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{files.cni_conf_dir}"
"""


def cni_conflist(pod_cidr: str, ipam_dir: Path) -> str:
    """A bridge inside the node's namespace; pods route through it, their addresses from the node's CIDR."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": "kubetrain-lab",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                      "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2)


@dataclass(frozen=True)
class KubeletSettings:
    node_ip: str
    cgroup_root: str
    cluster_dns: str
    ca_file: Path
    serving_cert: Path
    serving_key: Path
    resolv_conf: Path


def kubelet_config(files: NodeFiles, settings: KubeletSettings) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # v1.35+ refuses cgroup v1 (this machine's) unless told
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": settings.cgroup_root,  # each lab its own, so that two kubelets never share kubepods
        "containerRuntimeEndpoint": f"unix://{files.containerd_socket}",
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        # Never evict or garbage-collect the lab's images; disk signals need stats it cannot read here.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi"},
        "address": settings.node_ip, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(settings.serving_cert), "tlsPrivateKeyFile": str(settings.serving_key),
        # Only holders of the lab CA's certificates (the apiserver) may call it; they may do anything.
        "authentication": {"x509": {"clientCAFile": str(settings.ca_file)},
                           "webhook": {"enabled": False}, "anonymous": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [settings.cluster_dns], "clusterDomain": "cluster.local",
        "resolvConf": str(settings.resolv_conf),  # no upstream resolvers: pods see only cluster DNS
        "podLogsDir": str(files.root / "pod-logs"),  # not the machine's /var/log/pods
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(kubeconfig: Path, node_name: str, node_ip: str, cluster_cidr: str) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "hostnameOverride": node_name,
        "bindAddress": node_ip,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Zero: leave the conntrack sysctls alone (raising them needs capabilities the lab may lack).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
