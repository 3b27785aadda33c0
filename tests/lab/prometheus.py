"""A real Prometheus (Debian's package) scraping the lab's pods.

Debian builds Prometheus without Kubernetes service discovery, so the helper plays that part: a thread
lists the lab's pods every second and writes a ``file_sd`` file (``targets_file``) with one target per
container port of every pod that has an IP, carrying the ``__meta_kubernetes_pod_*`` labels of Kubernetes SD
(role: pod). Its own ``pods`` job relabels them like a ``labelmap`` (pod labels, ``namespace``, ``pod``,
``container``) and keeps the running pods' ports named ``port_name``; other jobs (a PodMonitor translated by
the tests) can use the same file with their own relabelings. Prometheus runs in the root network namespace,
which holds the lab's bridge, so pod IPs are reachable.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import requests
import yaml

from kubetrain.cli.ports import free_port
from tests.lab.lab import Lab
from tests.lab.procs import ManagedProcess, wait_for
from tests.lab.rest import JSON, ApiError

PROMETHEUS = "prometheus"
# Extra scrape jobs, or a function of the Kubernetes-SD targets file that returns them.
ScrapeConfigs = list[dict[str, Any]] | Callable[[Path], list[dict[str, Any]]] | None
DISCOVERY_INTERVAL_S = 1.0
log = logging.getLogger(__name__)


def label_name(name: str) -> str:
    """A Kubernetes label key as Prometheus spells it in meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: list[JSON]) -> list[JSON]:
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


def _pods_job(targets_file: Path, port_name: str) -> dict[str, Any]:
    """The helper's own job: running pods' ports named ``port_name``, labelled like a labelmap."""
    meta = "__meta_kubernetes_"
    return {
        "job_name": "pods",
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        "relabel_configs": [
            {"source_labels": [f"{meta}pod_container_port_name"], "regex": re.escape(port_name), "action": "keep"},
            {"source_labels": [f"{meta}pod_phase"], "regex": "Running", "action": "keep"},
            {"regex": f"{meta}pod_label_(.+)", "action": "labelmap"},
            {"source_labels": [f"{meta}namespace"], "target_label": "namespace"},
            {"source_labels": [f"{meta}pod_name"], "target_label": "pod"},
            {"source_labels": [f"{meta}pod_container_name"], "target_label": "container"},
        ],
    }


class Prometheus:
    def __init__(self, lab: Lab, scrape_configs: ScrapeConfigs = None, *,
                 rules: str | list[dict[str, Any]] | None = None, scrape_interval: str = "1s",
                 port_name: str = "metrics") -> None:
        binary = shutil.which(PROMETHEUS)
        if binary is None:
            raise FileNotFoundError("prometheus not found: apt-get install -y prometheus")
        self.lab = lab
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = lab.run_dir / f"prometheus-{self.port}"
        self.dir.mkdir(parents=True)
        self.targets_file = self.dir / "pods.json"
        self._write_targets([])
        extra_jobs = scrape_configs(self.targets_file) if callable(scrape_configs) else scrape_configs or []
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [_pods_job(self.targets_file, port_name), *extra_jobs],
        }
        if rules is not None:
            rules_file = self.dir / "rules.yml"
            rules_file.write_text(rules if isinstance(rules, str) else yaml.safe_dump({"groups": rules}))
            config["rule_files"] = [str(rules_file)]
        config_file = self.dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.process = ManagedProcess("prometheus", [
            binary, f"--config.file={config_file}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
        ], self.dir / "prometheus.log")
        self._stopping = threading.Event()
        self._discovery = threading.Thread(target=self._discover, name="lab-prometheus-sd", daemon=True)

    def _write_targets(self, groups: list[JSON]) -> None:
        temporary = self.targets_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(groups))
        os.replace(temporary, self.targets_file)  # Prometheus must never read a half-written file

    def _discover(self) -> None:
        api = self.lab.admin_rest()
        previous: list[JSON] | None = None
        while not self._stopping.wait(DISCOVERY_INTERVAL_S):
            try:
                groups = pod_targets(api.get("/api/v1/pods")["items"])
            except (ApiError, requests.RequestException) as error:
                log.warning("prometheus discovery: %s", error)  # e.g. during an apiserver restart
                continue
            if groups != previous:
                self._write_targets(groups)
                previous = groups

    def start(self) -> Prometheus:
        self.process.start()
        self._discovery.start()
        try:
            wait_for(self._ready, 60, "prometheus /-/ready", interval=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        self.process.check_alive()
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; returns the result vector (each item has `metric` and `value`)."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        return list(response.json()["data"]["result"])

    def wait_for(self, promql: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Poll until the query returns something."""
        deadline = time.monotonic() + timeout
        while not (result := self.query(promql)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result for {promql!r} after {timeout} s")
            time.sleep(0.5)
        return result

    def targets(self) -> list[dict[str, Any]]:
        response = requests.get(f"{self.url}/api/v1/targets", timeout=10)
        response.raise_for_status()
        return list(response.json()["data"]["activeTargets"])

    def stop(self) -> None:
        self._stopping.set()
        if self._discovery.is_alive():
            self._discovery.join(timeout=10)
        self.process.stop()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_prometheus(
    lab: Lab, scrape_configs: ScrapeConfigs = None, *,
    rules: str | list[dict[str, Any]] | None = None, scrape_interval: str = "1s", port_name: str = "metrics",
) -> Prometheus:
    """Start Prometheus against the lab; use as ``with start_prometheus(lab) as prom:`` so it always stops."""
    return Prometheus(lab, scrape_configs, rules=rules, scrape_interval=scrape_interval,
                      port_name=port_name).start()


__all__ = ["Prometheus", "label_name", "pod_targets", "start_prometheus"]
