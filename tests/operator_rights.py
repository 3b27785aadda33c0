"""The API rights the operator uses, derived from its code (this module holds no tests; see test_rbac.py).

- Its own calls: the handlers and the pod watch call methods of ``kube.Kube``; each of those names Kubernetes
  client methods
  (``self._core.create_namespaced_pod``, ...). An AST scan follows them (through Kube's own helpers), so no
  code path is missed, and maps each client method to (apiGroup, resource, verb).
- kopf's calls, as the operator configures it (``kopf.run(standalone=True, ...)`` in operator_main.py, the startup
  handler): list and watch of every resource a handler watches (its registry); create of core/v1 events
  (``kopf.event`` and the events kopf posts for handler logs: kopf posts nothing else, and only with POST);
  list and watch of CustomResourceDefinitions (kopf's resource observer, to notice the CRD change). No
  namespaces: with ``--namespace`` patterns kopf watches jobs cluster-wide and the operator matches them
  (operator_main.namespace_patterns). No peering objects: standalone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kubetrain.core import api
from kubetrain.core.queueing import KUEUE

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = ROOT / "operator" / "kubetrain"

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

# Client method verbs -> RBAC verbs (a watch is a list with watch=true: the pod watch names it watch_...).
VERBS = {"list": "list", "watch": "watch", "read": "get", "get": "get", "create": "create", "patch": "patch",
         "replace": "update", "delete": "delete"}
# The modules that call Kube (as state.kube, kube or self._kube).
KUBE_USERS = ("controller/handlers.py", "controller/companions.py", "controller/queueing.py", "k8s/podwatch.py",
              "k8s/nodewatch.py")
# Client object kinds -> (apiGroup, plural): the core kinds the operator makes, its one custom resource, and Kueue's
# Workloads of the jobs in a Kueue queue, and the positions of those waiting.
KINDS = {"pod": ("", "pods"), "service": ("", "services"), "custom_object": (api.GROUP, api.PLURAL),
         "pod_group": (api.PODGROUP.GROUP, api.PODGROUP.PLURAL), "workload": (KUEUE.GROUP, KUEUE.WORKLOADS),
         "local_queue_pending_workloads": (KUEUE.VISIBILITY_GROUP, f"{KUEUE.LOCAL_QUEUES}/{KUEUE.PENDING_WORKLOADS}")}
# Cluster-scoped kinds it reads (client methods without "namespaced"): what a Kueue admission and priority mean, and
# which nodes are Ready (a failing node is excluded only while the gang still fits) and which announce a disruption.
CLUSTER_KINDS = {"resource_flavor": (KUEUE.GROUP, KUEUE.RESOURCE_FLAVORS),
                 "priority_class": ("scheduling.k8s.io", "priorityclasses"), "node": ("", "nodes")}
CLIENT_METHOD = re.compile(r"^(?P<verb>[a-z]+)_(?P<namespaced>namespaced_)?(?P<kind>[a-z_]+?)(?P<status>_status)?$")
CLIENT_ATTRIBUTES = ("_core", "_custom", "_scheduling", "_priorities", "_kueue")


def client_rule(method: str) -> Rule:
    """The right one Kubernetes client method needs; ValueError for one this table does not know yet."""
    match = CLIENT_METHOD.match(method)
    kinds = KINDS if match is not None and match["namespaced"] else CLUSTER_KINDS
    if match is None or match["verb"] not in VERBS or match["kind"] not in kinds:
        raise ValueError(f"map the client method {method} to its RBAC rule in tests/operator_rights.py")
    group, resource = kinds[match["kind"]]
    return group, resource + ("/status" if match["status"] else ""), VERBS[match["verb"]]


def _tree(name: str) -> ast.Module:
    return ast.parse((OPERATOR / name).read_text())


def _kube_references() -> dict[str, tuple[set[str], set[str]]]:
    """For each method of class Kube: (client methods it names, other Kube methods it uses)."""
    kube = next(node for node in _tree("k8s/kube.py").body if isinstance(node, ast.ClassDef) and node.name == "Kube")
    result: dict[str, tuple[set[str], set[str]]] = {}
    for method in kube.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        client: set[str] = set()
        own: set[str] = set()
        for node in ast.walk(method):
            if not isinstance(node, ast.Attribute):
                continue
            target = node.value
            if isinstance(target, ast.Attribute) and target.attr in CLIENT_ATTRIBUTES:
                client.add(node.attr)
            elif isinstance(target, ast.Name) and target.id == "self" and node.attr not in CLIENT_ATTRIBUTES:
                own.add(node.attr)
        result[method.name] = (client, own)
    return result


def handler_kube_calls() -> set[str]:
    """The Kube methods the handlers and the pod watch use (``state.kube.X``, ``kube.X``, ``self._kube.X``)."""
    names: set[str] = set()
    for node in (node for module in KUBE_USERS for node in ast.walk(_tree(module))):
        if isinstance(node, ast.Attribute):
            target = node.value
            if (isinstance(target, ast.Attribute) and target.attr in ("kube", "_kube")) or (
                isinstance(target, ast.Name) and target.id == "kube"
            ):
                names.add(node.attr)
    return names


def client_methods_used() -> set[str]:
    """Every Kubernetes client method reachable from the handlers' calls of Kube."""
    references = _kube_references()
    unknown = handler_kube_calls() - references.keys()
    assert not unknown, f"handlers call Kube methods that kube.py does not define: {unknown}"
    todo = list(handler_kube_calls())
    seen: set[str] = set()
    methods: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in references:
            continue
        seen.add(name)
        client, own = references[name]
        methods |= client
        todo += own
    return methods


def kopf_rules() -> set[Rule]:
    """What kopf itself reads and writes for the handlers the operator registers (see the module's text)."""
    import kopf

    import kubetrain.controller.handlers  # noqa: F401 - registers the handlers in kopf's default registry

    registry = kopf.get_default_registry()
    # Handlers that keep state on the object (on.create/update/delete, timers, daemons) make kopf patch it and
    # add finalizers: the operator has none (see handlers.py), so it needs no patch on what it watches.
    assert not registry._changing.get_all_handlers() and not registry._spawning.get_all_handlers()
    assert not registry._webhooks.get_all_handlers()
    rules: set[Rule] = set()
    # Event handlers and indexes alike: kopf lists and watches what they serve (indexes hold no state on it).
    for handler in [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers()]:
        selector = handler.selector
        assert selector is not None and isinstance(selector.any_name, str)
        name: str = selector.any_name
        rules |= {(selector.group or "", name, verb) for verb in ("list", "watch")}
    return rules | {("", "events", "create")}


def _namespaced(method: str) -> bool:
    match = CLIENT_METHOD.match(method)
    return match is not None and bool(match["namespaced"])


def operator_rules() -> set[Rule]:
    """Everything the operator does in a namespace it serves: its own calls and kopf's."""
    return {client_rule(method) for method in client_methods_used() if _namespaced(method)} | kopf_rules()


# Cluster-scoped: kopf's resource observer lists and watches CRDs.
DISCOVERY_RULES: set[Rule] = {("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")}


def cluster_rules() -> set[Rule]:
    """What the operator needs cluster-wide in either mode: kopf's CRD discovery and its reads of cluster-scoped
    objects (Kueue's ResourceFlavors, PriorityClasses)."""
    return {client_rule(method) for method in client_methods_used() if not _namespaced(method)} | DISCOVERY_RULES
