"""kube.py: the operator's REST calls (paths, verbs, content types, error mapping) against a small HTTP server,
its login, and the operator process's footprint: the official Kubernetes client is never loaded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from kubetrain.core import api
from kubetrain.k8s import kube, transport
from kubetrain.k8s.kube import ApiError, ConflictError, CreateError, JobGoneError, Kube, VersionGoneError, api_failure
from kubetrain.k8s.lanes import Slots, routine_calls

Json = Any
JOBS = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/ns/{api.PLURAL}"


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    authorization: str
    body: Json
    user_agent: str = ""


@dataclass
class Server:
    """Answers each request with the next scripted (status, body); records what it saw."""

    answers: list[tuple[int, Json]]
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        text = await request.text()
        self.seen.append(Seen(request.method, request.path, dict(request.query), request.content_type,
                              request.headers.get("Authorization", ""), json.loads(text) if text else None,
                              request.headers.get("User-Agent", "")))
        status, body = self.answers.pop(0)
        if not isinstance(body, Chunks):
            return web.json_response(body, status=status)
        response = web.StreamResponse(status=status)  # a watch: the body as the server sends it, piece by piece
        await response.prepare(request)
        for chunk in body:
            await response.write(chunk)
            await asyncio.sleep(0)
        await response.write_eof()
        return response


class Chunks(list[bytes]):
    """A streamed answer (a watch), in these pieces."""


def status_body(code: int, message: str) -> Json:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


def against(answers: list[tuple[int, Json]], call: Callable[[Kube], Awaitable[Any]],
            tokens: list[str] | None = None) -> tuple[Any, Server]:
    """Run ``call`` with a Kube logged in to a local server that gives ``answers``; (its result, the server).
    Each login takes the next of ``tokens``. An exception of the call comes back as the result."""
    server = Server(list(answers))
    logins = iter(tokens or ["t0"])

    async def main() -> Any:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = Kube(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}", token=next(logins)))
        try:
            return await call(client)
        except Exception as error:
            return error
        finally:
            await client.close()
            await runner.cleanup()

    return asyncio.run(main()), server


def test_get_job_reads_the_custom_object_and_none_when_missing() -> None:
    job = {"metadata": {"name": "j", "resourceVersion": "5"}}
    result, server = against([(200, job), (404, status_body(404, "not found"))],
                             lambda k: asyncio.gather(k.get_job("ns", "j"), k.get_job("ns", "gone")))
    assert result == [job, None]
    assert [(s.method, s.path, s.authorization) for s in server.seen] == [
        ("GET", f"{JOBS}/j", "Bearer t0"), ("GET", f"{JOBS}/gone", "Bearer t0")]


def test_status_is_merge_patched_against_the_read_version() -> None:
    answer = {"metadata": {"resourceVersion": "6"}}
    result, server = against([(200, answer)], lambda k: k.patch_job_status("ns", "j", {"phase": "Running"}, "5"))
    assert result == answer
    (seen,) = server.seen
    assert (seen.method, seen.path, seen.content_type) == ("PATCH", f"{JOBS}/j/status", "application/merge-patch+json")
    assert seen.body == {"metadata": {"resourceVersion": "5"}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(("code", "error"), [(409, ConflictError), (404, JobGoneError)])
def test_status_patch_conflict_and_gone(code: int, error: type[Exception]) -> None:
    result, _ = against([(code, status_body(code, "no"))], lambda k: k.patch_job_status("ns", "j", {}, "5"))
    assert isinstance(result, error)


def test_create_returns_none_when_created_else_the_existing_object() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    existing = {"metadata": {"name": "p", "uid": "other"}}

    async def twice(k: Kube) -> Any:
        return [await k.create("ns", pod), await k.create("ns", pod)]
    result, server = against([(201, pod), (409, status_body(409, "exists")), (200, existing)], twice)
    assert result == [None, existing]
    assert [(s.method, s.path) for s in server.seen] == [
        ("POST", "/api/v1/namespaces/ns/pods"), ("POST", "/api/v1/namespaces/ns/pods"),
        ("GET", "/api/v1/namespaces/ns/pods/p")]
    assert server.seen[0].body == pod and server.seen[0].content_type == "application/json"


def test_a_refused_create_names_the_object_with_the_servers_message() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    result, server = against([(422, status_body(422, "spec.ports: Required value"))], lambda k: k.create("ns", service))
    assert isinstance(result, CreateError)
    assert server.seen[0].path == "/api/v1/namespaces/ns/services"
    failure = api_failure(result)
    assert (failure.status, failure.message, failure.creating) == (422, "spec.ports: Required value", "service s")


def test_whether_trainingjobs_are_served_comes_from_api_discovery() -> None:
    group = {"kind": "APIResourceList", "groupVersion": "kubetrain.io/v1alpha1", "resources": [
        {"name": "trainingjobs", "kind": "TrainingJob"}, {"name": "trainingjobs/status", "kind": "TrainingJob"}]}
    result, server = against([(200, group)], lambda k: k.serves_jobs())
    assert result is True and server.seen[0].path == "/apis/kubetrain.io/v1alpha1"
    result, _ = against([(404, status_body(404, "the server could not find the requested resource"))],
                        lambda k: k.serves_jobs())
    assert result is False
    result, _ = against([(200, group | {"resources": []})], lambda k: k.serves_jobs())
    assert result is False


def test_a_create_in_a_namespace_being_deleted_is_the_job_gone_and_other_refusals_are_not() -> None:
    """The API server's answer as the lab's gives it (NamespaceLifecycle admission)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    terminating = status_body(403, 'pods "p" is forbidden: unable to create new content in namespace ns because '
                                   "it is being terminated") | {
        "reason": "Forbidden", "details": {"name": "p", "kind": "pods", "causes": [
            {"reason": "NamespaceTerminating", "message": "namespace ns is being terminated",
             "field": "metadata.namespace"}]}}
    result, _ = against([(403, terminating)], lambda k: k.create("ns", pod))
    assert isinstance(result, JobGoneError) and "namespace ns is being deleted" in str(result)
    result, _ = against([(403, status_body(403, "exceeded quota: pods"))], lambda k: k.create("ns", pod))
    assert isinstance(result, CreateError)


