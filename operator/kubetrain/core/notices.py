"""A disruption announced before it happens: the trainer is asked to checkpoint now, not at SIGTERM.

A drain starts by cordoning the node (``spec.unschedulable``); a node about to go (a spot instance's reclaim
notice, a maintenance window) is often tainted NoExecute first, and the taint manager evicts the pods that do not
tolerate it. When a node of the running attempt shows either, the operator asks rank 0 (``POST /checkpoint`` on
its metrics port): the gang saves at its next step, training goes on, and the eviction that follows loses only
the steps after it, however short the grace period. Asked once per attempt and node; the request, with the step
the status had then, is kept in ``status.checkpointRequest``. Only the built-in trainer can be asked (a program
of its own answers 501), and only a job whose checkpoints are on a claim keeps them past its pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubetrain.core.api import Phase, Reason
from kubetrain.core.status import CheckpointAsk, PodState, isoformat
from kubetrain.core.status_policy import Draft, Event

__all__ = ["ask_for_checkpoint", "node_notice"]

Json = Any
# Seconds before a request that failed is made again.
RETRY_SECONDS = 10.0
# Nodes remembered per attempt (status size): a gang with more noticed nodes is asked no more.
MAX_NODES_KEPT = 64


def node_notice(node: Json) -> str | None:
    """Why the node's pods are about to be disrupted, or None: cordoned, or a NoExecute taint."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "is cordoned (a drain begins)"
    taint = next((t for t in spec.get("taints") or [] if t.get("effect") == "NoExecute"), None)
    return f"has the NoExecute taint {taint.get('key', '')}" if taint else None


def ask_for_checkpoint(draft: Draft, current: Sequence[PodState]) -> CheckpointAsk | None:
    """While the attempt runs on a node with a notice (``draft.notices``): the request to make, or, once the
    controller made it (``draft.checkpoint_answer``), what its answer means for the status. Returns the request
    the controller is to make, if any."""
    ask, answer = _due(draft, current, draft.notices), draft.checkpoint_answer
    if ask is None:
        return None
    if answer is None or answer.ask != ask:
        return ask
    if answer.error is None:
        step = int((draft.status.get("progress") or {}).get("step", 0))
        nodes = [*_asked(draft), ask.node][-MAX_NODES_KEPT:]
        draft.status["checkpointRequest"] = {"attempt": draft.attempt, "node": ask.node, "reason": ask.notice,
                                             "time": isoformat(draft.now), "step": step, "nodes": nodes}
        draft.events.append(Event("Normal", Reason.CHECKPOINT_REQUESTED,
                                  f"node {ask.node} {ask.notice}: asked the trainer to checkpoint now (step {step})"))
    else:
        draft.events.append(Event("Warning", Reason.CHECKPOINT_REQUEST_FAILED,
                                  f"node {ask.node} {ask.notice}, but rank 0 could not be asked to checkpoint: "
                                  f"{answer.error}; asking again in {RETRY_SECONDS:.0f}s"))
        draft.requeue(RETRY_SECONDS)
    return None


def _due(draft: Draft, current: Sequence[PodState], notices: Mapping[str, str]) -> CheckpointAsk | None:
    """The node notice not yet acted on in this attempt, for a running built-in trainer that checkpoints."""
    spec = draft.job.spec
    if draft.status.get("phase") != Phase.RUNNING or spec.trainer is None or spec.checkpoint.claim_name is None:
        return None
    asked = set(_asked(draft))
    if len(asked) >= MAX_NODES_KEPT:
        return None
    node = min((p.node for p in current if p.node and p.node in notices and p.node not in asked and not p.finished),
               default=None)
    return CheckpointAsk(node, notices[node]) if node is not None else None


def _asked(draft: Draft) -> list[str]:
    """The nodes whose notice this attempt was already asked to checkpoint for."""
    done = draft.status.get("checkpointRequest") or {}
    return list(done.get("nodes") or []) if done.get("attempt") == draft.attempt else []
