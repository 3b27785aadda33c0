"""kopf's settings for this operator: what it watches and keeps, and what it logs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import kopf

if TYPE_CHECKING:
    from kubetrain.k8s.kube import Kube

from kubetrain.core import api
from kubetrain.k8s.transport import LIST_PAGE

__all__ = ["WORKER_IDLE_S", "configure", "scanning_needed"]

WORKER_IDLE_S = 0.1  # seconds kopf keeps an object's worker (and its last event) after the object goes quiet


class _NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every watched object at every event to diff it against the state its change handlers
    last saw: the operator has no change handlers (tests/operator_rights.py checks), so nothing is kept."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class _NoSuccessLines(logging.Filter):
    """kopf logs "Handler 'job_changed' succeeded." at INFO after every job event (the handler never fails: a failed
    reconcile is retried by our queue and logged then): 250 lines that say nothing in a burst of 50 jobs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Handler 'job_changed' succeeded."


def configure(settings: kopf.OperatorSettings) -> None:
    # Reconnect watches well before proxies or the API server drop idle connections.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.persistence.diffbase_storage = _NoDiffBase()
    # kopf lists the jobs at start and again whenever its watch falls too far behind (410 Gone: a watch that was
    # too slow for a burst's events is dropped by the API server): unpaged, 2,000 jobs were one 9.8 MB answer
    # held whole, and 40 MB of objects parsed from it, in an operator that keeps about 12 KiB a job otherwise.
    settings.watching.chunk_size = LIST_PAGE
    # Events on our own objects say who posted them.
    settings.posting.reporting_component = api.OPERATOR_COMPONENT
    logging.getLogger("kopf.objects").addFilter(_NoSuccessLines())
    # kopf keeps a worker per object for idle_timeout (5 s) after its last event, holding that event's body:
    # 1,000 jobs created in 10 s kept nearly all of them alive at once, and the memory freed afterwards stayed
    # fragmented (RSS 75 MiB, against 62 MiB with 0.5 s and 60 MiB with 0.1 s). A later event of the job
    # starts a new worker: tens of microseconds, against milliseconds to handle the event.
    settings.queueing.idle_timeout = WORKER_IDLE_S
    # kopf never retries on.event handlers: a failed reconcile is retried by our queue (see
    # handlers._reconcile_measured); this only covers errors of kopf's own machinery.
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)


async def scanning_needed(kube: Kube) -> bool:
    """Whether kopf must watch the cluster's CRDs: to start serving TrainingJobs when their CRD appears.
    Otherwise it need not: it would hold a watch on every CRD, whole objects (a large CRD is megabytes of
    schema), and the operator's RSS grew 3.4 MiB (51 to 54) when another operator's CRDs were installed. A CRD
    installed later, or unreadable discovery, keeps the watch on. (kopf never watches namespaces here: see
    OperatorConfig.namespace_patterns.)"""
    try:
        return not await kube.serves_jobs()
    except Exception as error:  # cannot tell now: kopf's watch finds the CRD when it can
        logging.getLogger("kubetrain").info("API discovery failed (%s): watching CRDs for ours", error)
        return True