def test_deletes_ignore_what_is_gone_and_force_skips_the_grace_period() -> None:
    async def deletes(k: Kube) -> None:
        await k.delete_pod("ns", "p", force=True)
        await k.delete_pod("ns", "q")
        await k.delete_companion("ns", "Service", "s")
        await k.delete_job("ns", "j")
    gone = (404, status_body(404, "not found"))
    result, server = against([(200, {}), gone, (200, {}), gone], deletes)
    assert result is None
    assert [(s.method, s.path, s.query) for s in server.seen] == [
        ("DELETE", "/api/v1/namespaces/ns/pods/p", {"gracePeriodSeconds": "0"}),
        ("DELETE", "/api/v1/namespaces/ns/pods/q", {}),
        ("DELETE", "/api/v1/namespaces/ns/services/s", {}),
        ("DELETE", f"{JOBS}/j", {"propagationPolicy": "Background"})]


def test_an_orphaned_pod_is_adopted_with_a_patch() -> None:
    result, server = against([(200, {})], lambda k: k.adopt_pod("ns", "p", {"uid": "u"}))
    assert result is None
    (patch,) = server.seen
    assert (patch.method, patch.path, patch.content_type) == (
        "PATCH", "/api/v1/namespaces/ns/pods/p", "application/strategic-merge-patch+json")
    assert patch.body == {"metadata": {"ownerReferences": [{"uid": "u"}]}}


def test_the_operator_names_itself_to_the_api_server_also_after_a_new_login() -> None:
    """The API server takes the User-Agent (up to the "/") as the field manager of what a request writes: the
    pods' and jobs' managedFields say kubetrain-operator, not aiohttp's "Python"."""
    unauthorized = (401, status_body(401, "Unauthorized"))
    _, server = against([unauthorized, (200, {"metadata": {}})], lambda k: k.get_job("ns", "j"), tokens=["old", "new"])
    assert [s.user_agent for s in server.seen] == [f"kubetrain-operator/{api.RELEASE}"] * 2


