"""Least privilege, exactly: the chart grants the operator what its code calls, derived from the code.

tests/operator_rights.py derives the rights (an AST scan of the handlers' calls into kube.Kube and of the
client methods those name, plus kopf's own needs from its registry); the rendered chart must grant exactly
those. tests/test_handlers.py checks the scan against the calls a recording client sees.
Needs the lab's helm (no cluster).
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from kubetrain.core import api
from tests.operator_rights import (
    OPERATOR,
    client_methods_used,
    client_rule,
    cluster_rules,
    handler_kube_calls,
    kopf_rules,
    operator_rules,
)
from tests.test_chart_support import CHART, find, one, render

NAMESPACED = CHART / "ci" / "namespaced-values.yaml"


def rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_scan_finds_the_operators_calls() -> None:
    # A scan that found nothing would make any chart look right: these calls are known to exist.
    assert {"get_job", "patch_job_status", "create", "delete_pod", "list_pods", "watch_pods"} <= handler_kube_calls()
    assert {"create_namespaced_pod", "patch_namespaced_custom_object_status",
            "watch_namespaced_pod"} <= client_methods_used()
    assert {(api.GROUP, f"{api.PLURAL}/status", "patch"), ("", "pods", "watch")} <= operator_rules()
    assert {(api.GROUP, api.PLURAL, "watch"), ("", "events", "create")} <= kopf_rules()


@pytest.mark.parametrize(("method", "rule"), [
    ("read_namespaced_pod", ("", "pods", "get")),
    ("replace_namespaced_custom_object_status", (api.GROUP, f"{api.PLURAL}/status", "update")),
    ("list_namespaced_service", ("", "services", "list")),
    ("patch_namespaced_workload_status", ("kueue.x-k8s.io", "workloads/status", "patch")),
    ("read_resource_flavor", ("kueue.x-k8s.io", "resourceflavors", "get")),
])
def test_client_methods_map_to_rbac_rules(method: str, rule: tuple[str, str, str]) -> None:
    assert client_rule(method) == rule


def test_an_unknown_client_method_must_be_mapped() -> None:
    with pytest.raises(ValueError, match="map the client method"):
        client_rule("create_namespaced_secret")


def test_only_kube_py_talks_to_the_api_in_the_operator() -> None:
    """The scan covers kube.py's client calls; any other module of the operator process calling the API
    directly would escape it."""
    operator_process = [path for floor in ("core", "k8s", "controller") for path in (OPERATOR / floor).glob("*.py")]
    assert len(operator_process) > 20
    for path in operator_process:
        name = path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] == "kubernetes" for m in modules), name


def test_cluster_wide_role_grants_exactly_what_the_code_calls() -> None:
    granted = rules(one(render(), "ClusterRole"))
    expected = operator_rules() | cluster_rules()
    assert granted - expected == set(), "granted but never called"
    assert expected - granted == set(), "called but not granted"


def test_namespaced_roles_grant_exactly_what_the_code_calls() -> None:
    docs = render((NAMESPACED,))
    for role in find(docs, "Role"):
        assert rules(role) == operator_rules(), role["metadata"]["namespace"]
    assert rules(one(docs, "ClusterRole")) == cluster_rules()
