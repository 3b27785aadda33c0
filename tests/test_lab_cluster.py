"""The lab's control plane is the real thing: RBAC, Pod Security admission, node lifecycle."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from kubetrain.k8s.transport import Rest, login
from tests.lab.lab import Lab
from tests.lab.pods import pod_manifest, wait_pod
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError

pytestmark = pytest.mark.lab


def _ready(lab: Lab, node: str) -> str:
    conditions = lab.node(node)["status"]["conditions"]
    return str(next(c["status"] for c in conditions if c["type"] == "Ready"))


async def _node_names_as_the_cli_reads_them() -> list[str]:
    """The CLI's client: the operator's transport, logged in from KUBECONFIG by kopf's kubeconfig login."""
    rest = Rest(lambda: login(kopf.OperatorSettings()), connections=1)
    try:
        return [str(node["metadata"]["name"]) for node in (await rest.request("GET", "/api/v1/nodes"))["items"]]
    finally:
        await rest.close()


def test_apiserver_reports_the_built_version(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    version = lab.api.get("/version")
    assert version["gitVersion"] == "v1.37.2"
    assert lab.kubectl("version", "-o", "json").returncode == 0
    monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
    assert sorted(asyncio.run(_node_names_as_the_cli_reads_them())) == sorted(lab.node_names)


def test_restricted_token_cannot_read_secrets(lab: Lab, namespace: str) -> None:
    lab.api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}})
    lab.api.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]})
    lab.api.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    lab.api.post(f"/api/v1/namespaces/{namespace}/secrets",
                 {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}})
    kubeconfig = lab.token_kubeconfig(namespace, "reader")

    assert lab.kubectl("get", "pods", kubeconfig=kubeconfig).returncode == 0
    denied = lab.kubectl("get", "secrets", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    assert lab.kubectl("auth", "can-i", "get", "secrets", kubeconfig=kubeconfig,
                       check=False).stdout.strip() == "no"


def test_privileged_pod_rejected_by_pod_security(lab: Lab, namespace: str) -> None:
    lab.api.merge_patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    privileged = pod_manifest("privileged", ["python"], ["-c", "pass"])
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiError) as rejected:
        lab.api.post(f"/api/v1/namespaces/{namespace}/pods", privileged)
    assert rejected.value.status == 403 and "violates PodSecurity" in rejected.value.body
    # The operator's restricted pod shape is admitted and runs.
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("fine", ["python"], ["-c", "pass"]))
    wait_pod(lab.api, namespace, "fine", ("Succeeded",))


def test_node_without_heartbeats_turns_not_ready(lab: Lab) -> None:
    node = lab.node_names[-1]
    lab.stop_node_heartbeats(node)
    try:
        # node-monitor-grace-period is 16 s: ~20 s on an idle machine; the timeout allows a loaded one.
        wait_for(lambda: _ready(lab, node) != "True", 90, f"{node} to turn NotReady", interval=0.5)
    finally:
        lab.resume_node_heartbeats(node)
    wait_for(lambda: _ready(lab, node) == "True", 60, f"{node} to be Ready again", interval=0.5)
    wait_for(lambda: not lab.node(node)["spec"].get("taints"), 60, f"{node} taints to clear", interval=0.5)


def test_pods_survive_an_apiserver_restart(lab: Lab, namespace: str) -> None:
    script = "import time; time.sleep(4); print('done')"
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("through", ["python"], ["-c", script]))
    wait_pod(lab.api, namespace, "through", ("Running",))
    lab.restart_apiserver()
    # The kubelet's watch and status writes recover: the pod still reports its end, a new pod still runs.
    wait_pod(lab.api, namespace, "through", ("Succeeded",), timeout=90)
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", pod_manifest("after", ["python"], ["-c", "pass"]))
    wait_pod(lab.api, namespace, "after", ("Succeeded",), timeout=90)
