"""The names every part of kubetrain agrees on: API group, labels, conditions, env, ports.

This is the one place for contracts shared by the operator, the CRD and the trainer image.
The trainer does not import it (it must run without the operator installed); it keeps its own
copies of the env names and the metrics port, and ``tests/test_contract.py`` keeps both in step.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final

__all__ = [
    "ANNOTATION_PREFIX",
    "CHECKPOINT_PATH",
    "CHECKPOINT_VOLUME",
    "CONTAINER_NAME",
    "DEFAULT_MANAGED_BY",
    "DEFAULT_TRAINER_IMAGE",
    "ENV",
    "GPU_RESOURCE",
    "GROUP",
    "KIND",
    "LABEL",
    "LOG_LINE_PREFIX",
    "LOG_LINE_RANK",
    "METRICS_PORT",
    "PLURAL",
    "PODGROUP",
    "RENDEZVOUS_PORT",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "SHM_VOLUME",
    "SHORT_NAME",
    "SINGULAR",
    "STACKS_PATH",
    "VERSION",
    "ConditionType",
    "GangScheduling",
    "Phase",
    "Reason",
    "checkpoint_dir",
]

GROUP: Final = "kubetrain.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAME: Final = "tj"
DEFAULT_MANAGED_BY: Final = "kubetrain.io/operator"
# Who the operator is to the API server: the source of its Events, and the User-Agent of its requests, which the
# API server takes (up to the "/") as the field manager of what it writes (aiohttp's default made that "Python").
OPERATOR_COMPONENT: Final = "kubetrain-operator"
# The release: tests/test_image_names.py keeps it equal to the chart's appVersion.
RELEASE: Final = "0.1.0"
# The image of jobs that leave spec.image unset, unless the operator is started with another one
# (`kubetrain operator --trainer-image`; the chart passes its `trainer.image`). Its tag is the release.
DEFAULT_TRAINER_IMAGE: Final = f"kubetrain/trainer:{RELEASE}"

# Ports inside every pod. The trainer serves metrics on METRICS_PORT + local rank.
RENDEZVOUS_PORT: Final = 29400
METRICS_PORT: Final = 9400
# Where each rank answers with its main thread's stack (kubetrain_trainer.stacks.STACKS_PATH), on its metrics port.
STACKS_PATH: Final = "/stacks"
# Where rank 0 takes a request to have the gang checkpoint now (kubetrain_trainer.exposition.CHECKPOINT_PATH).
CHECKPOINT_PATH: Final = "/checkpoint"


def checkpoint_dir(step: int) -> str:
    """The directory of the checkpoint of ``step`` under the job's checkpoint path (the trainer's checkpoint.py)."""
    return f"step_{step:09d}"

CONTAINER_NAME: Final = "trainer"
GPU_RESOURCE: Final = "nvidia.com/gpu"
SHM_VOLUME: Final = "dshm"
CHECKPOINT_VOLUME: Final = "checkpoints"
DATA_VOLUME: Final = "data"

# Longest TrainingJob name: pods are "<name>-<index>" (index < MAX_NODES) and must stay DNS labels
# (63 characters); the margin leaves room for "-<index>" and label values built from the name.
MAX_NAME_LENGTH: Final = 50
MAX_NODES: Final = 4096  # the CRD's bound on spec.nodes and the elastic range
# Names a status message or event lists before it says "and N more" (a 4,096-pod gang's names would not fit).
MAX_NAMES_LISTED: Final = 5
# Characters of status.message (the CRD's maxLength: a longer one would have the whole status write refused).
MAX_STATUS_MESSAGE: Final = 1024
# Characters of a condition's message (the CRD allows 32768; a status stays small whatever the job's size).
MAX_CONDITION_MESSAGE: Final = 4096
MAX_FAILURES_KEPT: Final = 20
# Characters of a failed pod's termination message kept in its failure record (the kubelet keeps at most 4096).
LOG_TAIL_CHARS: Final = 2048


class PODGROUP:
    """Kubernetes' own PodGroup (scheduling.k8s.io/v1beta1, served with the GenericWorkload feature gate): the
    default scheduler binds none of a group's pods until it can bind minCount of them."""

    GROUP: Final = "scheduling.k8s.io"
    VERSION: Final = "v1beta1"
    KIND: Final = "PodGroup"
    PLURAL: Final = "podgroups"


