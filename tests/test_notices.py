"""A disruption announced before it happens (core/notices.py): which nodes announce one, and the checkpoint the
operator asks rank 0 for, once per attempt and node, said in the status and an event."""

from __future__ import annotations

import asyncio
from typing import Any

from kubetrain.core.lifecycle import reconcile
from kubetrain.core.nodes import IN_PLACE_FEATURE, lacks_in_place_restarts
from kubetrain.core.notices import RETRY_SECONDS, node_notice
from kubetrain.core.status import CheckpointAnswer, CheckpointAsk
from kubetrain.k8s.nodewatch import NodeWatch
from tests.pods import pod, states
from tests.status_schema import assert_valid_status
from tests.test_policy import KNOWN, NOW, job, reasons, running

Json = Any
CORDONED = "is cordoned (a drain begins)"


def test_a_cordoned_or_noexecute_tainted_node_announces_a_disruption() -> None:
    assert node_notice({"spec": {"unschedulable": True}}) == CORDONED
    tainted = {"spec": {"taints": [{"key": "spot/reclaim", "effect": "NoSchedule"},
                                   {"key": "spot/reclaim-now", "effect": "NoExecute"}]}}
    assert node_notice(tainted) == "has the NoExecute taint spot/reclaim-now"
    assert node_notice({"spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}}) is None
    assert node_notice({"metadata": {"name": "quiet"}}) is None


def _pods() -> Any:
    return states(pod(0, node="node-a"), pod(1, node="node-b"))


def _decide(status: Json | None = None, answer: CheckpointAnswer | None = None, **spec: Json) -> Any:
    status = status if status is not None else running(progress={"step": 120}, conditions=[KNOWN])
    return reconcile(job(**spec), status, _pods(), NOW, notices={"node-b": CORDONED}, checkpoint_answer=answer)


def test_a_running_job_on_a_cordoned_node_asks_rank_0_then_records_the_request() -> None:
    first = _decide()
    ask = CheckpointAsk("node-b", CORDONED)
    assert first.ask_checkpoint == ask and "checkpointRequest" not in first.status
    taken = _decide(answer=CheckpointAnswer(ask))
    assert taken.ask_checkpoint is None
    assert taken.status["checkpointRequest"] == {"attempt": 0, "node": "node-b", "reason": CORDONED,
                                                 "time": "2026-11-01T10:10:00Z", "step": 120, "nodes": ["node-b"]}
    assert reasons(taken) == ["CheckpointRequested"]
    assert "node node-b is cordoned (a drain begins): asked the trainer to checkpoint now (step 120)" in [
        e.message for e in taken.events]
    assert_valid_status(taken.status)
    again = _decide(taken.status)
    assert again.ask_checkpoint is None and reasons(again) == [], "asked once per attempt and node"


def test_a_request_that_fails_is_said_and_made_again() -> None:
    ask = CheckpointAsk("node-b", CORDONED)
    failed = _decide(answer=CheckpointAnswer(ask, "connection refused"))
    assert "checkpointRequest" not in failed.status and reasons(failed) == ["CheckpointRequestFailed"]
    assert failed.requeue_after is not None and failed.requeue_after <= RETRY_SECONDS
    assert _decide(failed.status).ask_checkpoint == ask


def test_the_next_attempt_or_another_node_is_asked_again() -> None:
    asked = {"attempt": 0, "node": "node-a", "reason": CORDONED, "time": "2026-11-01T10:00:00Z", "step": 5,
             "nodes": ["node-a"]}
    status = running(progress={"step": 120}, conditions=[KNOWN], checkpointRequest=asked)
    assert _decide(status).ask_checkpoint == CheckpointAsk("node-b", CORDONED)


def test_only_a_built_in_trainer_with_checkpoints_on_a_claim_is_asked() -> None:
    assert _decide(command=["python", "train.py"]).ask_checkpoint is None
    alone = reconcile(job(nodes=1, checkpoint={"everySteps": 100}), running(progress={"step": 120}),
                      states(pod(0, node="node-b")), NOW, notices={"node-b": CORDONED})
    assert alone.ask_checkpoint is None  # no claim: nothing outlives the pod
    pending = reconcile(job(), running(phase="Pending", progress={"step": 0}),
                        states(pod(0, node="node-a"), pod(1, "Pending", node="node-b")), NOW,
                        notices={"node-b": CORDONED})
    assert pending.status["phase"] != "Running" and pending.ask_checkpoint is None



def _node(name: str, *, declared: tuple[str, ...] = (), cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "7"}, "spec": {"unschedulable": cordoned},
            "status": {"declaredFeatures": list(declared)}}


def test_pods_restart_in_place_only_while_every_node_that_takes_pods_declares_it() -> None:
    """The scheduler would place a pod with the RestartAllContainers rule only on a node declaring the feature."""
    class Listing:
        def __init__(self, nodes: list[dict[str, Any]]) -> None:
            self.nodes = nodes

        async def list_nodes_to_watch(self) -> tuple[list[dict[str, Any]], str]:
            return self.nodes, "7"

    able = _node("gpu-0", declared=(IN_PLACE_FEATURE,))
    kube = Listing([able, _node("old-0", cordoned=True)])
    watch = NodeWatch(kube)  # type: ignore[arg-type]  # only its list is read here
    assert watch.restart_in_place is False, "not before the nodes were listed"

    async def follow() -> None:
        await watch.listed(0.01)
        await watch._list()
        await watch.listed(1)

    asyncio.run(follow())
    assert watch.restart_in_place is True, "a cordoned node takes no pods"
    watch._apply({"type": "ADDED", "object": _node("old-1")})
    assert watch.restart_in_place is False
    watch._apply({"type": "DELETED", "object": _node("old-1")})
    assert watch.restart_in_place is True
    assert lacks_in_place_restarts(_node("old-2")) and not lacks_in_place_restarts(able)
