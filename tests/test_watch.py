"""`kubetrain watch` keeps following a job across lost watches until the job ends.

The lab test restarts the real API server under a running watch. A 410 Gone cannot be caused on demand
on a real server (it needs etcd compaction past the watcher's resourceVersion), so the protocol test serves
a scripted watch from a small HTTP server: a dropped stream, then 410 Gone, then the job's end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from kubetrain.cli.watch import describe_status
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.procs import wait_for

Json = Any


def job_event(kind: str, version: str, phase: str) -> bytes:
    job = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "j", "namespace": "ns", "resourceVersion": version},
           "status": {"phase": phase, "message": f"{phase} at {version}", "progress": {"step": 1, "totalSteps": 2}}}
    return json.dumps({"type": kind, "object": job}).encode() + b"\n"


GONE = json.dumps({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                               "reason": "Expired", "message": "too old resource version",
                                               "code": 410}}).encode() + b"\n"

# One answer per watch request, in order: the stream ends mid-watch, the resumed watch is too old,
# the fresh watch sees the job end.
SCRIPT = [[job_event("ADDED", "5", "Running")], [GONE],
          [job_event("ADDED", "9", "Running"), job_event("MODIFIED", "10", "Succeeded")]]


class ScriptedWatch(BaseHTTPRequestHandler):
    script: ClassVar[list[list[bytes]]] = SCRIPT
    requests: ClassVar[list[dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        answer = self.script[min(len(self.requests), len(self.script) - 1)]
        self.requests.append(query)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for line in answer:
            self.wfile.write(line)
            self.wfile.flush()
        self.close_connection = True  # the end of the stream, as a dropped connection looks to the client

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted_apiserver(tmp_path: Path) -> Iterator[type[ScriptedWatch]]:
    ScriptedWatch.requests, ScriptedWatch.script = [], SCRIPT
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedWatch)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    yield ScriptedWatch
    server.shutdown()
    server.server_close()


def watch(tmp_path: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """The CLI, in its own process, as a user runs it: its login reads KUBECONFIG."""
    return subprocess.run(
        [sys.executable, "-m", "kubetrain.cli.commands", "watch", "j", "-n", "ns", f"--timeout={timeout}"],
        env={**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig"), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=timeout + 30, check=False)


def test_watch_resumes_from_the_last_version_relists_on_410_and_exits_0_at_the_end(
        scripted_apiserver: type[ScriptedWatch], tmp_path: Path) -> None:
    result = watch(tmp_path, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    versions = [query.get("resourceVersion", [None])[0] for query in scripted_apiserver.requests]
    assert versions == [None, "5", None]  # resumed where it stopped; after 410, from the current state
    assert all(query["fieldSelector"] == ["metadata.name=j"] for query in scripted_apiserver.requests)
    # A stream that ends is resumed silently (servers end watches at their timeout); the 410 is said.
    assert output.count("reconnecting") == 1
    assert "too old resource version" in output
    assert "j: Succeeded" in output


def test_watch_gives_up_with_3_when_its_timeout_passes_first(
        scripted_apiserver: type[ScriptedWatch], tmp_path: Path) -> None:
    scripted_apiserver.script = [[job_event("ADDED", "5", "Running")]]  # runs on and on
    started = time.monotonic()
    assert watch(tmp_path, timeout=3).returncode == 3
    assert time.monotonic() - started < 15


@pytest.mark.lab
@pytest.mark.usefixtures("operator")
def test_watch_survives_an_api_server_restart_and_exits_0_when_the_job_succeeds(
        lab: Lab, jobs: Jobs, tmp_path: Path) -> None:
    # The worker runs only once torchrun's rendezvous resolved `long-0.long`: restarting the API server before
    # that would test the lab's DNS (a name never looked up cannot be answered while the API server is away).
    worker = "import time; print('worker started', flush=True); time.sleep(30)"
    jobs.create("long", {"nodes": 1, "procsPerNode": 1, "command": ["python", "-c", worker],
                         "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
                         "runPolicy": {"terminationGracePeriodSeconds": 5}})
    log = tmp_path / "watch.out"
    with log.open("w") as out:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "kubetrain.cli.commands", "watch", "long", "-n", jobs.namespace, "--timeout=300"],
            env={**os.environ, "KUBECONFIG": str(lab.kubeconfig), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "long: Running" in log.read_text(), 120, "the watch to see the job running", interval=0.5)
        pod_log = lab.pod_log(jobs.namespace, "long-0")
        wait_for(lambda: pod_log.exists() and "worker started" in pod_log.read_text(), 120, "the worker to start")
        lab.restart_apiserver()
        code = watcher.wait(timeout=240)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    output = log.read_text()
    assert code == 0, output
    assert "reconnecting" in output
    assert "long: Succeeded" in output
    assert jobs.status("long")["restarts"] == 0, jobs.status("long").get("failures")


def test_the_line_says_a_queued_jobs_place_and_a_running_jobs_progress() -> None:
    queued = {"phase": "Queued", "nodes": {"summary": "0/2"}, "queuePosition": {"localQueue": 3, "clusterQueue": 5}}
    assert describe_status(queued) == "Queued | nodes 0/2 | position 3 in its LocalQueue (5 in its ClusterQueue)"
    running = {"phase": "Running", "nodes": {"summary": "2/2"}, "restarts": 1,
               "progress": {"lossText": "2.31", "throughputText": "812", "eta": "4m"}}
    assert describe_status(running) == "Running | nodes 2/2 | loss 2.31 | 812 samples/s | ETA 4m | restarts 1"