class GangScheduling(StrEnum):
    """`kubetrain operator --gang-scheduling`: auto uses PodGroups where the API server serves them."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class LABEL:
    """Label keys on every child object, all under the project's domain."""

    JOB_NAME: Final = f"{GROUP}/job-name"
    JOB_UID: Final = f"{GROUP}/job-uid"
    NODE_INDEX: Final = f"{GROUP}/node-index"
    ATTEMPT: Final = f"{GROUP}/attempt"
    ROLE: Final = f"{GROUP}/role"
    MANAGED_BY: Final = "app.kubernetes.io/managed-by"


ANNOTATION_PREFIX: Final = f"{GROUP}/"


class ENV:
    """Environment variables the operator sets in every trainer container."""

    # torchrun reads PET_<FLAG> for each of its command-line flags.
    NNODES: Final = "PET_NNODES"
    NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
    RDZV_BACKEND: Final = "PET_RDZV_BACKEND"
    RDZV_ENDPOINT: Final = "PET_RDZV_ENDPOINT"
    RDZV_ID: Final = "PET_RDZV_ID"
    RDZV_CONF: Final = "PET_RDZV_CONF"
    MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
    TEE: Final = "PET_TEE"
    SHUTDOWN_TIMEOUT: Final = "PET_SHUTDOWN_TIMEOUT"
    LOG_LINE_PREFIX: Final = "PET_LOG_LINE_PREFIX_TEMPLATE"
    # The agent's name in the rendezvous, which torch makes of the host's FQDN and its pid: a replacement of a
    # lost pod has its FQDN and, in a container, often its pid, and would take the lost agent's place as if it
    # never left. Such pods other than node 0 are named after the pod and its uid (manifests._rendezvous_name).
    LOCAL_ADDR: Final = "PET_LOCAL_ADDR"
    # kubetrain's own contract with the trainer image.
    CONFIG: Final = "KUBETRAIN_CONFIG"  # JSON: {"trainer": ..., "data": ..., "checkpoint": ...}
    JOB_NAME: Final = "KUBETRAIN_JOB_NAME"
    NAMESPACE: Final = "KUBETRAIN_NAMESPACE"
    POD_NAME: Final = "KUBETRAIN_POD_NAME"
    POD_IP: Final = "KUBETRAIN_POD_IP"
    NODE_NAME: Final = "KUBETRAIN_NODE_NAME"  # the machine the pod runs on (a failure's logs say where)
    NODE_INDEX: Final = "KUBETRAIN_NODE_INDEX"
    ATTEMPT: Final = "KUBETRAIN_ATTEMPT"
    METRICS_PORT: Final = "KUBETRAIN_METRICS_PORT"
    CHECKPOINT_DIR: Final = "KUBETRAIN_CHECKPOINT_DIR"
    DATA_DIR: Final = "KUBETRAIN_DATA_DIR"
    # Seconds a worker whose peer was lost stays alive for the replacement; set only where the operator replaces
    # a lost pod alone (launch.lost_pod_wait_seconds).
    REJOIN_TIMEOUT: Final = "KUBETRAIN_REJOIN_TIMEOUT_SECONDS"
    # Where local rank 0 writes its last words; unset in pods (Kubernetes mounts /dev/termination-log).
    TERMINATION_LOG: Final = "KUBETRAIN_TERMINATION_LOG"
    # torch 2.x reuses one TCPStore across torchrun's in-place restarts; restarted workers then read
    # their dead predecessors' addresses and fail to connect. A fresh store per round avoids it.
    NO_SHARED_STORE: Final = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


# Every line a worker prints starts with its global rank (torchrun's --tee 3 and prefix template), so the
# interleaved output of a node's processes can be told apart and filtered (`kubetrain logs --rank`).
LOG_LINE_PREFIX: Final = "[rank${rank}]: "
LOG_LINE_RANK: Final = re.compile(r"^\[rank(\d+)\]: ")

