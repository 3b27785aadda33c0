"""The chart's monitoring objects, made real for the lab's Prometheus.

No prometheus-operator runs here and Debian's Prometheus is built without Kubernetes service
discovery, so this module plays both parts faithfully enough to test the chart's definitions:

- ``MONITORING_CRDS`` registers the monitoring.coreos.com kinds, so `helm install` can create the
  chart's PodMonitor, ServiceMonitor and PrometheusRule as it would in a real cluster;
- ``PodDiscovery`` writes a file_sd file with the ``__meta_kubernetes_pod_*`` labels that Kubernetes
  service discovery (role: pod) gives every container port;
- ``pod_monitor_job`` translates a PodMonitor into the scrape job prometheus-operator would generate:
  the selector and namespace selector as keep rules, then the endpoint's own relabelings.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from tests.lab.lab import Lab
from tests.lab.rest import ApiError

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


def label_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_meta_targets(pods: list[Json]) -> list[Json]:
    """file_sd groups: one per container port of every pod with an IP, with Kubernetes SD's meta labels."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status", {})
        if not status.get("podIP"):
            continue
        common = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ip": status["podIP"],
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
        }
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{label_name(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{label_name(key)}"] = "true"
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                labels = common | {
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                }
                groups.append({"targets": [f"{status['podIP']}:{port['containerPort']}"], "labels": labels})
    return groups


class PodDiscovery:
    """Keeps a file_sd file of every pod's ports up to date (Kubernetes SD, role pod)."""

    def __init__(self, lab: Lab, path: Path) -> None:
        self.lab = lab
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        self._write([])

    def _write(self, groups: list[Json]) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(groups))
        os.replace(temporary, self.path)  # never let Prometheus read a half-written file

    def _run(self) -> None:
        api = self.lab.admin_rest()
        while not self._stop.wait(1.0):
            try:
                self._write(pod_meta_targets(api.get("/api/v1/pods")["items"]))
            except (ApiError, requests.RequestException):
                continue  # the next round will do (e.g. the API server is busy)

    def start(self) -> PodDiscovery:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


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
