"""`kubetrain logs`: which pods, which lines, and what an attempt leaves after its pods are gone.

The streaming itself runs against the real node's kubelet in tests/test_realnode_operator.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kubetrain.cli import logs
from kubetrain.cli.logs import LogPod, _lines, failure_lines, keep_line, pods_of_attempt, prefixed
from kubetrain.core import api


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


def test_lines_are_whole_whatever_the_chunks() -> None:
    chunks = [b"first li", b"ne\nsecond\nthi", b"rd \xe2\x9c", b"\x93\n", b"unterminated"]
    assert list(_lines(chunks)) == ["first line", "second", "third \u2713", "unterminated"]


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
    """Stands for logs._Cluster: each log request answers the next of ``streams`` (whole log so far)."""

    def __init__(self, streams: list[list[str] | None], ended_after: int) -> None:
        self.streams = streams
        self.opened = 0
        self.ended_after = ended_after  # the container has ended once this many streams were opened

    def log_chunks(self, pod: str, follow: bool) -> Iterator[bytes]:
        lines = self.streams[self.opened]
        self.opened += 1
        if lines is None:  # the pod's kubelet has not seen it yet: the API server relays its 404
            raise ApiException(status=404, reason="Not Found")
        yield "".join(f"{line}\n" for line in lines).encode()

    def container_ended(self, pod: str) -> bool:
        return self.opened >= self.ended_after


def test_a_follow_that_ended_while_the_container_runs_goes_on_without_repeating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "POLL_SECONDS", 0)
    pod = logs.LogPod(name="job-0", node_index=0, attempt=0)
    # the kubelet ended the first follow at once (created, not yet running), the second after two lines
    cluster = _Streams([[], ["a", "b"], ["a", "b", "c"]], ended_after=3)
    assert list(logs._pod_lines(cluster, pod, follow=True)) == ["a", "b", "c"]  # type: ignore[arg-type]
    assert cluster.opened == 3
    once = _Streams([["a"]], ended_after=0)
    assert list(logs._pod_lines(once, pod, follow=False)) == ["a"]  # type: ignore[arg-type]


def test_a_follow_waits_for_a_kubelet_that_has_not_seen_the_pod_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "POLL_SECONDS", 0)
    pod = logs.LogPod(name="job-0", node_index=0, attempt=0)
    cluster = _Streams([None, None, ["a", "b"]], ended_after=3)  # 404 twice while the pod exists
    assert list(logs._pod_lines(cluster, pod, follow=True)) == ["a", "b"]  # type: ignore[arg-type]
    gone = _Streams([None], ended_after=1)  # 404, and the pod is gone: the stream ends
    assert list(logs._pod_lines(gone, pod, follow=True)) == []  # type: ignore[arg-type]
