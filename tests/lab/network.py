"""The pod network: one bridge per lab, one network namespace and veth pair per pod.

Pods get an address on the bridge's /16 and no default route, so their traffic can reach only other pods
of this lab and the bridge address (where the lab's DNS listens); nothing is routed anywhere else.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
PREFIX = "ktlab"
MAX_LABS = 10


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _existing_links() -> set[str]:
    out = ip("-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def existing_netns() -> list[str]:
    out = ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@dataclass(frozen=True)
class Sandbox:
    netns: str
    ip: str
    host_veth: str


@dataclass(frozen=True)
class NodeNamespace:
    """A real node's own network namespace: its InternalIP on the lab bridge, its pods' subnet behind it."""

    netns: str
    ip: str
    pod_cidr: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"


class PodNetwork:
    def __init__(self, index: int) -> None:
        self.index = index
        self.bridge = f"{PREFIX}{index}"
        self.subnet = ipaddress.ip_network(f"10.{244 + index}.0.0/16")
        self.gateway = str(self.subnet.network_address + 1)
        # Set, not inherited: a Linux bridge without a MAC of its own takes the lowest of its ports' and
        # changes it as pods come and go; every pod's ARP entry for the gateway then points nowhere for
        # seconds, and its DNS queries vanish (pod 0 of a job timed out resolving a new peer's address).
        self.bridge_mac = f"02:6b:74:6c:00:{index:02x}"
        self._lock = threading.Lock()
        self._used: set[str] = set()

    @classmethod
    def create(cls) -> PodNetwork:
        """Take the first free lab index, so that two labs on one machine don't share a bridge."""
        for index in range(MAX_LABS):
            if f"{PREFIX}{index}" in _existing_links():
                continue
            network = cls(index)
            try:
                ip("link", "add", network.bridge, "address", network.bridge_mac, "type", "bridge")
            except subprocess.CalledProcessError:
                continue  # another lab took this index between our look and our `ip link add`
            try:
                network._up()
            except BaseException:
                ip("link", "del", network.bridge, check=False)
                raise
            return network
        raise RuntimeError(f"all {MAX_LABS} lab bridges are in use; run `python -m tests.lab down`")

    def _up(self) -> None:
        ip("addr", "add", f"{self.gateway}/16", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def _node_address(self, node_index: int) -> str:
        return str(self.subnet.network_address + 255 * 256 + node_index + 1)

    def node_ip(self, node_index: int) -> str:
        """A process node's address: on the bridge itself, since its kubelet lives in this namespace."""
        address = self._node_address(node_index)
        ip("addr", "add", f"{address}/32", "dev", self.bridge, check=False)
        return address

    def create_node_namespace(self, node_index: int) -> NodeNamespace:
        """A namespace for a real node's kubelet, containerd and kube-proxy, wired to the lab bridge.

        Its iptables rules (kube-proxy), CNI bridge and ports stay inside, so two labs never meet. It
        forwards between its pods and the lab bridge, and answers ARP there for its pods' addresses
        (proxy_arp), so process pods reach real pods without routes of their own.
        """
        node = NodeNamespace(f"{PREFIX}{self.index}-node{node_index}", self._node_address(node_index),
                             self.pod_cidr(node_index))
        host_veth = f"kn{self.index}n{node_index}"
        ip("netns", "add", node.netns)
        ip("link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        ip("link", "set", host_veth, "master", self.bridge, "up")
        ip("-n", node.netns, "addr", "add", f"{node.ip}/16", "dev", "eth0")
        ip("-n", node.netns, "link", "set", "eth0", "up")
        ip("-n", node.netns, "link", "set", "lo", "up")
        for key in ("net/ipv4/ip_forward", "net/ipv4/conf/eth0/proxy_arp", "net/bridge/bridge-nf-call-iptables"):
            netns_sysctl(node.netns, key, "1")
        # The lab's own address (apiserver, DNS) answers real pods through the node, as a router would.
        ip("route", "add", node.pod_cidr, "via", node.ip, "dev", self.bridge)
        return node

    def pod_cidr(self, node_index: int) -> str:
        return str(ipaddress.ip_network(f"10.{244 + self.index}.{node_index + 1}.0/24"))

    def _allocate(self, node_index: int) -> str:
        with self._lock:
            for host in ipaddress.ip_network(self.pod_cidr(node_index)).hosts():
                candidate = str(host)
                if not candidate.endswith(".1") and candidate not in self._used:
                    self._used.add(candidate)
                    return candidate
        raise RuntimeError(f"node {node_index} has no free pod IP left")

    def create_sandbox(self, key: str, node_index: int, hosts: str, resolv_conf: str) -> Sandbox:
        """A network namespace with eth0 on the bridge, plus /etc/netns files that `ip netns exec` binds."""
        netns = f"{PREFIX}{self.index}-{key}"
        host_veth = f"kv{self.index}{key}"[:15]
        address = self._allocate(node_index)
        etc = NETNS_ETC / netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts.replace("{POD_IP}", address))
        (etc / "resolv.conf").write_text(resolv_conf)
        ip("netns", "add", netns)
        ip("link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", host_veth, "master", self.bridge, "up")
        ip("-n", netns, "addr", "add", f"{address}/16", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")
        return Sandbox(netns=netns, ip=address, host_veth=host_veth)

    def delete_sandbox(self, sandbox: Sandbox) -> None:
        ip("netns", "del", sandbox.netns, check=False)
        ip("link", "del", sandbox.host_veth, check=False)
        shutil.rmtree(NETNS_ETC / sandbox.netns, ignore_errors=True)
        with self._lock:
            self._used.discard(sandbox.ip)

    def down(self) -> None:
        remove_network(self.index)


def netns_sysctl(netns: str, key: str, value: str) -> None:
    """Set a per-namespace sysctl (a key absent in this kernel is skipped)."""
    script = f'[ ! -e /proc/sys/{key} ] || echo {value} > /proc/sys/{key}'
    subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", script], check=True, capture_output=True)


def remove_network(index: int) -> None:
    """Delete a lab's namespaces, /etc/netns entries and bridge (also those of a lab that crashed)."""
    for netns in existing_netns():
        if netns.startswith(f"{PREFIX}{index}-"):
            ip("netns", "del", netns, check=False)
            shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    ip("link", "del", f"{PREFIX}{index}", check=False)
