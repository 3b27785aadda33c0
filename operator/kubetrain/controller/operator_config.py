"""The operator's settings (see `kubetrain operator --help`), and which namespaces it serves."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from kubetrain.core import api
from kubetrain.core.judgements import Coalescing

__all__ = ["OperatorConfig", "matches_namespace"]


@dataclass(frozen=True)
class OperatorConfig:
    """Settings from the command line (see `kubetrain operator --help`)."""

    progress_interval: float = 10.0  # seconds between scrapes of a running job's metrics
    trainer_image: str = api.DEFAULT_TRAINER_IMAGE  # image of jobs that leave spec.image unset
    resync_interval: float = 30.0  # every job is reconciled at least this often
    api_connections: int = 16  # concurrent requests to the API server (the aiohttp pool's limit)
    # Reconciles a second on the operator's own schedule (progress reads, resyncs): past it the periods stretch.
    looks_per_second: float = 200.0
    # Kubernetes' own gang scheduling: each attempt gets a PodGroup. auto is resolved at start-up (gangs.py).
    gang_scheduling: api.GangScheduling = api.GangScheduling.AUTO
    # --namespace values when one is a pattern: kopf then watches jobs cluster-wide and these pick ours.
    namespace_patterns: tuple[str, ...] = ()
    all_namespaces: bool = False  # pods are watched cluster-wide (one watch), else namespace by namespace
    coalescing: Coalescing = field(default_factory=Coalescing)  # how long a status change that may wait is held back
    # Jobs reconciled at once for pod changes, timers and the job events queued past passes_at_once: a worker
    # waits mostly on the API, whose connection pool (api_connections) bounds the requests anyway.
    workers: int = 32
    # Passes run at once before a job's own event waits in the queue rather than running in kopf's worker of the
    # job: enough to keep the connections busy in a burst of new jobs, few enough that their memory is not held.
    passes_at_once: int = 512

    @property
    def gangs(self) -> bool:
        """Whether pods are placed as gangs (once start-up has resolved auto, see gangs.resolve)."""
        return self.gang_scheduling is api.GangScheduling.ON

    def serves(self, namespace: str) -> bool:
        """Whether this operator reconciles the jobs of ``namespace`` (kopf watches only such, unless patterns)."""
        return not self.namespace_patterns or any(matches_namespace(namespace, p) for p in self.namespace_patterns)


def matches_namespace(namespace: str, pattern: str) -> bool:
    """``pattern``: comma-separated globs, ``!`` before those that exclude. A namespace matches when no excluding
    glob does and an including one does (a pattern of exclusions only, such as ``!kube-*``, includes the rest)."""
    globs = [glob.strip() for glob in pattern.split(",") if glob.strip()]
    including = [glob for glob in globs if not glob.startswith("!")] or ["*"]
    excluding = [glob[1:] for glob in globs if glob.startswith("!")]
    return (any(fnmatch.fnmatchcase(namespace, glob) for glob in including)
            and not any(fnmatch.fnmatchcase(namespace, glob) for glob in excluding))
