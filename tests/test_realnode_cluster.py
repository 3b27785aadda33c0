"""The lab's real node behaves as a cluster node does: the project's images run under containerd and runc as
their non-root users, the kernel enforces memory limits, `kubectl logs` and `exec` are served by the kubelet,
Services work through cluster DNS and kube-proxy, the `kubernetes` Service reaches the apiserver, and a bare
claim binds to the default storage class with a directory non-root pods can write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.lab.lab import Lab
from tests.lab.oci import IMAGES
from tests.lab.pods import pod_manifest, terminated_state, wait_pod
from tests.lab.procs import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.real_node]
Json = Any
OPERATOR_IMAGE = IMAGES["operator"]  # has Python and kubetrain's own API client; smaller than the trainer's


def python_pod(name: str, script: str, *, memory: str = "256Mi", working_dir: str | None = None,
               **spec: Any) -> Json:
    """A pod running ``python -c script`` in the operator image as uid 1000 (restricted); ``spec``: pod fields."""
    manifest = pod_manifest(name, ["python", "-c", script], image=OPERATOR_IMAGE, **spec)
    container = manifest["spec"]["containers"][0]
    container.update(imagePullPolicy="Never", resources={"limits": {"cpu": "200m", "memory": memory}})
    if working_dir:
        container["workingDir"] = working_dir
    return manifest


def create(lab: Lab, namespace: str, manifest: Json) -> None:
    kind = manifest["kind"].lower() + "s"
    lab.api.post(f"/api/v1/namespaces/{namespace}/{kind}", manifest)


def test_real_node_runs_containerd_and_the_real_kubelet(real_lab: Lab) -> None:
    node = next(n for n in real_lab.api.get("/api/v1/nodes")["items"]
                if n["metadata"]["labels"].get("kubetrain.dev/node-kind") == "real")
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    assert info["kubeletVersion"] == "v1.37.2"
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    images = {name for image in node["status"].get("images", []) for name in image["names"]}
    assert {IMAGES["operator"], IMAGES["trainer"]} <= images, images


def test_non_root_container_serves_logs_and_exec(real_lab: Lab, real_namespace: str) -> None:
    create(real_lab, real_namespace, python_pod(
        "whoami", "import os, time; print('uid', os.getuid(), 'gid', os.getgid(), flush=True); time.sleep(300)"))
    wait_pod(real_lab.api, real_namespace, "whoami", ("Running",))

    def logged() -> bool:
        out = real_lab.kubectl("logs", "-n", real_namespace, "whoami", check=False).stdout
        return "uid 1000 gid" in out
    wait_for(logged, 30, "`kubectl logs` to show the container's output")
    exec_id = real_lab.kubectl("exec", "-n", real_namespace, "whoami", "--", "id", "-u").stdout.strip()
    assert exec_id == "1000"
    # The root filesystem belongs to root: a non-root process cannot write outside its volumes.
    denied = real_lab.kubectl("exec", "-n", real_namespace, "whoami", "--", "touch", "/opt/x", check=False)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr


def test_memory_limit_is_enforced_by_the_kernel_oom_killer(real_lab: Lab, real_namespace: str) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 2**20))"
    create(real_lab, real_namespace, python_pod("hog", hog, memory="96Mi"))
    state = terminated_state(wait_pod(real_lab.api, real_namespace, "hog", ("Failed",), timeout=120))
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)


def test_cluster_dns_and_cluster_ip_through_kube_proxy(real_lab: Lab, real_namespace: str) -> None:
    server = python_pod("web", "import http.server as h; h.HTTPServer(('', 8080), h.SimpleHTTPRequestHandler)"
                               ".serve_forever()", working_dir="/opt/venv")
    server["metadata"]["labels"] = {"app": "web"}
    create(real_lab, real_namespace, server)
    create(real_lab, real_namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                                      "spec": {"selector": {"app": "web"}, "ports": [{"port": 80,
                                                                                      "targetPort": 8080}]}})
    cluster_ip = real_lab.api.get(f"/api/v1/namespaces/{real_namespace}/services/web")["spec"]["clusterIP"]
    wait_pod(real_lab.api, real_namespace, "web", ("Running",))
    client = ("import socket, urllib.request, time\n"
              "for _ in range(60):\n"
              "    try:\n"
              "        body = urllib.request.urlopen('http://web/pyvenv.cfg', timeout=2).read()\n"
              "        break\n"
              "    except OSError:\n"
              "        time.sleep(0.5)\n"
              "print(socket.gethostbyname('web'), b'home' in body)")
    create(real_lab, real_namespace, python_pod("client", client))
    wait_pod(real_lab.api, real_namespace, "client", ("Succeeded",))
    out = real_lab.kubectl("logs", "-n", real_namespace, "client").stdout.split()
    assert out == [cluster_ip, "True"], "the name resolves to the ClusterIP and kube-proxy forwards it"


def test_kubernetes_service_reaches_the_apiserver_from_a_pod(real_lab: Lab, real_namespace: str) -> None:
    # The operator's own login and client, as the operator runs in a pod: the service account, then the Service.
    script = ("import asyncio, os, kopf\n"
              "from kubetrain.k8s.transport import Rest, login\n"
              "async def version():\n"
              "    rest = Rest(lambda: login(kopf.OperatorSettings()), 1)\n"
              "    try:\n"
              "        return (await rest.request('GET', '/version'))['gitVersion']\n"
              "    finally:\n"
              "        await rest.close()\n"
              "print(os.environ['KUBERNETES_SERVICE_HOST'], asyncio.run(version()))")
    create(real_lab, real_namespace, python_pod("incluster", script, automountServiceAccountToken=True))
    pod = wait_pod(real_lab.api, real_namespace, "incluster", ("Succeeded", "Failed"), timeout=120)
    out = real_lab.kubectl("logs", "-n", real_namespace, "incluster").stdout
    assert pod["status"]["phase"] == "Succeeded", out
    assert out.split() == ["10.0.0.1", "v1.37.2"]


def test_default_storage_class_gives_non_root_pods_a_writable_volume(real_lab: Lab, real_namespace: str) -> None:
    create(real_lab, real_namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    writer = python_pod("writer", "open('/data/hello', 'w').write('from uid 1000')",
                        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "scratch"}}])
    writer["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    create(real_lab, real_namespace, writer)
    wait_pod(real_lab.api, real_namespace, "writer", ("Succeeded",), timeout=120)
    claim = real_lab.api.get(f"/api/v1/namespaces/{real_namespace}/persistentvolumeclaims/scratch")
    volume = real_lab.api.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
    written = Path(volume["spec"]["hostPath"]["path"]) / "hello"
    assert written.read_text() == "from uid 1000"
    assert os.stat(written).st_uid == 1000
    print(json.dumps({"claim": claim["spec"].get("storageClassName"), "path": str(written)}))
