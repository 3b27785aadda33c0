"""The chart's monitoring objects, made real for the lab's Prometheus.

No prometheus-operator runs here, so this module plays its part faithfully enough to test the chart:

- ``MONITORING_CRDS`` registers the monitoring.coreos.com kinds, so `helm install` can create the
  chart's PodMonitor, ServiceMonitor and PrometheusRule as it would in a real cluster;
- ``pod_monitor_job`` translates a PodMonitor into the scrape job prometheus-operator would generate
  over the lab Prometheus' Kubernetes-SD targets file: the selector and namespace selector as keep
  rules, then the endpoint's own relabelings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.lab.prometheus import label_name

Json = Any


def _crd(kind: str, plural: str) -> Json:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }}}],
        },
    }


MONITORING_CRDS = [_crd("PodMonitor", "podmonitors"), _crd("ServiceMonitor", "servicemonitors"),
                   _crd("PrometheusRule", "prometheusrules")]


_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
                 "action": "action", "replacement": "replacement", "separator": "separator",
                 "modulus": "modulus"}


def _relabeling(rule: Mapping[str, Json]) -> Json:
    return {_RELABEL_KEYS[key]: value for key, value in rule.items() if key in _RELABEL_KEYS}


def pod_monitor_job(monitor: Json, sd_file: Path) -> list[Json]:
    """The scrape jobs prometheus-operator generates for a PodMonitor (one per endpoint)."""
    spec = monitor["spec"]
    keep: list[Json] = []
    namespaces = spec.get("namespaceSelector", {})
    if not namespaces.get("any"):
        names = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
        keep.append({"source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(names), "action": "keep"})
    selector = spec.get("selector", {})
    for key, value in (selector.get("matchLabels") or {}).items():
        keep.append({"source_labels": [f"__meta_kubernetes_pod_label_{label_name(key)}"], "regex": value,
                     "action": "keep"})
    for expression in selector.get("matchExpressions") or []:
        present = f"__meta_kubernetes_pod_labelpresent_{label_name(expression['key'])}"
        value = f"__meta_kubernetes_pod_label_{label_name(expression['key'])}"
        match expression["operator"]:
            case "Exists":
                keep.append({"source_labels": [present], "regex": "true", "action": "keep"})
            case "DoesNotExist":
                keep.append({"source_labels": [present], "regex": "true", "action": "drop"})
            case "In":
                keep.append({"source_labels": [value], "regex": "|".join(expression["values"]), "action": "keep"})
            case "NotIn":
                keep.append({"source_labels": [value], "regex": "|".join(expression["values"]), "action": "drop"})
    jobs = []
    for number, endpoint in enumerate(spec["podMetricsEndpoints"]):
        rules = list(keep)
        if "port" in endpoint:
            rules.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"],
                          "action": "keep"})
        rules += [_relabeling(r) for r in endpoint.get("relabelings", [])]
        job: Json = {
            "job_name": f"podMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/{number}",
            "metrics_path": endpoint.get("path", "/metrics"),
            "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
            "relabel_configs": rules,
        }
        if endpoint.get("interval"):
            job["scrape_interval"] = endpoint["interval"]
        jobs.append(job)
    return jobs


def service_monitor_job(monitor: Json, address: str) -> Json:
    """The ServiceMonitor's endpoint, pointed at the operator process that stands in for its pod."""
    endpoint = monitor["spec"]["endpoints"][0]
    job: Json = {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [{"targets": [address], "labels": {"namespace": monitor["metadata"]["namespace"]}}],
    }
    if endpoint.get("interval"):
        job["scrape_interval"] = endpoint["interval"]
    return job
