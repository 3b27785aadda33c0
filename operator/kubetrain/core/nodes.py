"""Nodes that keep failing one job: which failures point at the node, when the job stops using it, and when it
forgets.

A failure points at its node when the node stopped answering (NotReady or unreachable: the taint manager evicted
the pod), when the kubelet could not give the pod its devices, or when the pod's last words are a device or
driver error (an uncorrectable ECC error, a GPU fallen off the bus, NVML or the GPU container hook failing). The
failure record says so (``nodeFault``). A node with such failures in failurePolicy.excludeNodeAfter distinct
attempts goes into status.excludedNodes, and the job's next pods are not placed there (manifests.build_pod's
``avoid``). Never so many that fewer ready nodes remain than the gang needs: then the node stays usable and the
job says why. The annotation kubetrain.io/clear-excluded-nodes (a time) forgets exclusions and faults up to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubetrain.core import api
from kubetrain.core.api import Reason
from kubetrain.core.status import PodState, isoformat, parse_time, some_names
from kubetrain.core.status_policy import Draft, Event

__all__ = [
    "CLEAR_ANNOTATION",
    "IN_PLACE_FEATURE",
    "MAX_EXCLUDED_NODES",
    "exclude_failing_nodes",
    "excluded_names",
    "excluded_note",
    "forget_cleared",
    "lacks_in_place_restarts",
    "needs_ready_nodes",
    "node_fault",
    "ready_node_names",
]

Json = Any

# Set to a time (RFC 3339): the job forgets the nodes it excluded, and the faults it saw, up to then.
CLEAR_ANNOTATION = f"{api.ANNOTATION_PREFIX}clear-excluded-nodes"
# status.excludedNodes stays small whatever happens (the CRD's maxItems).
MAX_EXCLUDED_NODES = 64

# Pod reasons of a kubelet that could not start the pod with its devices.
_NODE_REASONS = {"UnexpectedAdmissionError": "the kubelet could not give the pod its devices"}
# Last words that name the machine's GPU or driver, not the program (matched case-insensitively, in the part of
# the message a failure record keeps: a whole log's tail would cost milliseconds per pod of a large gang).
_DEVICE_ERRORS = ("uncorrectable ecc", "ecc error", "fallen off the bus", "gpu is lost", "failed to initialize nvml",
                  "nvml: ", "nvidia-container-cli", "driver/library version mismatch",
                  "cuda driver version is insufficient", "no cuda-capable device is detected")
_XID = re.compile(r"\bxid \d+")  # the driver's numbered GPU errors, as dmesg and NVML report them


def node_fault(pod: PodState) -> str | None:
    """Why this failed pod's end points at its node, not at the program; None when it does not."""
    if not pod.node:
        return None
    if pod.node_lost:
        return "the node stopped answering (NotReady or unreachable)"
    if pod.reason in _NODE_REASONS:
        return _NODE_REASONS[pod.reason]
    words = (pod.message or "")[-api.LOG_TAIL_CHARS:]
    lowered = words.lower()
    for marker in _DEVICE_ERRORS:
        if (at := lowered.find(marker)) >= 0:
            return f"device or driver error: {words[at:at + len(marker)]}"
    xid = _XID.search(lowered) if "xid" in lowered else None
    return f"device or driver error: {words[xid.start():xid.end()]}" if xid else None


def needs_ready_nodes(pods: Iterable[PodState], attempt: int) -> bool:
    """Whether a pod of the current ``attempt`` ended in a way that points at its node: this reconcile may
    exclude the node, if the gang still fits. (Once the restart moved to the next attempt, the old pods going
    away are recorded already: no reason to read the nodes again.)"""
    return any(p.attempt == attempt and (p.phase == "Failed" or p.deleting) and node_fault(p) for p in pods)


def excluded_names(status: Mapping[str, Json]) -> list[str]:
    """The nodes the job's next pods must avoid."""
    return [entry["node"] for entry in status.get("excludedNodes") or []]


def _cleared_at(draft: Draft) -> datetime | None:
    text = draft.job.annotations.get(CLEAR_ANNOTATION)
    try:
        return parse_time(text)
    except ValueError:
        return None  # not a time: nothing is forgotten (the CLI writes one)


