"""The Helm chart: lint, the render matrix (ci/*-values.yaml), RBAC, the Deployment, the monitors.

Needs the lab's helm (``tests.lab.build.ensure_binary("helm")``); no cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kubetrain.core.api import DEFAULT_TRAINER_IMAGE, GROUP, LABEL, PLURAL
from tests.operator_rights import cluster_rules, operator_rules
from tests.test_chart_support import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    ROOT,
    find,
    helm,
    kube_version,
    one,
    render,
    template_args,
)

CI_IDS = [path.name.removesuffix("-values.yaml") for path in CI_VALUES]
MONITORING = CHART / "ci" / "monitoring-values.yaml"
NAMESPACED = CHART / "ci" / "namespaced-values.yaml"
CUSTOM_IMAGE = CHART / "ci" / "custom-image-values.yaml"

# What the operator does in the API, derived from its code (tests/operator_rights.py): (apiGroup, resource, verb).
JOB_RULES = operator_rules()
STANDARD_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
CLUSTER_SCOPED_KINDS = ("ClusterRole", "ClusterRoleBinding", "FlowSchema", "PriorityLevelConfiguration")


def rule_set(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


# --- metadata and files -----------------------------------------------------------------------------------


def test_chart_metadata_follows_the_project_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "kubetrain"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"])
    assert chart["appVersion"] == project["version"]
    assert chart["kubeVersion"].startswith(">=")


def test_chart_crd_is_a_link_to_the_top_level_crd() -> None:
    """One CRD file: the chart's is a relative link to it (Helm follows it; `helm package` stores the contents)."""
    top_level = ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml"
    in_chart = CHART / "crds" / top_level.name
    assert top_level.is_file() and not top_level.is_symlink(), f"{top_level} must be the one real file"
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [top_level.name]
    assert in_chart.is_symlink() and in_chart.resolve() == top_level.resolve(), (
        f"{in_chart} must link to {top_level}: ln -sf ../../../crds/{top_level.name} {in_chart.relative_to(ROOT)}"
    )
    assert not Path(in_chart.readlink()).is_absolute(), "an absolute link breaks in any other checkout"


