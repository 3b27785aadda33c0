"""A real Prometheus discovers the lab's pods through the apiserver and scrapes them on the bridge."""

from __future__ import annotations

import textwrap

import pytest

from tests.lab.lab import Lab
from tests.lab.pods import pod_manifest, wait_pod
from tests.lab.prometheus import start_prometheus

pytestmark = pytest.mark.lab

EXPORTER = textwrap.dedent("""
    import http.server
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
            self.wfile.write(b"lab_answer 42\\n")
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("0.0.0.0", 9400), Handler).serve_forever()
""")


def test_prometheus_scrapes_a_pod_metrics_port(lab: Lab, namespace: str) -> None:
    manifest = pod_manifest("exporter", ["python"], ["-c", EXPORTER], labels={"app": "exporter"})
    manifest["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": 9400}]
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    wait_pod(lab.api, namespace, "exporter", ("Running",))
    rule = {"name": "lab", "rules": [{"record": "lab:answer:doubled", "expr": "lab_answer * 2"}]}
    with start_prometheus(lab, rules=[rule]) as prometheus:
        result = prometheus.wait_for(f'lab_answer{{namespace="{namespace}", pod="exporter"}}', timeout=120)
        assert result[0]["value"][1] == "42"
        assert result[0]["metric"]["app"] == "exporter"
        doubled = prometheus.wait_for(f'lab:answer:doubled{{namespace="{namespace}"}}', timeout=30)
        assert doubled[0]["value"][1] == "84"