def forget_cleared(draft: Draft) -> None:
    """Drop the exclusions made up to the clear annotation's time."""
    cleared = _cleared_at(draft)
    excluded = draft.status.get("excludedNodes") or []
    if cleared is None or not excluded:
        return
    kept = [e for e in excluded if (parse_time(e.get("time")) or cleared) > cleared]
    if len(kept) == len(excluded):
        return
    gone = some_names([e["node"] for e in excluded if e not in kept])
    draft.status["excludedNodes"] = kept
    draft.events.append(Event("Normal", Reason.NODES_CLEARED,
                              f"excluded node(s) {gone} cleared by {CLEAR_ANNOTATION}: the next pods may go there"))


def exclude_failing_nodes(draft: Draft, recorded: Sequence[Mapping[str, Json]]) -> None:
    """After the failure records ``recorded`` were added: exclude each node that a fault among them points at
    and that has now failed the job in excludeNodeAfter attempts, unless too few ready nodes would remain."""
    threshold = draft.job.spec.failure_policy.exclude_node_after
    before = list(draft.status.get("excludedNodes") or [])
    excluded = list(before)
    faulty = {r["node"] for r in recorded if r.get("nodeFault")} - {e["node"] for e in excluded}
    if not threshold or not faulty:
        return
    for node in sorted(faulty):
        faults = list(_node_faults(draft, node))
        attempts = {int(r.get("attempt", 0)) for r in faults}
        if len(attempts) < threshold:
            continue
        why = str(faults[-1]["nodeFault"])
        refusal = _refusal(draft, [*(e["node"] for e in excluded), node])
        if refusal is not None:
            draft.events.append(Event("Warning", Reason.NODE_KEPT,
                                      f"node {node} failed this job in {len(attempts)} attempts ({why}), but is "
                                      f"not excluded: {refusal}"))
            continue
        excluded.append({"node": node, "reason": why[:256], "failures": len(attempts), "time": isoformat(draft.now)})
        draft.events.append(Event("Warning", Reason.NODE_EXCLUDED,
                                  f"node {node} excluded from this job's next placements after failures in "
                                  f"{len(attempts)} attempts ({why}); clear with `kubetrain clear-excluded-nodes`"))
    if excluded != before:
        draft.status["excludedNodes"] = excluded


def _node_faults(draft: Draft, node: str) -> Iterable[Mapping[str, Json]]:
    """This node's fault records since the last clear."""
    cleared = _cleared_at(draft)
    for record in draft.status.get("failures") or []:
        if record.get("node") != node or not record.get("nodeFault"):
            continue
        if cleared is None or (parse_time(record.get("time")) or draft.now) > cleared:
            yield record


def _refusal(draft: Draft, excluded: Sequence[str]) -> str | None:
    """Why these exclusions must not be made (None: they may): the gang needs a ready node for each pod."""
    ready = draft.ready_nodes
    if ready is None:
        return "the operator could not list the cluster's nodes to check that the gang would still fit"
    spec = draft.job.spec
    needed = spec.elastic.min_nodes if spec.elastic else spec.nodes
    left = len(ready - set(excluded))
    if left < needed:
        return f"only {left} ready node(s) would be left for the {needed} pod(s) the job needs"
    if len(excluded) > MAX_EXCLUDED_NODES:
        return f"the job already avoids {MAX_EXCLUDED_NODES} nodes, the most it records"
    return None


def excluded_note(status: Mapping[str, Json]) -> str:
    """What a job waiting for placement adds about the nodes it avoids ('' when none)."""
    names = excluded_names(status)
    if not names:
        return ""
    return (f"; this job avoids {len(names)} node(s) after failures there ({some_names(names)}: "
            "status.excludedNodes; `kubetrain clear-excluded-nodes` lets it use them again)")


def ready_node_names(nodes: Iterable[Mapping[str, Json]]) -> frozenset[str]:
    """The nodes (as the API lists them) that are Ready and open to new pods."""
    return frozenset(
        node["metadata"]["name"] for node in nodes
        if not (node.get("spec") or {}).get("unschedulable")
        and any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    )


# What a kubelet that restarts a pod's containers in place declares (status.declaredFeatures, KEP-5328). The
# scheduler places a pod with a RestartAllContainers rule only on a node that declares it.
IN_PLACE_FEATURE = "RestartAllContainersOnContainerExits"


def lacks_in_place_restarts(node: Mapping[str, Json]) -> bool:
    """A node that takes new pods (not cordoned) and whose kubelet does not declare IN_PLACE_FEATURE: a pod with the
    rule could not be placed there (manifests.in_place_rule is then left out)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return IN_PLACE_FEATURE not in ((node.get("status") or {}).get("declaredFeatures") or [])
