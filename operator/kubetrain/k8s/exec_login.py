"""Kubeconfig users whose credentials come from an `exec:` plugin (kubelogin, `aws eks get-token`,
gke-gcloud-auth-plugin): kopf's kubeconfig login reads static credentials only, so the plugin is run here, the
way kubectl runs it (client.authentication.k8s.io ExecCredential: the request in KUBERNETES_EXEC_INFO, the
credential on the plugin's stdout, its stderr passed through for prompts and warnings)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import kopf
import yaml

__all__ = ["ExecPlugin", "credential_fields", "current_exec_plugin", "plugin_request", "with_exec_credentials"]

Json = Any

EXEC_INFO_ENV = "KUBERNETES_EXEC_INFO"
PLUGIN_TIMEOUT_SECONDS = 120  # a plugin may open a browser for a device-code login


@dataclasses.dataclass(frozen=True)
class ExecPlugin:
    """The current user's `exec:` section, and the folder of the kubeconfig that defines it."""

    section: Mapping[str, Json]
    folder: Path


def kubeconfig_paths() -> list[Path]:
    """KUBECONFIG's files in order, else ~/.kube/config (the first file that sets a value wins)."""
    listed = [part for part in os.environ.get("KUBECONFIG", "").split(os.pathsep) if part.strip()]
    return [Path(part.strip()).expanduser() for part in listed or ["~/.kube/config"]]


def current_exec_plugin(documents: list[tuple[Path, Json]]) -> ExecPlugin | None:
    """The current context's user's `exec:` section across merged kubeconfigs (first wins), else None."""
    current = next((doc["current-context"] for _, doc in documents if doc.get("current-context")), None)
    context = next((item.get("context") or {} for _, doc in documents for item in doc.get("contexts") or []
                    if item.get("name") == current), {})
    user = next(((path, item.get("user") or {}) for path, doc in documents for item in doc.get("users") or []
                 if item.get("name") == context.get("user")), None)
    if user is None or not user[1].get("exec"):
        return None
    return ExecPlugin(user[1]["exec"], user[0].parent)


def plugin_request(plugin: ExecPlugin, environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment kubectl would give the plugin; LoginError when it cannot run here."""
    section = plugin.section
    if section.get("interactiveMode") == "Always":
        raise kopf.LoginError(f"the kubeconfig's exec plugin {section.get('command')!r} needs a terminal "
                              "(interactiveMode: Always); log in with it once, or use a token")
    command = str(section.get("command") or "")
    if not command:
        raise kopf.LoginError("the kubeconfig's exec section names no command")
    if os.sep in command and not Path(command).is_absolute():  # relative to the kubeconfig, as kubectl reads it
        command = str(plugin.folder / command)
    request = {"apiVersion": section.get("apiVersion"), "kind": "ExecCredential",
               "spec": {"interactive": False}}
    env = {**environ, **{item["name"]: item["value"] for item in section.get("env") or []},
           EXEC_INFO_ENV: json.dumps(request)}
    return [command, *[str(arg) for arg in section.get("args") or []]], env


def credential_fields(output: str, api_version: str | None) -> dict[str, Any]:
    """ConnectionInfo's fields from the plugin's ExecCredential; LoginError when it is not one."""
    try:
        credential = json.loads(output)
        status = credential["status"]
    except (ValueError, KeyError, TypeError) as error:
        raise kopf.LoginError(f"the exec plugin printed no ExecCredential with a status: {error}") from error
    if credential.get("kind") != "ExecCredential" or (api_version and credential.get("apiVersion") != api_version):
        raise kopf.LoginError(f"the exec plugin answered {credential.get('apiVersion')}/{credential.get('kind')}, "
                              f"not {api_version}/ExecCredential")
    fields: dict[str, Any] = {"token": status.get("token"), "certificate_data": status.get("clientCertificateData"),
                              "private_key_data": status.get("clientKeyData")}
    if not fields["token"] and not (fields["certificate_data"] and fields["private_key_data"]):
        raise kopf.LoginError("the exec plugin's ExecCredential has neither a token nor a client certificate")
    expires = status.get("expirationTimestamp")
    if expires:
        fields["expiration"] = datetime.fromisoformat(expires.replace("Z", "+00:00"))
    return {name: value for name, value in fields.items() if value}


def with_exec_credentials(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    """``info`` with the credentials of the current user's exec plugin, when it has one."""
    documents = [(path, yaml.safe_load(path.read_text(encoding="utf-8")) or {})
                 for path in kubeconfig_paths() if path.exists()]
    plugin = current_exec_plugin(documents)
    if plugin is None:
        return info
    argv, env = plugin_request(plugin, os.environ)
    try:
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, timeout=PLUGIN_TIMEOUT_SECONDS,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise kopf.LoginError(f"the kubeconfig's exec plugin {argv[0]!r} could not run: {error}") from error
    if done.returncode != 0:
        raise kopf.LoginError(f"the kubeconfig's exec plugin {argv[0]!r} exited with {done.returncode}")
    return dataclasses.replace(info, **credential_fields(done.stdout, plugin.section.get("apiVersion")))
