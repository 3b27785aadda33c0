"""Kubeconfig users with an `exec:` credential plugin: the pure parts, then a real plugin against the lab."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from kubetrain.k8s.exec_login import ExecPlugin, credential_fields, current_exec_plugin, plugin_request
from kubetrain.k8s.transport import ApiError, Rest, login
from tests.lab.lab import Lab

Json = Any
V1 = "client.authentication.k8s.io/v1"


def kubeconfig(user: str, users: list[Json], current: str | None = "lab") -> Json:
    return {"current-context": current, "contexts": [{"name": "lab", "context": {"cluster": "c", "user": user}}],
            "users": users}


EXEC = {"apiVersion": V1, "command": "bin/token", "args": ["--scope", "x"], "env": [{"name": "TEAM", "value": "a"}]}


def test_the_current_users_plugin_is_found_and_the_first_file_wins(tmp_path: Path) -> None:
    first = kubeconfig("me", [{"name": "me", "user": {"exec": EXEC}}])
    second = {"users": [{"name": "me", "user": {"token": "static"}}], "current-context": "other"}
    plugin = current_exec_plugin([(tmp_path / "a" / "config", first), (tmp_path / "b" / "config", second)])
    assert plugin == ExecPlugin(EXEC, tmp_path / "a")
    assert current_exec_plugin([(tmp_path / "config", kubeconfig("me", [{"name": "me", "user": {"token": "t"}}]))]) \
        is None
    assert current_exec_plugin([(tmp_path / "config", kubeconfig("me", [], current=None))]) is None


def test_the_plugin_gets_kubectls_request_its_env_and_a_path_relative_to_its_kubeconfig(tmp_path: Path) -> None:
    argv, env = plugin_request(ExecPlugin(EXEC, tmp_path), {"PATH": "/bin"})
    assert argv == [str(tmp_path / "bin" / "token"), "--scope", "x"]
    assert env["PATH"] == "/bin" and env["TEAM"] == "a"
    assert json.loads(env["KUBERNETES_EXEC_INFO"]) == {"apiVersion": V1, "kind": "ExecCredential",
                                                       "spec": {"interactive": False}}
    on_path, _ = plugin_request(ExecPlugin({**EXEC, "command": "aws"}, tmp_path), {})
    assert on_path[0] == "aws"  # a bare name is looked up on PATH, as kubectl does
    with pytest.raises(kopf.LoginError, match="needs a terminal"):
        plugin_request(ExecPlugin({**EXEC, "interactiveMode": "Always"}, tmp_path), {})


@pytest.mark.parametrize(("status", "expected"), [
    ({"token": "t"}, {"token": "t"}),
    ({"clientCertificateData": "C", "clientKeyData": "K"}, {"certificate_data": "C", "private_key_data": "K"}),
])
def test_a_token_or_a_client_certificate_is_a_credential(status: Json, expected: Json) -> None:
    output = json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": status})
    assert credential_fields(output, V1) == expected


def test_the_expiry_is_kept_and_a_non_credential_is_refused() -> None:
    answer = {"apiVersion": V1, "kind": "ExecCredential",
              "status": {"token": "t", "expirationTimestamp": "2026-12-04T20:00:00Z"}}
    assert credential_fields(json.dumps(answer), V1)["expiration"].isoformat() == "2026-12-04T20:00:00+00:00"
    for output, message in [("not json", "no ExecCredential"), (json.dumps({**answer, "status": {}}), "neither"),
                            (json.dumps({**answer, "apiVersion": "v9"}), "not client.authentication")]:
        with pytest.raises(kopf.LoginError, match=message):
            credential_fields(output, V1)


# Against the lab: a plugin that hands out a ServiceAccount's token ------------------------------------------
PLUGIN = """#!{python}
import json, os, sys
request = json.loads(os.environ["KUBERNETES_EXEC_INFO"])  # kubectl's request: absent means a wrong caller
token = open(os.environ["TOKEN_FILE"]).read().strip()
print(json.dumps({{"apiVersion": request["apiVersion"], "kind": "ExecCredential", "status": {{"token": token}}}}))
"""


def exec_kubeconfig(lab: Lab, folder: Path, token: str) -> Path:
    (folder / "bin").mkdir(parents=True)
    plugin = folder / "bin" / "token-plugin"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    (folder / "token").write_text(token)
    admin = yaml.safe_load(lab.kubeconfig.read_text())
    user = {"exec": {"apiVersion": V1, "command": "bin/token-plugin", "interactiveMode": "Never",
                     "env": [{"name": "TOKEN_FILE", "value": str(folder / "token")}]}}
    config = {**admin, "users": [{"name": "plugin-user", "user": user}],
              "contexts": [{"name": "lab", "context": {"cluster": admin["contexts"][0]["context"]["cluster"],
                                                       "user": "plugin-user"}}], "current-context": "lab"}
    path = folder / "config"
    path.write_text(yaml.safe_dump(config))
    return path


async def status_of(path: str) -> int:
    rest = Rest(lambda: login(kopf.OperatorSettings()), connections=1)
    try:
        await rest.request("GET", path)
        return 200
    except ApiError as error:
        return error.status
    finally:
        await rest.close()


@pytest.mark.lab
def test_a_real_plugins_token_logs_in_as_its_service_account(lab: Lab, namespace: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lab.api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer"}})
    lab.api.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}]})
    token = lab.api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/viewer/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": 3600}})["status"]["token"]
    monkeypatch.setenv("KUBECONFIG", str(exec_kubeconfig(lab, tmp_path / "good", token)))
    # The plugin's identity, not the admin's: its pods are readable, its secrets and other namespaces not.
    assert asyncio.run(status_of(f"/api/v1/namespaces/{namespace}/pods")) == 200
    assert asyncio.run(status_of(f"/api/v1/namespaces/{namespace}/secrets")) == 403
    assert asyncio.run(status_of("/api/v1/namespaces/kube-system/pods")) == 403
    monkeypatch.setenv("KUBECONFIG", str(exec_kubeconfig(lab, tmp_path / "bad", "not-a-token")))
    assert asyncio.run(status_of(f"/api/v1/namespaces/{namespace}/pods")) == 401