def test_a_401_logs_in_again_once() -> None:
    """A service account's token is rotated by the kubelet: the next login reads the new one."""
    unauthorized = (401, status_body(401, "Unauthorized"))
    result, server = against([unauthorized, (200, {"metadata": {"name": "j"}})], lambda k: k.get_job("ns", "j"),
                             tokens=["old", "new"])
    assert result == {"metadata": {"name": "j"}}
    assert [s.authorization for s in server.seen] == ["Bearer old", "Bearer new"]
    result, server = against([unauthorized, unauthorized], lambda k: k.get_job("ns", "j"), tokens=["a", "b"])
    assert isinstance(result, ApiError) and api_failure(result).status == 401


def test_failures_map_to_the_pure_cores_api_failure() -> None:
    assert api_failure(ApiError(503, "Service Unavailable", "")).status == 503
    assert api_failure(ApiError(403, "Forbidden", json.dumps(status_body(403, "exceeded quota")))).message == (
        "exceeded quota")
    for no_answer in (aiohttp.ServerDisconnectedError(), ConnectionRefusedError(111, "refused"), TimeoutError()):
        assert api_failure(no_answer).status is None and not api_failure(no_answer).internal
    assert api_failure(KeyError("metadata")).internal


def test_an_api_server_that_does_not_answer_is_status_none() -> None:
    async def call() -> Any:
        client = Kube(lambda: kopf.ConnectionInfo(server="http://127.0.0.1:1"))
        try:
            return await client.get_job("ns", "j")
        except Exception as error:
            return error
        finally:
            await client.close()
    failure = api_failure(asyncio.run(call()))
    assert failure.status is None and not failure.internal


def test_kubeconfig_login_reads_relative_files_from_the_kubeconfigs_folder(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "k", "cluster": {"server": "https://10.1.2.3:6443",
                                                     "certificate-authority": "ca.crt"}}],
              "users": [{"name": "u", "user": {"client-certificate": "/abs/u.crt", "client-key": "u.key"}}],
              "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    (tmp_path / "config").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    info = kube.login(kopf.OperatorSettings())
    assert info.server == "https://10.1.2.3:6443"
    assert (info.ca_path, info.certificate_path, info.private_key_path) == (
        str(tmp_path / "ca.crt"), "/abs/u.crt", str(tmp_path / "u.key"))


def test_service_account_login_uses_the_services_address_like_the_official_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    account = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="sa")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = kube.login(kopf.OperatorSettings())
    assert (info.server, info.token) == ("https://[fd00::1]:443", "sa")


# The operator's start-up as `kubetrain operator` runs it, stopped where it would serve metrics (after kopf,
# the handlers and kopf's configuration are loaded): what is loaded, which login kopf would use, the RSS.
OPERATOR_START = """
import json, os, sys
import prometheus_client

def report(*_, **__):
    # VmRSS, not ru_maxrss: that one keeps the parent's (pytest's) peak across fork and exec.
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    import kopf
    from kopf._core.intents.causes import Activity
    registry = kopf.get_default_registry()
    logins = [h.id for h in registry._activities.get_handlers(activity=Activity.AUTHENTICATION)]
    print(json.dumps({"kubernetes": sys.modules.get("kubernetes") is not None,
                      "validators": sorted(m for m in ("jsonschema", "celpy") if m in sys.modules),
                      "click": sorted(m for m in ("click", "kubetrain.cli.commands") if m in sys.modules),
                      "loaded": sorted(m for m in ("kopf", "kubetrain.controller.handlers", "kubetrain.k8s.kube")
                                       if m in sys.modules),
                      "logins": logins, "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
                      "frozenlist_extension": "frozenlist._frozenlist" in sys.modules,
                      "aiohttp_default_cas": sys.modules["aiohttp.connector"]._SSL_CONTEXT_VERIFIED.cert_store_stats(),
                      "mime_types": len(sys.modules["mimetypes"].types_map),
                      "ca_environment": [os.environ.get(n) for n in ("SSL_CERT_FILE", "SSL_CERT_DIR")]}))
    sys.exit(0)

prometheus_client.start_http_server = report
from kubetrain.__main__ import main  # what the console script and `python -m kubetrain` run
main(["operator", "--all-namespaces", "--metrics-port=9"])
"""