def test_chart_renders_the_linked_crd() -> None:
    rendered = helm(*template_args(), "--include-crds").stdout
    crds = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "CustomResourceDefinition"]
    assert crds == [yaml.safe_load((ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml").read_text())]


def test_every_value_is_documented() -> None:
    """Each key of an object the chart owns has a `# --` comment above it (helm-docs style)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    undocumented = []
    stack: list[tuple[int, str]] = []
    lines = (CHART / "values.yaml").read_text().splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z_][\w.-]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = [name for _, name in stack]
        stack.append((indent, key))
        node = schema
        for name in parent:
            node = node.get("properties", {}).get(name, {})
        if "properties" not in node:  # inside a pass-through object (resources, securityContext...)
            continue
        previous = number - 1
        while previous >= 0 and lines[previous].strip().startswith("#") and "# --" not in lines[previous]:
            previous -= 1
        if previous < 0 or not lines[previous].strip().startswith("# --"):
            undocumented.append(".".join([*parent, key]))
    assert undocumented == []


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_ci_values_and_defaults_satisfy_the_schema(values: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load(values.read_text()) or {})


# --- lint and render matrix ---------------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_helm_lint_strict_is_clean(values: Path) -> None:
    result = helm(
        "lint",
        "--strict",
        str(CHART),
        "-f",
        str(values),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kube_version(),
    )
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_every_object_renders_with_standard_labels_and_valid_names(values: Path) -> None:
    docs = render((values,))
    assert docs, "nothing rendered"
    for doc in docs:
        meta = doc["metadata"]
        where = f"{doc['kind']}/{meta.get('name')}"
        assert doc["apiVersion"] and meta["name"], where
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63, where
        for label in STANDARD_LABELS:
            assert meta["labels"].get(label), f"{where} lacks label {label}"
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE
        if doc["kind"] not in CLUSTER_SCOPED_KINDS:
            assert meta.get("namespace"), f"{where} has no namespace"


@pytest.mark.parametrize("values", [MONITORING, NAMESPACED], ids=["monitoring", "namespaced"])
def test_long_release_names_keep_names_within_63_characters(values: Path) -> None:
    release = "a-very-long-release-name-that-uses-all-53-characters"[:53]
    docs = render((values,), release=release)
    for doc in docs:
        name = doc["metadata"]["name"]
        assert len(name) <= 63 and not name.endswith("-"), name
        assert name.startswith(release[:40]), name


def test_defaults_create_no_monitoring_objects() -> None:
    docs = render()
    assert {doc["kind"] for doc in docs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
        "FlowSchema",
        "PriorityLevelConfiguration",
    }


def test_monitoring_values_create_every_monitoring_object_with_the_release_label() -> None:
    docs = render((MONITORING,))
    dashboards = [doc for doc in find(docs, "ConfigMap") if doc["metadata"]["labels"].get("grafana_dashboard")]
    assert len(dashboards) == 2
    for doc in [*(one(docs, kind) for kind in MONITORING_KINDS), *dashboards]:
        labels = doc["metadata"]["labels"]
        assert labels["release"] == "prometheus", doc["kind"]
        assert labels["team"] == "ml-platform", doc["kind"]
    for doc in dashboards:
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["metadata"]["annotations"] == {"grafana_folder": "Training"}


def test_release_label_can_be_removed() -> None:
    docs = render((MONITORING,), sets=("monitoring.release=",))
    for kind in MONITORING_KINDS:
        assert "release" not in one(docs, kind)["metadata"]["labels"]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (("dashboards.enabled=true",), {"training-job", "operator"}),
        (("dashboards.enabled=true", "dashboards.operator=false"), {"training-job"}),
        (("dashboards.enabled=true", "dashboards.trainingJob=false"), {"operator"}),
        (("dashboards.enabled=false",), set()),
    ],
)
def test_each_dashboard_can_be_switched(sets: tuple[str, ...], expected: set[str]) -> None:
    names = {doc["metadata"]["name"] for doc in find(render(sets=sets), "ConfigMap")}
    assert names == {f"{RELEASE}-dashboard-{key}" for key in expected}


# --- the operator Deployment ----------------------------------------------------------------------------


def test_operator_runs_one_replica_with_recreate() -> None:
    spec = one(render(), "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


def test_selector_labels_are_minimal_and_match_the_pod() -> None:
    deployment = one(render(), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "kubetrain", "app.kubernetes.io/instance": RELEASE}
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_operator_pod_meets_the_restricted_pod_security_profile() -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]
        assert context["readOnlyRootFilesystem"] is True
        assert "privileged" not in context
    assert not any("hostPath" in volume for volume in pod.get("volumes", []))
    assert not pod.get("hostNetwork") and not pod.get("hostPID")


def test_ports_reach_both_the_pod_spec_and_the_operator() -> None:
    container = operator_container(render(sets=("operator.metricsPort=9090", "operator.healthPort=9091")))
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {"metrics": 9090, "health": 9091}
    assert "--metrics-port=9090" in container["args"]
    assert "--liveness=http://0.0.0.0:9091/healthz" in container["args"]


def test_operator_serves_metrics_and_liveness_on_named_ports() -> None:
    container = operator_container(render())
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_cluster_wide_mode_watches_all_namespaces() -> None:
    assert operator_container(render())["args"] == [
        "operator",
        "--all-namespaces",
        "--metrics-port=8080",
        "--liveness=http://0.0.0.0:8081/healthz",
        "--log-level=normal",
        "--log-format=plain",
        f"--trainer-image={DEFAULT_TRAINER_IMAGE}",
        "--gang-scheduling=auto",
        "--api-connections=16",
        "--looks-per-second=200",
    ]


def test_namespaced_mode_watches_only_the_listed_namespaces() -> None:
    args = operator_container(render((NAMESPACED,)))["args"]
    assert args[:3] == ["operator", "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args and "--log-level=verbose" in args


def test_custom_image_values_reach_the_pod() -> None:
    docs = render((CUSTOM_IMAGE,))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert container["image"] == (
        "registry.example.com:5000/kubetrain/operator:0.1.0-rc.1@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    assert container["imagePullPolicy"] == "Always"
    assert "--trainer-image=registry.example.com:5000/kubetrain/trainer:0.1.0-rc.1@sha256:" \
        "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210" in container["args"]
    assert "--log-format=json" in container["args"]
    assert "--gang-scheduling=on" in container["args"]
    assert container["args"][0] == "operator" and container["args"][-1] == "--progress-interval=30"
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"} in container["env"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "ml-operator"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert find(docs, "ServiceAccount") == []
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ml-operator", "namespace": NAMESPACE}]


def test_image_tag_defaults_to_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    container = operator_container(render())
    assert container["image"] == f"kubetrain/operator:{chart['appVersion']}"
    assert f"--trainer-image=kubetrain/trainer:{chart['appVersion']}" in container["args"]


def test_trainer_image_tag_and_digest_reach_the_operator() -> None:
    digest = "sha256:" + "ab" * 32
    args = operator_container(render(sets=("trainer.image.repository=registry.example.com/kubetrain/trainer",
                                            "trainer.image.tag=v7", f"trainer.image.digest={digest}")))["args"]
    assert f"--trainer-image=registry.example.com/kubetrain/trainer:v7@{digest}" in args


# --- RBAC ---------------------------------------------------------------------------------------------------


def test_cluster_wide_rbac_grants_exactly_what_the_operator_does() -> None:
    docs = render()
    role = one(docs, "ClusterRole")
    assert rule_set(role) == JOB_RULES | cluster_rules()
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_namespaced_rbac_grants_job_rights_only_in_watched_namespaces() -> None:
    docs = render((NAMESPACED,))
    roles = find(docs, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rule_set(role) == JOB_RULES
    bindings = find(docs, "RoleBinding")
    assert sorted(binding["metadata"]["namespace"] for binding in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    # Cluster-wide, only CRD discovery and reads of cluster-scoped Kueue flavors and PriorityClasses: no
    # namespaces, no pods, no TrainingJobs elsewhere.
    assert rule_set(one(docs, "ClusterRole")) == cluster_rules()
    assert one(docs, "ClusterRoleBinding")["roleRef"]["kind"] == "ClusterRole"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_no_role_can_read_secrets_or_use_wildcards(values: Path) -> None:
    for doc in render((values,)):
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for group, resource, verb in rule_set(doc):
            assert "*" not in (group, resource, verb), doc["metadata"]["name"]
            assert resource not in ("secrets", "configmaps", "serviceaccounts/token"), resource
            assert verb not in ("escalate", "bind", "impersonate"), verb


def test_rbac_can_be_left_to_the_cluster_admin() -> None:
    kinds = {doc["kind"] for doc in render(sets=("rbac.create=false",))}
    assert kinds.isdisjoint({"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})


# --- API Priority and Fairness ---------------------------------------------------------------------------
@pytest.mark.parametrize("sets", [(), ("serviceAccount.create=false", "serviceAccount.name=platform-operator")],
                         ids=["chart-account", "own-account"])
def test_flow_schema_puts_the_operators_account_in_a_level_of_its_own(sets: tuple[str, ...]) -> None:
    docs = render(sets=sets)
    schema, level = one(docs, "FlowSchema"), one(docs, "PriorityLevelConfiguration")
    account = operator_container_account(docs)
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": NAMESPACE}}]
    assert rule["resourceRules"][0]["namespaces"] == ["*"] and rule["resourceRules"][0]["clusterScope"] is True
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    # before the default service-accounts schema (9000), which the operator's requests would otherwise match
    assert schema["spec"]["matchingPrecedence"] < 9000
    limited = level["spec"]["limited"]
    assert limited["limitResponse"]["type"] == "Queue" and limited["nominalConcurrencyShares"] == 30


def operator_container_account(docs: list[dict[str, Any]]) -> str:
    name: str = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    return name


def test_priority_and_fairness_objects_can_be_left_out() -> None:
    kinds = {doc["kind"] for doc in render(sets=("apiPriorityAndFairness.enabled=false",))}
    assert kinds.isdisjoint({"FlowSchema", "PriorityLevelConfiguration"})


# --- Service and monitors -------------------------------------------------------------------------------


def test_metrics_service_selects_the_operator_and_its_metrics_port() -> None:
    docs = render()
    service = one(docs, "Service")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]


def test_service_monitor_scrapes_the_metrics_service() -> None:
    docs = render((MONITORING,))
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [(e["port"], e["path"], e["interval"]) for e in monitor["spec"]["endpoints"]] == [
        ("metrics", "/metrics", "30s")
    ]


@pytest.mark.parametrize("arg", ["--namespace=team-a", "-n", "--all-namespaces", "-A"])
def test_extra_args_cannot_name_the_watched_namespaces(arg: str) -> None:
    result = helm(*template_args(sets=(f"operator.extraArgs[0]={arg}",)), check=False)
    assert result.returncode != 0, f"extraArgs {arg} was accepted"
    assert "extraArgs" in result.stderr


def test_service_monitor_needs_the_service() -> None:
    result = helm(*template_args(sets=("serviceMonitor.enabled=true", "service.enabled=false")), check=False)
    assert result.returncode != 0
    assert "serviceMonitor.enabled needs service.enabled" in result.stderr


def _prometheus_label(key: str) -> str:
    """The name Prometheus gives a pod label in service discovery (non-alphanumerics become _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _relabel(relabelings: list[dict[str, Any]], target: str) -> dict[str, Any]:
    matches = [r for r in relabelings if r.get("targetLabel") == target]
    assert len(matches) == 1, f"one relabeling to {target} expected"
    return matches[0]


def test_pod_monitor_selects_trainer_pods_in_every_namespace() -> None:
    spec = one(render((MONITORING,)), "PodMonitor")["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["selector"] == {"matchExpressions": [{"key": LABEL.JOB_NAME, "operator": "Exists"}]}


def test_pod_monitor_follows_the_watched_namespaces() -> None:
    spec = one(render((NAMESPACED,)), "PodMonitor")["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


@pytest.mark.parametrize(
    ("port_name", "kept"),
    [
        ("metrics", True),
        ("metrics-1", True),
        ("metrics-15", True),
        ("metrics-", False),
        ("metrics-a", False),
        ("metricsx", False),
        ("my-metrics", False),
        ("rendezvous", False),
        ("", False),
    ],
)
def test_pod_monitor_keeps_only_the_per_rank_metrics_ports(port_name: str, kept: bool) -> None:
    endpoints = one(render((MONITORING,)), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 1 and "port" not in endpoints[0], "every declared port must become a target"
    keeps = [
        r
        for r in endpoints[0]["relabelings"]
        if r.get("action") == "keep" and r["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"]
    ]
    assert len(keeps) == 1
    # Prometheus anchors relabel regexes at both ends: fullmatch.
    assert bool(re.fullmatch(keeps[0]["regex"], port_name)) is kept


def test_pod_monitor_labels_targets_with_the_training_job() -> None:
    endpoint = one(render((MONITORING,)), "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    relabelings = endpoint["relabelings"]
    assert _relabel(relabelings, "training_job")["sourceLabels"] == [_prometheus_label(LABEL.JOB_NAME)]
    assert _relabel(relabelings, "node_index")["sourceLabels"] == [_prometheus_label(LABEL.NODE_INDEX)]
    # No attempt label: it made new series at every gang restart (the attempt is in the job's status).
    assert not [r for r in relabelings if r.get("targetLabel") == "attempt"]
    assert _relabel(relabelings, "namespace")["sourceLabels"] == ["__meta_kubernetes_namespace"]
    assert _relabel(relabelings, "pod")["sourceLabels"] == ["__meta_kubernetes_pod_name"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "10s"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"


# --- the schema rejects bad values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "mentions"),
    [
        ("unknownKey=1", "unknownKey"),
        ("image.tagg=1.0", "tagg"),
        ("podMonitor.enable=true", "enable"),
        ("prometheusRule.alerts.TrainingJobStaled.enabled=false", "TrainingJobStaled"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("image.digest=latest", "digest"),
        ("watchNamespaces[0]=Team_A", "watchNamespaces"),
        ("operator.logLevel=loud", "logLevel"),
        ("operator.logFormat=xml", "logFormat"),
        ("trainer.image.repository=kubetrain/trainer:0.1.0", "repository"),
        ("trainer.image.tag=a b", "tag"),
        ("trainer.image.digest=latest", "digest"),
        ("trainer.imag.tag=1", "imag"),
        ("operator.metricsPort=70000", "metricsPort"),
        ("serviceMonitor.interval=fast", "interval"),
        ("prometheusRule.alerts.GPUMemoryNearFull.threshold=2", "threshold"),
        ("prometheusRule.alerts.TrainingJobStalled.severity=page", "severity"),
        ("prometheusRule.alerts.TrainingJobStalled.for=5", "for"),
    ],
)
def test_schema_rejects_bad_values(bad: str, mentions: str) -> None:
    result = helm(*template_args(sets=(bad,)), check=False)
    assert result.returncode != 0, f"--set {bad} was accepted"
    assert "schema" in result.stderr.lower() and mentions in result.stderr, result.stderr


def test_notes_teach_the_next_commands(tmp_path: Path) -> None:
    # `helm template` skips NOTES.txt and `helm install --dry-run` wants a cluster: render NOTES.txt through
    # `tpl` from a scratch template in a copy of the chart.
    chart = shutil.copytree(CHART, tmp_path / "kubetrain")
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text('notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n')
    args = template_args((NAMESPACED,))
    args[2] = str(chart)
    notes = yaml.safe_load(helm(*args, "--show-only", "templates/notes-under-test.yaml").stdout)["notes"]
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes
    assert "kubectl -n team-a apply -f trainingjob.yaml" in notes
    assert "kubectl -n team-a get trainingjobs" in notes
    assert "kubectl -n team-a describe tj" in notes
    assert "kubectl apply --server-side" in notes  # the CRD upgrade step
    assert f"Jobs that leave spec.image unset run {DEFAULT_TRAINER_IMAGE}." in notes
