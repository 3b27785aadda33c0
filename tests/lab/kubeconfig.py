"""Kubeconfig files for the lab's identities: client certs (admin, components) and bearer tokens."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path, server: str, ca_file: Path, *, user: str,
    cert: Path | None = None, key: Path | None = None, token: str | None = None,
    namespace: str | None = None,
) -> Path:
    credentials: dict[str, str] = {}
    if cert and key:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    elif token:
        credentials = {"token": token}
    else:
        raise ValueError("a kubeconfig needs a client cert+key or a token")
    context: dict[str, str] = {"cluster": "lab", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "lab", "context": context}],
        "current-context": "lab",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