def test_the_operator_process_never_loads_the_official_client() -> None:
    done = subprocess.run([sys.executable, "-c", OPERATOR_START], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"operator start-up RSS: {facts['rss_mib']:.1f} MiB")
    assert facts["kubernetes"] is False
    assert facts["validators"] == [], "the API server validates jobs; the operator need not hold a validator"
    assert facts["click"] == [], "the CLI's click: 1 MiB of the operator's memory"
    assert facts["loaded"] == ["kopf", "kubetrain.controller.handlers", "kubetrain.k8s.kube"]
    assert [login.split(".")[-1] for login in facts["logins"]] == ["login_handler"]  # not kopf's client login
    assert facts["frozenlist_extension"] is False, "it maps libstdc++ (1.1 MB)"
    assert facts["aiohttp_default_cas"]["x509_ca"] == 0, "the system's CAs in a context nothing uses (1.6 MB)"
    assert facts["mime_types"] < 200, "the system's table (about 1,500 types on Debian), for serving files"
    assert facts["ca_environment"] == [os.environ.get(n) for n in ("SSL_CERT_FILE", "SSL_CERT_DIR")]


def watched(chunks: list[bytes]) -> Any:
    async def call(kube: Kube) -> list[Json]:
        return [event async for event in kube.watch_pods("ns", "kubetrain.io/job-name", "41")]
    return against([(200, Chunks(chunks))], call)


def test_a_pod_watch_reads_events_split_anywhere_and_longer_than_64_kib() -> None:
    big = {"type": "MODIFIED", "object": {"metadata": {"name": "a", "annotations": {"x": "y" * 100_000}}}}
    stream = (json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a"}}}) + "\n"
              + json.dumps(big) + "\n" + json.dumps({"type": "BOOKMARK", "object": {"metadata": {}}}) + "\n").encode()
    events, server = watched([stream[:10], stream[10:70_000], stream[70_000:]])
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "BOOKMARK"]
    assert events[1] == big
    (seen,) = server.seen
    assert seen.path == "/api/v1/namespaces/ns/pods"
    assert seen.query == {"watch": "true", "resourceVersion": "41", "allowWatchBookmarks": "true",
                          "labelSelector": "kubetrain.io/job-name", "timeoutSeconds": "300"}


def test_a_watch_whose_version_is_gone_says_so_and_other_errors_are_api_errors() -> None:
    gone = {"type": "ERROR", "object": status_body(410, "too old resource version: 41 (97)")}
    first = {"type": "ADDED", "object": {"metadata": {"name": "a"}}}
    error, _ = watched([(json.dumps(first) + "\n" + json.dumps(gone) + "\n").encode()])
    assert isinstance(error, VersionGoneError) and "too old" in str(error)
    error, _ = watched([(json.dumps({"type": "ERROR", "object": status_body(500, "etcd")}) + "\n").encode()])
    assert isinstance(error, ApiError) and error.status == 500
    refused, _ = against([(403, status_body(403, "pods is forbidden"))],
                         lambda kube: anext(aiter(kube.watch_pods(None, "l", "1"))))
    assert isinstance(refused, ApiError) and refused.status == 403


def test_a_pod_list_follows_continue_tokens_and_gives_the_lists_version() -> None:
    pages = [(200, {"metadata": {"continue": "c1", "resourceVersion": "5"}, "items": [{"n": 1}]}),
             (200, {"metadata": {"resourceVersion": "7"}, "items": [{"n": 2}]})]
    (pods, version), server = against(pages, lambda kube: kube.list_pods(None, "kubetrain.io/job-name"))
    assert pods == [{"n": 1}, {"n": 2}] and version == "7"
    assert [s.path for s in server.seen] == ["/api/v1/pods"] * 2
    assert "continue" not in server.seen[0].query and server.seen[1].query["continue"] == "c1"


