"""The project in a lab: its CRD established and the identity (ServiceAccount, RBAC, API priority level) that its
chart renders.

Shared by the operator tests (tests/operator_fixtures.py) and the benchmarks (bench/cluster.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.lab.build import ensure_binary
from tests.lab.images import REPO
from tests.lab.lab import Lab
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError

CRD = REPO / "crds" / "trainingjobs.kubetrain.io.yaml"
CHART = REPO / "charts" / "kubetrain"
OPERATOR_NAMESPACE = "kubetrain-system"
RELEASE = "kubetrain"  # the release the chart is rendered as: its fullname names the FlowSchema too
DISPATCHED = re.compile(r"^apiserver_flowcontrol_dispatched_requests_total\{(?P<labels>[^}]*)\} (?P<count>\S+)$",
                        re.M)
Json = Any


def render_chart(*args: str) -> list[Json]:
    """`helm template` of the chart, as objects."""
    argv = [str(ensure_binary("helm")), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
            "--kube-version", "v1.37.2", *args]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def wait_crd_established(lab: Lab, name: str = "trainingjobs.kubetrain.io", timeout: float = 60) -> None:
    """Polled, not `kubectl wait`: right after a create, that fails at once on a CRD without conditions yet."""
    def established() -> bool:
        crd = lab.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = crd.get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
    wait_for(established, timeout, f"the CRD {name} to be established", interval=0.2)


IDENTITY_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                  "FlowSchema", "PriorityLevelConfiguration"}


def install_identity(lab: Lab, *helm_args: str) -> tuple[str, Path]:
    """Apply the chart's ServiceAccount, its RBAC and its API priority level; return the account's name and a
    token kubeconfig."""
    try:
        lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": OPERATOR_NAMESPACE}})
    except ApiError as error:
        if error.status != 409:
            raise
    objects = [o for o in render_chart(*helm_args) if o["kind"] in IDENTITY_KINDS]
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    account = next(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    lab.wait_service_account(OPERATOR_NAMESPACE, account)
    return account, lab.token_kubeconfig(OPERATOR_NAMESPACE, account)


def operator_requests(lab: Lab, flow_schema: str = RELEASE) -> int:
    """Requests the API server has run for the operator so far: the chart's FlowSchema matches only the operator's
    ServiceAccount, and the API server counts what each schema dispatched (its /metrics)."""
    text = lab.api.session.get(lab.api.server + "/metrics", verify=lab.api.verify, timeout=30).text
    return round(sum(float(match["count"]) for match in DISPATCHED.finditer(text)
                     if f'flow_schema="{flow_schema}"' in match["labels"]))
