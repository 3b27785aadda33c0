"""The one launch builder: torchrun's arguments and environment for one node of one attempt.

Both the pods (manifests.py) and `kubetrain run` (local.py) start the job's program through this,
so a change to the launch (a new variable, a torchrun setting) reaches both. Everything torchrun
needs travels as the PET_* variables it reads natively, so the command line is just the program.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from kubetrain.core import api
from kubetrain.core.spec import TrainingJob, thaw

__all__ = ["RENDEZVOUS_HOST_INDEX", "Placement", "in_place_restarts", "keep_alive_seconds", "launch_env",
           "lost_pod_wait_seconds", "program_args", "rendezvous_conf", "rendezvous_id", "worker_shutdown_seconds"]

# Seconds torchrun keeps for itself between its workers' deadline and the pod's: it reports and exits in time.
AGENT_EXIT_SECONDS = 2
# How long an elastic rendezvous that has its minNodes waits for more agents before it starts.
ELASTIC_LAST_CALL_SECONDS = 5
# Each agent's heartbeat rewrites the whole rendezvous state (its size grows with the gang): one second more
# between heartbeats per this many nodes, up to torch's own 5 s.
KEEP_ALIVE_NODES_PER_SECOND = 16
TORCH_KEEP_ALIVE_SECONDS = 5
# Heartbeats an agent may miss before the others drop it. torch skips a tick that comes less than an interval
# after the last beat, so beats go 1 to 2 intervals apart: 4 leave a live agent two intervals of slack (for a
# stall, or clocks apart: each agent stamps its own beats), and a lost agent's replacement waits 4-5 s.
KEEP_ALIVE_MISSES = 4


# The node whose agent hosts the rendezvous store: the endpoint names its pod.
RENDEZVOUS_HOST_INDEX = 0


@dataclass(frozen=True)
class Placement:
    """Where one node's agent finds its peers and its storage: the only facts that differ between
    a pod (``<job>-0.<job>``, the pod's volumes) and a local run (127.0.0.1, the work directory)."""

    rendezvous_endpoint: str
    metrics_port: int
    checkpoint_dir: str
    data_dir: str


def rendezvous_id(job: TrainingJob, attempt: int) -> str:
    """Unique per attempt, so that agents of an old attempt can never join a new rendezvous."""
    return f"{job.uid or job.name}-{attempt}"


def program_args(job: TrainingJob) -> list[str]:
    """torchrun's arguments after its flags: the built-in trainer, or the user's command."""
    if job.spec.command is None:
        return ["-m", "kubetrain_trainer"]
    # --no-python: the user's command is an executable (e.g. python train.py), run once per process.
    return ["--no-python", *job.spec.command, *job.spec.args]


def worker_shutdown_seconds(job: TrainingJob) -> int:
    """How long torchrun lets its workers finish after SIGTERM (to write a checkpoint) before SIGKILL.

    torchrun's own default is 30 s whatever the pod's grace period; the job's grace period is the real bound.
    """
    return max(1, job.spec.run_policy.termination_grace_period_seconds - AGENT_EXIT_SECONDS)


def rendezvous_conf(job: TrainingJob, index: int) -> str:
    """torchrun's --rdzv-conf for node ``index``.

    is_host says which agent hosts the store. Left out, each agent resolves the endpoint and compares it with
    its own addresses; a lookup that fails at that moment (a slow DNS server, a record not yet published)
    makes node 0 a client too, and the whole gang waits read_timeout for a store that nobody serves.
    Agents wait join_timeout for the whole gang, then exit with RendezvousTimeoutError (failures.py reads it).
    read_timeout is how long the others wait for node 0 to open the rendezvous store (torch's default 60 s):
    the same bound, or a node 0 that waits minutes for a machine (an autoscaler) fails its peers early.
    An elastic rendezvous that has its minimum waits last_call_timeout for more agents (torch's default 30 s);
    the operator creates a gang's pods at once, so a short last call only sends a straggler to the next round.
    keep_alive_interval: see keep_alive_seconds.
    """
    seconds = job.spec.failure_policy.rendezvous_timeout_seconds
    is_host = "true" if index == RENDEZVOUS_HOST_INDEX else "false"
    widest = job.spec.nodes if job.spec.elastic is None else job.spec.elastic.max_nodes
    conf = (f"is_host={is_host},join_timeout={seconds},read_timeout={seconds},"
            f"keep_alive_interval={keep_alive_seconds(widest)},keep_alive_max_attempt={KEEP_ALIVE_MISSES}")
    if job.spec.elastic is not None:
        conf += f",last_call_timeout={ELASTIC_LAST_CALL_SECONDS}"
    return conf


def keep_alive_seconds(nodes: int) -> int:
    """Seconds between an agent's rendezvous heartbeats, for a gang of up to ``nodes`` nodes.

    A lost agent leaves the rendezvous after KEEP_ALIVE_MISSES missed heartbeats, and the survivors can take in
    its replacement (failures.replace_lost_pods) only then: torch's 5 s would make that 20 s, longer than this
    lab's whole gang restart. A small gang beats every second (4 s); a wide one keeps torch's rate, because each
    heartbeat rewrites the whole state, whose size grows with the gang.
    """
    return min(TORCH_KEEP_ALIVE_SECONDS, max(1, math.ceil(nodes / KEEP_ALIVE_NODES_PER_SECOND)))


def in_place_restarts(job: TrainingJob) -> int:
    """torchrun's --max-restarts.

    When a node leaves an elastic gang, every survivor's workers fail on the lost peer and their agent spends
    one in-place restart to re-rendezvous with the nodes left: the range's width is added, so that shrinking
    to minNodes never fails a pod.
    """
    spec = job.spec
    width = spec.elastic.max_nodes - spec.elastic.min_nodes if spec.elastic is not None else 0
    return spec.failure_policy.max_restarts + width


def lost_pod_wait_seconds(job: TrainingJob) -> int | None:
    """How long the other nodes wait for a lost pod's replacement; None when a lost pod restarts the gang.

    A lost pod is replaced alone, at the same attempt (failures.replace_lost_pods), only where the others wait
    for it alive: the built-in trainer on more than one node (a user's program exits on the lost peer). It
    resumes with them from the claim every pod of such a job mounts (spec.py requires one). The wait spans
    the lost pod's grace period, then the replacement's placement and start, which any joining agent gets
    (rendezvousTimeoutSeconds).
    """
    spec = job.spec
    if spec.command is not None or spec.nodes < 2:
        return None
    return spec.run_policy.termination_grace_period_seconds + spec.failure_policy.rendezvous_timeout_seconds


def launch_env(job: TrainingJob, index: int, attempt: int, placement: Placement) -> dict[str, str]:
    """The variables every agent of node ``index`` gets (the user's own env comes after, from the caller)."""
    spec = job.spec
    return {
        api.ENV.NNODES: spec.nnodes,
        api.ENV.NPROC_PER_NODE: str(spec.procs_per_node),
        api.ENV.RDZV_BACKEND: "c10d",
        api.ENV.RDZV_ENDPOINT: placement.rendezvous_endpoint,
        api.ENV.RDZV_ID: rendezvous_id(job, attempt),
        api.ENV.RDZV_CONF: rendezvous_conf(job, index),
        api.ENV.MAX_RESTARTS: str(in_place_restarts(job)),
        api.ENV.SHUTDOWN_TIMEOUT: str(worker_shutdown_seconds(job)),
        api.ENV.TEE: "3",  # both streams of every worker, through torchrun, with the prefix below
        api.ENV.LOG_LINE_PREFIX: api.LOG_LINE_PREFIX,
        # torchrun copies the workers' lines to its stdout without flushing: unbuffered, or `kubectl logs`
        # shows them only when the pod ends (the project's images set it too; a user's image may not).
        "PYTHONUNBUFFERED": "1",
        api.ENV.NO_SHARED_STORE: "1",
        api.ENV.JOB_NAME: job.name,
        api.ENV.NODE_INDEX: str(index),
        api.ENV.ATTEMPT: str(attempt),
        api.ENV.METRICS_PORT: str(placement.metrics_port),
        api.ENV.CHECKPOINT_DIR: placement.checkpoint_dir,
        api.ENV.DATA_DIR: placement.data_dir,
        api.ENV.CONFIG: json.dumps(thaw(spec.trainer_config), sort_keys=True, separators=(",", ":")),
    }
