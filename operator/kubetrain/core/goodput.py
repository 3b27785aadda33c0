"""Goodput: where a job's wall time went, in status.goodput (pure: the stored status before a reconcile and the one
it decided in, the goodput out).

Every reconcile adds the whole seconds since ``accountedAt`` to the bucket of the state the job was in, as the
stored status says (the state in which it spent them), and moves ``accountedAt`` to now:

- ``queued``: no phase yet (the operator had not seen it), Queued (Kueue), Suspended (held without pods, whoever
  holds it: Kueue's own job integrations queue by suspending), Pending (pods waiting for the scheduler);
- ``starting``: Starting, and Running until rank 0 of the attempt has been read (a read that keeps failing, as for
  a program that serves no metrics, counts as read: its time is training that cannot be seen);
- ``restarting``: a gang restart, from the failure until the next attempt's rank 0 is read (Restarting, then that
  attempt's Pending, Starting and unread Running); a restart in place likewise, at the same attempt;
- ``training``: Running, rank 0 read.

A restart also looks back: the time since the last heartbeat of a stall moves from training to ``stalled``, and the
time spent on steps after the last checkpoint (since the checkpoint was seen, or since the attempt began training if
it saw none) moves from training to ``lost``: those steps are computed again. So the buckets always add up to the
time accounted, from the job's creation (the first reconcile counts its wait for the operator as queued) to its
end: a finished job stops counting. Times are whole seconds of RFC 3339 timestamps, as Kubernetes keeps them, so
the sum is exactly completionTime - creationTimestamp. A clock that goes back counts nothing until it is past
``accountedAt`` again. ``attemptTrainingSeconds`` is the current attempt's training, the most a restart can move.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from kubetrain.core.api import ConditionType, Phase, Reason
from kubetrain.core.status import isoformat, parse_time
from kubetrain.core.status_policy import Draft

__all__ = ["BUCKETS", "REFRESH_SECONDS", "account", "record_goodput", "worth_writing"]

Json = Any

BUCKETS = ("queued", "starting", "training", "stalled", "restarting", "lost")
_WAITING = (None, Phase.QUEUED, Phase.SUSPENDED)
_THIS_ATTEMPT = "attemptTrainingSeconds"
# A status that differs from the stored one in its goodput only is written when the stored goodput is this old: a
# job that waits (Queued, Suspended, Pending) writes nothing at each resync. The accounting loses nothing by it (it
# counts from the stored accountedAt), and the operator's metric shows the live figures.
REFRESH_SECONDS = 300


def record_goodput(draft: Draft, stored: Mapping[str, Json]) -> None:
    """Put in ``draft`` the goodput of its decision, made from the ``stored`` status."""
    goodput = account(stored, draft.status, now=draft.now, created=draft.job.created)
    if goodput is not None:
        draft.status["goodput"] = goodput


def account(before: Mapping[str, Json], after: Mapping[str, Json], *, now: datetime,
            created: str | None = None) -> dict[str, Json] | None:
    """status.goodput after a reconcile at ``now`` that decided ``after`` from the stored ``before``; ``created``:
    the job's creationTimestamp, where a job seen for the first time starts counting. None: nothing to keep (a
    job that had finished before it was ever accounted)."""
    stored = before.get("goodput")
    if before.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
        return dict(stored) if isinstance(stored, Mapping) else None
    goodput = _buckets(stored)
    moment = parse_time(isoformat(now))
    assert moment is not None
    since = parse_time(goodput.get("accountedAt"))
    if since is None:  # first seen: from its creation, unless it has a past that was never accounted (an upgrade)
        since = (parse_time(created) if not before.get("phase") else None) or moment
    elapsed = max(0, int((moment - since).total_seconds()))
    bucket = _bucket(before)
    goodput[f"{bucket}Seconds"] += elapsed
    if bucket == "training":
        goodput[_THIS_ATTEMPT] += elapsed
    if _restarted(before, after) or after.get("phase") == Phase.FAILED:
        _look_back(goodput, before, after, moment)
    goodput["accountedAt"] = isoformat(max(since, moment))
    return _with_share(goodput)


# Figures that grow with time alone, recomputed at every reconcile: a running job that changes nothing else would
# write its status at each one (every 10 s: 6 writes a minute a job, the most of a quiet cluster's status writes).
ACCRUED = ("goodput", "gpuSeconds")


def worth_writing(before: Mapping[str, Json], after: Mapping[str, Json]) -> bool:
    """Whether ``after`` is worth a status write over the stored ``before``: not when only its accrued figures
    (goodput, GPU-seconds) moved, and the goodput by less than REFRESH_SECONDS."""
    if _unaccrued(before) != _unaccrued(after):
        return True
    old, new = before.get("goodput"), after.get("goodput")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return old != new
    since, until = parse_time(old.get("accountedAt")), parse_time(new.get("accountedAt"))
    if since is None or until is None:
        return old != new
    return (until - since).total_seconds() >= REFRESH_SECONDS


def _unaccrued(status: Mapping[str, Json]) -> dict[str, Json]:
    return {key: value for key, value in status.items() if key not in ACCRUED}


def _buckets(stored: Json) -> dict[str, Json]:
    """The stored goodput with every bucket a whole number of seconds (missing or broken ones start at 0)."""
    stored = stored if isinstance(stored, Mapping) else {}
    goodput: dict[str, Json] = {}
    for key in (*(f"{b}Seconds" for b in BUCKETS), _THIS_ATTEMPT):
        value = stored.get(key)
        goodput[key] = max(0, int(value)) if isinstance(value, int | float) and not isinstance(value, bool) else 0
    if isinstance(stored.get("accountedAt"), str):
        goodput["accountedAt"] = stored["accountedAt"]
    return goodput


def _bucket(status: Mapping[str, Json]) -> str:
    """The bucket of the time a job spends in the state ``status`` says."""
    phase = status.get("phase")
    if phase in _WAITING:
        return "queued"
    if phase == Phase.RUNNING and _progress_read(status):
        return "training"
    if phase == Phase.RESTARTING or _after_a_restart(status):
        return "restarting"
    return "queued" if phase == Phase.PENDING else "starting"


def _progress_read(status: Mapping[str, Json]) -> bool:
    """Whether rank 0 of the current attempt was read (ProgressKnown is reset to NotScrapedYet by a new attempt)."""
    known = _condition(status, ConditionType.PROGRESS_KNOWN)
    return known is not None and (known.get("status") == "True" or known.get("reason") == Reason.SCRAPE_FAILED)


def _after_a_restart(status: Mapping[str, Json]) -> bool:
    """Whether a gang restart began the current attempt (its post-mortem is the last one, of the attempt before;
    a resumed or re-admitted attempt follows no post-mortem), or the kubelet restarted its pods in place since."""
    failures = status.get("failures") or []
    last = failures[-1] if failures and isinstance(failures[-1], Mapping) else {}
    attempt = int(status.get("attempt", 0))
    return last.get("attempt") == attempt - 1 or _in_place(last)


def _restarted(before: Mapping[str, Json], after: Mapping[str, Json]) -> bool:
    """Whether this reconcile began a new attempt, or found pods of this one restarted in place."""
    if int(after.get("attempt", 0)) != int(before.get("attempt", 0)):
        return True
    return any(_in_place(f) for f in _new_records(before, after))


def _new_records(before: Mapping[str, Json], after: Mapping[str, Json]) -> list[Json]:
    """The failure records this reconcile added."""
    return [f for f in after.get("failures") or [] if f not in (before.get("failures") or [])]


def _in_place(record: Json) -> bool:
    return isinstance(record, Mapping) and record.get("recovery") == Reason.IN_PLACE_RESTART


def _look_back(goodput: dict[str, Json], before: Mapping[str, Json], after: Mapping[str, Json],
               moment: datetime) -> None:
    """A new attempt, a restart in place, or the end: this attempt's training since a stall began was stalled, and,
    at a restart, the training since the last checkpoint is lost (computed again after it)."""
    new = _new_records(before, after)
    trained = goodput[_THIS_ATTEMPT]
    goodput[_THIS_ATTEMPT] = 0
    if any(isinstance(f, Mapping) and f.get("reason") == Reason.STALLED for f in new):
        stalled = min(trained, _seconds_since(_last_sign(before), moment))
        goodput["stalledSeconds"] += stalled
        goodput["trainingSeconds"] -= stalled
        trained -= stalled
        moment -= timedelta(seconds=stalled)  # the lost steps were those before the stall
    if after.get("phase") != Phase.RESTARTING or not new:
        return  # a resumed or re-admitted attempt is no restart; a failed job recomputes nothing
    checkpoint = parse_time((before.get("lastCheckpoint") or {}).get("time"))
    lost = min(trained, _seconds_since(checkpoint, moment))
    goodput["lostSeconds"] += lost
    goodput["trainingSeconds"] -= lost


def _last_sign(status: Mapping[str, Json]) -> datetime | None:
    """The last sign of life of a stalled attempt: its last heartbeat, or when it started running."""
    signs = [parse_time(status.get("runningTime")), parse_time((status.get("progress") or {}).get("heartbeatTime"))]
    known = [s for s in signs if s is not None]
    return max(known) if known else None


def _seconds_since(moment: datetime | None, now: datetime) -> int:
    """Whole seconds from ``moment`` to ``now``; all of them (no bound) when there is no such moment."""
    if moment is None:
        return 2**62
    return max(0, int((now - moment).total_seconds()))


def _with_share(goodput: dict[str, Json]) -> dict[str, Json]:
    """``share``: training over all the time accounted, and as ``shareText`` ("87%") for kubectl's column."""
    total = sum(goodput[f"{b}Seconds"] for b in BUCKETS)
    share = goodput["trainingSeconds"] / total if total else 0.0
    goodput["share"] = round(share, 4)
    goodput["shareText"] = f"{100 * goodput['trainingSeconds'] // total if total else 0}%"  # floored: 100% is all
    return goodput


def _condition(status: Mapping[str, Json], kind: str) -> Mapping[str, Json] | None:
    return next((c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == kind), None)
