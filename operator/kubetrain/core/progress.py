"""Training progress from the trainer's Prometheus page (rank 0 of pod 0); k8s/scrape.py fetches it.

Global rank 0 serves the job-wide series (all-reduced loss, the global step, samples); torchrun orders the
nodes of a rendezvous by FQDN, so pod 0's local rank 0 is global rank 0, and the operator reads it there
(port api.METRICS_PORT).
The page comes from the user's program and is not trusted: a value that is NaN, infinite, negative or
absurd is left out (see status.in_range), and a page that does not parse is a failed scrape.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from kubetrain.core.status import MAX_SAMPLES_PER_SECOND, MAX_SECONDS_PER_STEP, Progress, Scrape, count, in_range

__all__ = ["parse_progress", "read_progress"]

# The latest heartbeat a datetime can hold (9999-12-31T23:59:59Z).
MAX_TIMESTAMP = 253402300799.0


def _samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # One rank per endpoint: the first sample of a name is the one.
            values.setdefault(sample.name, sample.value)
    return values


def _timestamp(value: float | None) -> datetime | None:
    seconds = in_range(value, 1.0, MAX_TIMESTAMP)  # 0 (no step yet), negative or absurd: no heartbeat
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


def _mean_step_time(values: dict[str, float]) -> float | None:
    steps = in_range(values.get("trainer_step_duration_seconds_count"), 1, math.inf)
    seconds = in_range(values.get("trainer_step_duration_seconds_sum"), 0, math.inf)
    if steps is None or seconds is None:
        return None
    return in_range(seconds / steps, 0, MAX_SECONDS_PER_STEP)


def _progress(values: dict[str, float]) -> Progress | None:
    step = count(values.get("trainer_step"))
    if step is None:  # absent, or not a step at all (NaN, negative, 1e30)
        return None
    loss = values.get("trainer_loss_last")
    # The trainer says -1 for a fresh start: that is "resumed from step 0".
    resumed = values.get("trainer_resumed_from_step")
    return Progress(
        step=step,
        total_steps=count(values.get("trainer_total_steps")) or None,
        epoch=count(values.get("trainer_epoch")),
        loss=loss if isinstance(loss, float) else None,  # NaN and infinities stay: status shows them as text
        samples_per_second=in_range(values.get("trainer_samples_per_second"), 0, MAX_SAMPLES_PER_SECOND),
        # The loop's own heartbeat (alive through evaluations and checkpoint writes); trainers and report()
        # versions without it: the last step's time.
        heartbeat=_timestamp(values.get("trainer_heartbeat_timestamp_seconds",
                                        values.get("trainer_last_step_timestamp_seconds"))),
        checkpoint_step=count(values.get("trainer_checkpoint_last_step")),
        resumed_from_step=0 if resumed == -1 else count(resumed),
        seconds_per_step=_mean_step_time(values),
    )


def read_progress(text: str) -> Scrape:
    """One metrics page as a scrape: its progress (None before the first step), or why it is unreadable."""
    try:
        values = _samples(text)
    except (ValueError, TypeError, IndexError) as error:  # the parser's answers to a malformed page
        return Scrape(error=f"the metrics page does not parse: {error}"[:256])
    return Scrape(progress=_progress(values))


def parse_progress(text: str) -> Progress | None:
    """Progress from a metrics page; None when the page has no training step yet (or does not parse)."""
    return read_progress(text).progress
