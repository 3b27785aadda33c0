"""The objects a job's pods need besides themselves: its headless Service and, with gang scheduling on, the
PodGroup of each attempt (Kubernetes' own, scheduling.k8s.io/v1beta1); and whether gang scheduling is on.

Each attempt's gang gets a group of its own (naming.pod_group_name): the scheduler's gang policy applies until
a group is first placed, so a restarted gang must be placed whole again under a new group. The earlier
attempt's group goes when the next attempt's pods are made (its pods are gone by then: lifecycle starts an
attempt only once every old pod is gone); the last one goes with the job (owner reference).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from kubetrain.controller.jobstate import HandlerLogger, OperatorState
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.core import api, judgements
from kubetrain.core.manifests import build_pod_group, build_service
from kubetrain.core.naming import pod_group_name
from kubetrain.core.spec import TrainingJob
from kubetrain.k8s.kube import CreateError, Kube

__all__ = ["create_companions", "name_taken", "resolve_gang_scheduling"]

Json = Any
log = logging.getLogger("kubetrain.gangs")


async def resolve_gang_scheduling(config: OperatorConfig, kube: Kube) -> OperatorConfig:
    """``auto`` becomes on where the API server serves PodGroups, else off (also when discovery fails: the pods are
    then placed one by one, as without the API); ``on`` is kept either way (creating a group then fails, and the
    job's status says so)."""
    wanted = config.gang_scheduling
    try:
        served = await kube.serves_pod_groups()
    except Exception as error:
        log.warning("API discovery of %s/%s failed (%s): taken as not served", api.PODGROUP.GROUP,
                    api.PODGROUP.VERSION, error)
        served = False
    if wanted is api.GangScheduling.ON and not served:
        log.warning("--gang-scheduling=on, but the API server does not serve %s/%s podgroups (feature gate "
                    "GenericWorkload): jobs will fail to create them", api.PODGROUP.GROUP, api.PODGROUP.VERSION)
    if wanted is api.GangScheduling.AUTO:
        wanted = api.GangScheduling.ON if served else api.GangScheduling.OFF
    log.info("gang scheduling (%s/%s PodGroups): %s", api.PODGROUP.GROUP, api.PODGROUP.VERSION, wanted)
    return replace(config, gang_scheduling=wanted)


async def create_companions(state: OperatorState, job: TrainingJob, attempt: int, logger: HandlerLogger) -> None:
    """The headless Service; with gang scheduling, the attempt's PodGroup (and the earlier attempt's removed)."""
    await create_companion(state, job, build_service(job), logger)
    if not state.config.gangs:
        return
    await create_companion(state, job, build_pod_group(job, attempt), logger)
    if attempt > 0:
        await state.kube.delete_companion(job.namespace, api.PODGROUP.KIND, pod_group_name(job.name, attempt - 1))


async def create_companion(state: OperatorState, job: TrainingJob, body: Json, logger: HandlerLogger) -> None:
    """Create one object of the job; one of that name left by a deleted job of the same name (--cascade=orphan)
    is replaced."""
    kind, name = body["kind"], body["metadata"]["name"]
    by = judgements.holder(await state.kube.create(job.namespace, body), job_uid=job.uid, job_name=job.name)
    if by is judgements.Holder.PREVIOUS_JOB:
        logger.info("replacing %s %s left by a previous job named %s", kind, name, job.name)
        await state.kube.delete_companion(job.namespace, kind, name)
        by = judgements.holder(await state.kube.create(job.namespace, body), job_uid=job.uid, job_name=job.name)
    if by in (judgements.Holder.PREVIOUS_JOB, judgements.Holder.SOMEONE_ELSE):
        raise name_taken(job, kind.lower(), name, by)


def name_taken(job: TrainingJob, kind: str, name: str, by: judgements.Holder) -> CreateError:
    """A child's name is held by an object that is not this job's: wait for it to go, and say so."""
    return CreateError(f"{kind} {name}", 409, judgements.name_taken_message(kind, name, job.name, by))
