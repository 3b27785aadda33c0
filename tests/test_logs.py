"""`kubetrain logs`: which pods, which lines, and what an attempt leaves after its pods are gone.

The streaming itself runs against the real node's kubelet in tests/test_realnode_operator.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from click.testing import CliRunner

from kubetrain.cli import logs
from kubetrain.cli.commands import main
from kubetrain.cli.logs import LogPod, failure_lines, keep_line, lines_of, pods_of_attempt, prefixed
from kubetrain.core import api
from kubetrain.k8s.transport import ApiError


def _pod(name: str, node: int, attempt: int) -> dict[str, Any]:
    labels = {api.LABEL.NODE_INDEX: str(node), api.LABEL.ATTEMPT: str(attempt)}
    return {"metadata": {"name": name, "labels": labels}}


def test_the_newest_attempt_is_shown_in_node_order() -> None:
    pods = [_pod("j-1", 1, 2), _pod("j-0", 0, 2), _pod("old-0", 0, 1), {"metadata": {"name": "stray", "labels": {}}}]
    assert pods_of_attempt(pods, None) == (2, [LogPod("j-0", 0, 2), LogPod("j-1", 1, 2)])
    assert pods_of_attempt(pods, 1) == (1, [LogPod("old-0", 0, 1)])
    assert pods_of_attempt(pods, 7) == (7, [])
    assert pods_of_attempt([], None) == (None, [])


def test_a_rank_keeps_only_its_own_lines() -> None:
    assert keep_line("[rank3]: step 10", 3)
    assert not keep_line("[rank13]: step 10", 3)
    assert not keep_line("W1201 torch/distributed/run.py: agent line", 3), "the agent's lines have no rank"
    assert keep_line("anything", None)


def test_the_prefix_template_is_what_the_rank_filter_reads() -> None:
    rendered = api.LOG_LINE_PREFIX.replace("${rank}", "12") + "hello"
    assert keep_line(rendered, 12) and prefixed(LogPod("j-1", 1, 0), rendered) == "node-1 | [rank12]: hello"


async def _chunks(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _all(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


def test_lines_are_whole_whatever_the_chunks() -> None:
    chunks = [b"first li", b"ne\nsecond\nthi", b"rd \xe2\x9c", b"\x93\n", b"unterminated"]
    assert asyncio.run(_all(lines_of(_chunks(chunks)))) == ["first line", "second", "third \u2713", "unterminated"]


def test_a_failed_attempt_is_told_from_the_status_with_its_log_tail() -> None:
    status = {"failures": [
        {"attempt": 0, "pod": "j-1", "reason": "Error", "exitCode": 137, "time": "2026-12-01T00:00:00Z",
         "message": "pod j-1 failed", "logTail": "[rank2]: step 40\n[rank3]: step 40"},
        {"attempt": 0, "reason": "Stalled", "time": "2026-12-01T00:00:01Z", "message": "no heartbeat for 600 s"},
        {"attempt": 1, "pod": "j-0", "reason": "Error", "time": "2026-12-01T01:00:00Z"},
    ]}
    assert failure_lines(status, 0) == [
        "j-1: Error, exit code 137 at 2026-12-01T00:00:00Z",
        "  [rank2]: step 40",
        "  [rank3]: step 40",
        "the attempt: Stalled at 2026-12-01T00:00:01Z",
        "  no heartbeat for 600 s",
    ]
    assert failure_lines(status, 5) == []


def test_a_failed_pods_log_tail_outlives_it_bounded() -> None:
    from kubetrain.core.lifecycle import reconcile
    from tests.pods import pod, states
    from tests.test_policy import NOW, job, running

    log = "".join(f"[rank1]: step {step}\n" for step in range(1000))
    decision = reconcile(job(), running(), states(pod(0, "Failed", exit_code=137, message=log), pod(1)), NOW)
    (failure,) = decision.status["failures"]
    assert failure["logTail"] == log[-api.LOG_TAIL_CHARS:] and failure["logTail"].endswith("step 999\n")


class _Streams:
    """Stands for the CLI's Cluster: each log request answers the next of ``streams`` (whole log so far); the
    pod reads as running until ``ended_after`` streams were opened, then as gone (404)."""

    def __init__(self, streams: list[list[str] | None], ended_after: int) -> None:
        self.streams = streams
        self.opened = 0
        self.ended_after = ended_after

    async def log_chunks(self, pod: str, follow: bool, read_timeout: float) -> AsyncIterator[bytes]:
        lines = self.streams[self.opened]
        self.opened += 1
        if lines is None:  # the pod's kubelet has not seen it yet: the API server relays its 404
            raise ApiError(404, "Not Found", "")
        yield "".join(f"{line}\n" for line in lines).encode()

    async def pod(self, name: str) -> dict[str, Any]:
        if self.opened >= self.ended_after:
            raise ApiError(404, "Not Found", json.dumps({"message": f'pods "{name}" not found'}))
        return {"metadata": {"name": name}, "status": {"phase": "Running"}}


def _pod_lines(cluster: _Streams, pod: LogPod, follow: bool) -> list[str]:
    return asyncio.run(_all(logs._pod_lines(cluster, pod, follow)))  # type: ignore[arg-type]


def test_a_follow_that_ended_while_the_container_runs_goes_on_without_repeating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "POLL_SECONDS", 0)
    pod = logs.LogPod(name="job-0", node_index=0, attempt=0)
    # the kubelet ended the first follow at once (created, not yet running), the second after two lines
    cluster = _Streams([[], ["a", "b"], ["a", "b", "c"]], ended_after=3)
    assert _pod_lines(cluster, pod, follow=True) == ["a", "b", "c"]
    assert cluster.opened == 3
    once = _Streams([["a"]], ended_after=0)
    assert _pod_lines(once, pod, follow=False) == ["a"]


def test_a_follow_waits_for_a_kubelet_that_has_not_seen_the_pod_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "POLL_SECONDS", 0)
    pod = logs.LogPod(name="job-0", node_index=0, attempt=0)
    cluster = _Streams([None, None, ["a", "b"]], ended_after=3)  # 404 twice while the pod exists
    assert _pod_lines(cluster, pod, follow=True) == ["a", "b"]
    gone = _Streams([None], ended_after=1)  # 404, and the pod is gone: the stream ends
    assert _pod_lines(gone, pod, follow=True) == []


# The CLI over HTTP: a scripted API server with one job whose attempt 0 has two pods.
POD_LINES = {"j-0": [b"[rank0]: step 1\n", b"[rank0]: st", b"ep 2\n"], "j-1": [b"[rank1]: step 1\n"]}


class ScriptedApiServer(BaseHTTPRequestHandler):
    """Answers `kubetrain logs`' reads; j-0's followed log waits for j-1's to be asked for, which only a CLI
    that follows both pods at once does."""

    both_streaming = threading.Event()
    waited_in_vain = False
    j0_late_listings = 0
    requests: ClassVar[list[tuple[str, dict[str, list[str]]]]] = []
    waiting = b'{"kind": "Status", "message": "container \\"trainer\\" in pod \\"j-1\\" is waiting to start"}'

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        self.requests.append((url.path, query))
        jobs = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/ns/{api.PLURAL}/"
        if url.path == jobs + "j":
            self._answer(200, json.dumps({"metadata": {"name": "j", "uid": "u"},
                                          "status": {"phase": "Succeeded", "attempt": 0}}).encode())
        elif url.path == "/api/v1/namespaces/ns/pods":
            listings = sum(1 for path, _ in self.requests if path == url.path)
            late = listings <= self.j0_late_listings  # j-0 created after these listings
            items = [_pod("j-1", 1, 0)] if late else [_pod("j-1", 1, 0), _pod("j-0", 0, 0)]
            self._answer(200, json.dumps({"items": items}).encode())
        elif url.path.endswith("/log") and query["follow"] == ["false"] and "j-1" in url.path:
            self._answer(400, self.waiting)
        elif url.path.endswith("/log"):
            self._stream_log(url.path.split("/")[-2], follow=query["follow"] == ["true"])
        elif url.path.startswith("/api/v1/namespaces/ns/pods/"):  # a followed pod's container has ended
            self._answer(200, json.dumps({"status": {"phase": "Succeeded"}}).encode())
        else:
            self._answer(404, b'{"kind": "Status", "message": "not found"}')

    def _stream_log(self, pod: str, follow: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        if follow and pod == "j-1":
            type(self).both_streaming.set()
        for number, chunk in enumerate(POD_LINES[pod]):
            if follow and pod == "j-0" and number == 1 and not self.both_streaming.wait(10):
                type(self).waited_in_vain = True
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ScriptedApiServer]]:
    ScriptedApiServer.requests = []
    ScriptedApiServer.both_streaming = threading.Event()
    ScriptedApiServer.waited_in_vain = False
    ScriptedApiServer.j0_late_listings = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(logs, "POLL_SECONDS", 0)
    yield ScriptedApiServer
    server.shutdown()
    server.server_close()


def test_following_streams_every_pod_at_once_until_the_job_ends(apiserver: type[ScriptedApiServer]) -> None:
    written: list[str] = []
    assert logs.show_logs("ns", "j", follow=True, write=written.append) == 0
    assert not apiserver.waited_in_vain, "j-1's log was asked for only once j-0's had ended"
    assert sorted(written) == ["node-0 | [rank0]: step 1", "node-0 | [rank0]: step 2", "node-1 | [rank1]: step 1"]
    selectors = {query["labelSelector"][0] for path, query in apiserver.requests if path.endswith("/pods")}
    assert selectors == {f"{api.LABEL.JOB_NAME}=j,{api.LABEL.JOB_UID}=u"}
    assert all(query["container"] == [api.CONTAINER_NAME] for path, query in apiserver.requests
               if path.endswith("/log"))


def test_following_takes_in_a_pod_of_the_attempt_made_after_the_first_look(
        apiserver: type[ScriptedApiServer]) -> None:
    """A gang's pods are created together, but a listing can come between two creates: a follow then showed node 1
    alone for a whole attempt (CI, the real node's journey)."""
    apiserver.j0_late_listings = 2  # the follow's first look and its streaming's first look see j-1 alone
    apiserver.both_streaming.set()  # j-0 streams after j-1 here, not beside it
    written: list[str] = []
    assert logs.show_logs("ns", "j", follow=True, write=written.append) == 0
    assert sorted(written) == ["node-0 | [rank0]: step 1", "node-0 | [rank0]: step 2", "node-1 | [rank1]: step 1"]


def test_printing_says_why_a_pod_has_no_output_and_filters_by_rank(apiserver: type[ScriptedApiServer]) -> None:
    written: list[str] = []
    assert logs.show_logs("ns", "j", rank=0, write=written.append) == 0
    assert written == ["node-0 | [rank0]: step 1", "node-0 | [rank0]: step 2",
                       'node-1 | (no output: container "trainer" in pod "j-1" is waiting to start)']


def test_a_job_that_is_not_there_is_one_line_and_exit_1(apiserver: type[ScriptedApiServer]) -> None:
    result = CliRunner().invoke(main, ["logs", "nothere", "-n", "ns"])
    assert result.exit_code == 1
    assert 'trainingjob "nothere" not found in namespace "ns"' in result.output


def test_a_kubeconfig_that_is_not_there_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    result = CliRunner().invoke(main, ["logs", "j"])
    assert result.exit_code == 1
    assert "no credentials for the cluster: cannot read the credentials" in result.output
