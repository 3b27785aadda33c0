"""Pods get their own network namespace, IP and cluster DNS: peers find each other as in a cluster."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.lab.fixtures import pod_log_text
from tests.lab.lab import Lab
from tests.lab.network import PodNetwork, ip
from tests.lab.pods import headless_service, pod_manifest, terminated_state, wait_pod

pytestmark = pytest.mark.lab

# Each pod serves its name on port 8080 (the same port in both pods) and fetches its peer's through the
# short and the fully qualified DNS name; it exits 0 once it both reached the peer and was reached, and one
# answer for the Service listed both pods. A pod stays 5 s after its checks, so that it is still listed
# when its peer next reads the Service, and the fullest answer is kept.
PEER_SCRIPT = textwrap.dedent("""
    import http.server, os, socket, sys, threading, time, urllib.request
    me, peer, ns = os.environ["ME"], os.environ["PEER"], os.environ["POD_NAMESPACE"]
    served = []
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(self.path)
            self.send_response(200); self.end_headers(); self.wfile.write(me.encode())
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    names = [f"{peer}.peers", f"{peer}.peers.{ns}.svc.cluster.local"]
    reached, service_ips = set(), set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (len(reached) < 2 or len(served) < 2 or len(service_ips) < 2):
        for name in names:
            try:
                if urllib.request.urlopen(f"http://{name}:8080/", timeout=2).read().decode() == peer:
                    reached.add(name)
            except OSError:
                pass
        try:
            answer = set(socket.gethostbyname_ex("peers")[2])
            service_ips = max(service_ips, answer, key=len)
        except OSError:
            pass
        time.sleep(0.2)
    print("reached", sorted(reached), "served", len(served), "service", sorted(service_ips), flush=True)
    time.sleep(5)  # still listed while the peer's next check reads the Service
    sys.exit(0 if len(reached) == 2 and len(served) >= 2 and len(service_ips) == 2 else 1)
""")

ALL_REDUCE_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print("all_reduce", dist.get_rank(), dist.get_world_size(), value.item(), flush=True)
    assert value.item() == 3.0
    dist.destroy_process_group()
""")


def _namespace_env() -> list[dict[str, object]]:
    return [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


def test_pods_reach_each_other_by_dns_name(lab: Lab, namespace: str) -> None:
    lab.api.post(f"/api/v1/namespaces/{namespace}/services",
                 headless_service("peers", {"app": "peers"}, {"http": 8080}))
    for me, peer in (("a", "b"), ("b", "a")):
        manifest = pod_manifest(f"peer-{me}", ["python"], ["-c", PEER_SCRIPT], env={"ME": me, "PEER": peer},
                                labels={"app": "peers"}, hostname=me, subdomain="peers")
        manifest["spec"]["containers"][0]["env"] += _namespace_env()
        lab.api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    for me in ("a", "b"):
        pod = wait_pod(lab.api, namespace, f"peer-{me}", timeout=120)
        assert pod["status"]["phase"] == "Succeeded", pod_log_text(lab, namespace, f"peer-{me}")
    ips = {wait_pod(lab.api, namespace, f"peer-{me}")["status"]["podIP"] for me in ("a", "b")}
    assert len(ips) == 2


def test_torchrun_c10d_rendezvous_across_two_pods(lab: Lab, namespace: str) -> None:
    job = "job"
    lab.api.post(f"/api/v1/namespaces/{namespace}/services",
                 headless_service(job, {"job": job}, {"rdzv": 29400}))
    env = {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{job}-0.{job}:29400", "PET_RDZV_ID": f"{namespace}-{job}",
        "PET_MAX_RESTARTS": "0", "OMP_NUM_THREADS": "1",
    }
    for index in range(2):
        manifest = pod_manifest(f"{job}-{index}", ["torchrun"],
                                ["--no-python", "python", "-c", ALL_REDUCE_SCRIPT], env=env,
                                labels={"job": job}, hostname=f"{job}-{index}", subdomain=job, grace_s=5)
        lab.api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    for index in range(2):
        pod = wait_pod(lab.api, namespace, f"{job}-{index}", timeout=180)
        log = pod_log_text(lab, namespace, f"{job}-{index}")
        assert pod["status"]["phase"] == "Succeeded", log
        assert terminated_state(pod)["exitCode"] == 0
        assert "all_reduce" in log and " 2 3.0" in log, log


def _mac(link: str) -> str:
    return Path(f"/sys/class/net/{link}/address").read_text().strip()


def test_the_gateway_keeps_its_mac_address_while_pods_come_and_go() -> None:
    """Pods reach the DNS and the API server through the bridge's address, by the MAC in their ARP cache."""
    network = PodNetwork.create()
    try:
        gateway_mac = _mac(network.bridge)
        sandbox = network.create_sandbox("mactest", 0, "", "")
        # Lower than the bridge's own: a bridge that follows its ports would take it.
        ip("link", "set", sandbox.host_veth, "address", "02:00:00:00:00:01")
        assert _mac(sandbox.host_veth) == "02:00:00:00:00:01"
        assert _mac(network.bridge) == gateway_mac
        network.delete_sandbox(sandbox)
        assert _mac(network.bridge) == gateway_mac
    finally:
        network.down()