def test_calls_queued_behind_the_connection_limit_wait_for_a_slot_without_timing_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide gang's creates queue behind the operator's connection limit: the wait for a connection is not the
    API server failing to connect or answer (a 4,096-pod job's creates failed as "Connection timeout" with
    aiohttp's pool wait counted as connecting)."""
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT", 0.3)
    monkeypatch.setattr(transport, "REQUEST_TIMEOUT", 1.0)
    in_flight, most = 0, 0

    async def slow(_request: web.Request) -> web.StreamResponse:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.2)
        in_flight -= 1
        return web.json_response({"ok": True})

    async def twelve_calls(rest: transport.Rest) -> list[Any]:
        # 12 calls through 2 connections of 0.2 s each: 1.2 s, past both timeouts for the last ones
        return await asyncio.gather(*(rest.request("GET", f"/pods/{n}") for n in range(12)), return_exceptions=True)

    answers = asyncio.run(with_server(slow, 2, twelve_calls))
    assert answers == [{"ok": True}] * 12, [repr(a) for a in answers if not isinstance(a, dict)]
    assert most == 2, "the connection limit still bounds the calls in flight"


async def with_server(handler: Callable[[web.Request], Awaitable[web.StreamResponse]], connections: int,
                      call: Callable[[transport.Rest], Awaitable[Any]]) -> Any:
    """``call`` with a Rest of ``connections`` to a local server whose every request ``handler`` answers."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rest = transport.Rest(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), connections=connections)
    try:
        return await call(rest)
    finally:
        await rest.close()
        await runner.cleanup()


def throttling(times: int, retry_after: str = "0") -> tuple[Callable[[web.Request], Awaitable[web.StreamResponse]],
                                                             list[str]]:
    """A handler that answers /throttled with 429 (and ``retry_after``) ``times`` times, as API Priority and Fairness
    does when a level's queues are full, and everything else at once; and the log of what it answered."""
    answered: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/throttled" and answered.count("429") < times:
            answered.append("429")
            return web.json_response(status_body(429, "too many requests, please try again later"), status=429,
                                     headers={"Retry-After": retry_after})
        answered.append(request.path)
        return web.json_response({"ok": request.path})
    return handle, answered


def test_a_throttled_call_is_tried_again_after_retry_after_and_frees_its_slot_meanwhile() -> None:
    handle, answered = throttling(times=2, retry_after="1")

    async def calls(rest: transport.Rest) -> list[Any]:
        throttled = asyncio.create_task(rest.request("GET", "/throttled"))
        await asyncio.sleep(0.2)  # the first 429 is in: its 1 s wait must not hold the only connection slot
        other = await asyncio.wait_for(rest.request("GET", "/other"), timeout=0.6)
        return [other, await throttled]

    assert asyncio.run(with_server(handle, 1, calls)) == [{"ok": "/other"}, {"ok": "/throttled"}]
    assert answered == ["429", "/other", "429", "/throttled"]


def test_a_call_throttled_past_the_retries_raises_the_429(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "THROTTLED_RETRIES", 2)
    handle, answered = throttling(times=5)
    error = asyncio.run(with_server(handle, 1, lambda rest: _caught(rest.request("GET", "/throttled"))))
    assert isinstance(error, transport.ApiError) and error.status == 429 and error.retry_after == 0
    assert answered == ["429"] * 3


