"""A real Prometheus (Debian's package) scraping the lab's pods.

Debian builds Prometheus without Kubernetes service discovery, so the helper plays that part: a thread
lists the lab's pods every second and writes a ``file_sd`` target file with every running pod's container
ports named ``metrics`` (labels ``namespace``, ``pod`` and the pod's labels, like a ``labelmap`` of
Kubernetes SD). Prometheus runs in the root network namespace, which holds the lab's bridge, so pod IPs are
reachable. Pass ``scrape_configs`` to add jobs of your own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from types import TracebackType
from typing import Any

import requests
import yaml

from tests.lab.lab import Lab
from tests.lab.procs import ManagedProcess, free_port, wait_for
from tests.lab.rest import JSON, ApiError

PROMETHEUS = "prometheus"
DISCOVERY_INTERVAL_S = 1.0
log = logging.getLogger(__name__)


def _label_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: list[JSON], port_name: str = "metrics") -> list[JSON]:
    """file_sd target groups for the running pods' container ports called ``port_name``."""
    groups = []
    for pod in pods:
        status = pod.get("status", {})
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") != port_name:
                    continue
                meta = pod["metadata"]
                labels = {_label_name(k): v for k, v in (meta.get("labels") or {}).items()}
                labels.update(namespace=meta["namespace"], pod=meta["name"], container=container["name"])
                groups.append({"targets": [f"{status['podIP']}:{port['containerPort']}"], "labels": labels})
    return groups


class Prometheus:
    def __init__(self, lab: Lab, scrape_configs: list[dict[str, Any]] | None = None, *,
                 rules: str | list[dict[str, Any]] | None = None, scrape_interval: str = "1s",
                 port_name: str = "metrics") -> None:
        binary = shutil.which(PROMETHEUS)
        if binary is None:
            raise FileNotFoundError("prometheus not found: apt-get install -y prometheus")
        self.lab = lab
        self.port_name = port_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = lab.run_dir / f"prometheus-{self.port}"
        self.dir.mkdir(parents=True)
        self.targets_file = self.dir / "pods.json"
        self._write_targets([])
        pods_job = {"job_name": "pods", "file_sd_configs": [{"files": [str(self.targets_file)],
                                                              "refresh_interval": "1s"}]}
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [pods_job, *(scrape_configs or [])],
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
                groups = pod_targets(api.get("/api/v1/pods")["items"], self.port_name)
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
    lab: Lab, scrape_configs: list[dict[str, Any]] | None = None, *,
    rules: str | list[dict[str, Any]] | None = None, scrape_interval: str = "1s", port_name: str = "metrics",
) -> Prometheus:
    """Start Prometheus against the lab; use as ``with start_prometheus(lab) as prom:`` so it always stops."""
    return Prometheus(lab, scrape_configs, rules=rules, scrape_interval=scrape_interval,
                      port_name=port_name).start()


__all__ = ["Prometheus", "pod_targets", "start_prometheus"]