# Users may not set these: they would break rendezvous or the rank arithmetic.
RESERVED_ENV_PREFIXES: Final = ("PET_", "KUBETRAIN_", "TORCHELASTIC_")
RESERVED_ENV_NAMES: Final = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
)


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # in a Kueue queue, not admitted (or evicted): no pods (core/queueing.py)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    STALLED = "Stalled"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # True while the operator's last attempt to act on the job failed and is being retried.
    RECONCILE_ERROR = "ReconcileError"
    # True while rank 0's metrics can be read; False: progress is unknown (never taken for a stall).
    PROGRESS_KNOWN = "ProgressKnown"
    # A job in a Kueue queue: True once Kueue admitted its Workload; False with Kueue's reason while it waits.
    ADMITTED = "Admitted"


class Reason(StrEnum):
    """Machine-readable reasons for conditions, events and failure records."""

    CREATED = "PodsCreated"
    PODS_PENDING = "PodsPending"
    PODS_STARTING = "PodsStarting"
    ALL_RUNNING = "AllPodsRunning"
    MINIMUM_RUNNING = "MinimumPodsRunning"  # an elastic gang trains with minNodes or more while the rest wait
    ALL_SUCCEEDED = "AllPodsSucceeded"
    POD_FAILED = "PodFailed"
    OOM_KILLED = "OOMKilled"
    INVALID_CONFIG = "InvalidTrainerConfig"
    DISRUPTED = "Disrupted"
    POD_REPLACED = "PodReplaced"  # a lost pod made again alone, at the same attempt, while the others wait
    REPLACEMENT_TIMEOUT = "ReplacementTimeout"  # the others gave up waiting for it: the gang restarts, uncounted
    BACKOFF_LIMIT = "BackoffLimitExceeded"
    DEADLINE = "DeadlineExceeded"
    STALLED = "NoHeartbeat"
    SUSPENDED = "SuspendedByUser"
    RESUMED = "Resumed"
    GANG_RESTART = "GangRestart"
    IN_PLACE_RESTART = "InPlaceRestart"  # the kubelet restarted a pod's containers where it stands (same pod)
    SCALED = "Scaled"
    SCALED_DOWN = "ScaledDown"  # an elastic gang let its highest-index pods go and re-rendezvoused in place
    INVALID_POD_SPEC = "InvalidPodSpec"  # the API server refused the pods the spec makes: retrying cannot help
    QUOTA_EXCEEDED = "QuotaExceeded"
    FORBIDDEN = "Forbidden"
    API_UNAVAILABLE = "ApiUnavailable"  # 429, 5xx, timeouts, connection errors
    NAME_TAKEN = "NameTaken"  # an object of the name a child needs exists and is not this job's
    API_ERROR = "ApiError"  # any other refusal, or an error of the operator itself
    RECONCILED = "Reconciled"
    PREVIOUS_JOB_PODS = "PreviousJobPodsTerminating"
    METRICS_SCRAPED = "MetricsScraped"
    SCRAPE_FAILED = "ScrapeFailed"
    NOT_SCRAPED_YET = "NotScrapedYet"  # a new attempt: its rank 0 has not been read yet
    TOO_MANY_DISRUPTIONS = "TooManyDisruptions"
    RENDEZVOUS_TIMEOUT = "RendezvousTimeout"  # the gang did not all join torchrun's rendezvous in time
    # The scheduler cannot place the pods (for a gang: all of them at once); its own message follows.
    UNSCHEDULABLE = "Unschedulable"
    # A node that failed the job repeatedly is avoided by its next pods, or kept (the gang would not fit without
    # it); the user cleared the list (nodes.py).
    NODE_EXCLUDED = "NodeExcluded"
    NODE_KEPT = "NodeNotExcluded"
    NODES_CLEARED = "ExcludedNodesCleared"
    CHECKPOINT_REQUESTED = "CheckpointRequested"  # a node of the attempt announced a disruption (notices.py)
    CHECKPOINT_REQUEST_FAILED = "CheckpointRequestFailed"