async def _caught(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except transport.ApiError as error:
        return error


@pytest.mark.parametrize(("header", "wait"), [(None, 1.0), (0.0, 0.1), (3.0, 3.0), (120.0, 10.0)])
def test_the_wait_after_a_429_is_what_the_server_asked_within_bounds(header: float | None, wait: float) -> None:
    assert transport.throttled_wait(header) == wait


def test_a_prompt_call_takes_the_next_free_slot_before_routine_calls_that_waited_longer() -> None:
    """After a burst, thousands of routine looks write statuses: a new job's calls go before them (lanes.py)."""
    gate = asyncio.Event()
    answered: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/first":
            await gate.wait()  # holds the only slot until every other call waits for it
        answered.append(request.path)
        return web.json_response({})

    async def calls(rest: transport.Rest) -> None:
        with routine_calls():
            first = asyncio.create_task(rest.request("GET", "/first"))
            routine = [asyncio.create_task(rest.request("GET", f"/routine-{n}")) for n in range(3)]
        await asyncio.sleep(0.1)
        prompt = asyncio.create_task(rest.request("GET", "/prompt"))
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.gather(first, *routine, prompt)

    asyncio.run(with_server(handle, 1, calls))
    assert answered == ["/first", "/prompt", "/routine-0", "/routine-1", "/routine-2"]


def test_a_call_cancelled_while_it_waits_for_a_slot_leaves_every_slot_to_the_others() -> None:
    async def calls() -> list[Any]:
        slots = Slots(1)
        async with slots.held():
            waiting = [asyncio.create_task(_hold(slots)) for _ in range(3)]
            await asyncio.sleep(0)  # all three wait
            waiting[0].cancel()  # cancelled in the queue
            await asyncio.sleep(0)
        waiting[1].cancel()  # handed the slot as the block ended, and cancelled before it ran: the slot passes on
        results = await asyncio.gather(*waiting, return_exceptions=True)
        async with slots.held():  # and is free again
            return [*(type(result).__name__ for result in results), slots.waiting()]

    assert asyncio.run(asyncio.wait_for(calls(), 2)) == ["CancelledError", "CancelledError", "str", (0, 0)]


async def _hold(slots: Slots) -> str:
    async with slots.held():
        await asyncio.sleep(0)
    return "held"


def test_routine_calls_hold_at_most_their_share_of_the_slots_and_prompt_calls_take_the_rest() -> None:
    async def calls() -> list[str]:
        slots, order = Slots(4, routine_max=1), []
        first_done = asyncio.Event()

        async def call(name: str, routine: bool, until: asyncio.Event | None = None) -> None:
            with routine_calls(routine):
                async with slots.held():
                    order.append(name)
                    if until is not None:
                        await until.wait()

        tasks = [asyncio.create_task(call("routine-0", True, first_done)),
                 asyncio.create_task(call("routine-1", True))]
        await asyncio.sleep(0.01)
        order.append(f"waiting {slots.waiting()}")  # routine-1 waits with 3 slots free
        await asyncio.create_task(call("prompt", False))  # takes one of them at once
        first_done.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(asyncio.wait_for(calls(), 2)) == ["routine-0", "waiting (0, 1)", "prompt", "routine-1"]


def _requests_counted(verb: str, resource: str, code: str) -> float:
    return REGISTRY.get_sample_value("kubetrain_api_requests_total",
                                     {"verb": verb, "resource": resource, "code": code}) or 0.0


def test_each_call_is_counted_by_verb_resource_and_answer() -> None:
    """kubetrain_api_requests: what the operator asks of the API server, each try of a throttled call included."""
    path = "/apis/kubetrain.io/v1alpha1/namespaces/counted/trainingjobs/a/status"

    patches: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.json_response(status_body(404, "not found"), status=404)
        patches.append(request.path)
        if len(patches) == 1:  # the first try is throttled
            return web.json_response(status_body(429, "too many requests"), status=429, headers={"Retry-After": "0"})
        return web.json_response({})

    async def calls(rest: transport.Rest) -> None:
        await rest.request("PATCH", path, body={})
        await _caught(rest.request("GET", "/api/v1/namespaces/counted/pods/p"))

    expected = {("patch", "trainingjobs/status", "429"): 1, ("patch", "trainingjobs/status", "2xx"): 1,
                ("get", "pods", "404"): 1}
    before = {key: _requests_counted(*key) for key in expected}
    asyncio.run(with_server(handle, 1, calls))
    assert {key: _requests_counted(*key) - value for key, value in before.items()} == expected


@pytest.mark.parametrize(("method", "path", "labels"), [
    ("POST", "/api/v1/namespaces/a/pods", ("create", "pods")),
    ("GET", "/api/v1/namespaces/a/pods?labelSelector=x", ("list", "pods")),
    ("GET", "/api/v1/namespaces/a", ("get", "namespaces")),
    ("GET", "/api/v1/nodes", ("list", "nodes")),
    ("DELETE", "/apis/scheduling.k8s.io/v1beta1/namespaces/a/podgroups/g", ("delete", "podgroups")),
    ("GET", "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/a/localqueues/q/pendingworkloads",
     ("get", "localqueues/pendingworkloads")),
    ("GET", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/f", ("get", "resourceflavors")),
])
def test_a_calls_labels_are_the_api_servers_verb_and_resource(method: str, path: str,
                                                                labels: tuple[str, str]) -> None:
    assert transport.request_labels(method, path) == labels
