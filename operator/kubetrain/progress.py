"""Training progress from the trainer's Prometheus endpoint (rank 0 of pod 0).

The trainer all-reduces its loss and keeps one global step counter, so any rank's endpoint speaks
for the whole job; the operator reads local rank 0 of pod 0 (port api.METRICS_PORT).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kubetrain import api
from kubetrain.status import Progress

__all__ = ["fetch_progress", "parse_progress"]

# How long one scrape may take: the reconcile loop must never wait on a slow trainer.
SCRAPE_TIMEOUT_SECONDS = 3.0


def _samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # One rank per endpoint: the first sample of a name is the one.
            values.setdefault(sample.name, sample.value)
    return values


def parse_progress(text: str) -> Progress | None:
    """Progress from a metrics page; None when the page has no training step yet."""
    values = _samples(text)
    step = values.get("trainer_step")
    if step is None:
        return None

    def optional(name: str) -> float | None:
        value = values.get(name)
        return value if value is not None and not math.isnan(value) else None

    total = optional("trainer_total_steps")
    heartbeat = optional("trainer_last_step_timestamp_seconds")
    checkpoint = optional("trainer_checkpoint_last_step")
    resumed = optional("trainer_resumed_from_step")
    epoch = optional("trainer_epoch")
    steps_timed = optional("trainer_step_duration_seconds_count")
    time_in_steps = optional("trainer_step_duration_seconds_sum")
    return Progress(
        step=int(step),
        total_steps=int(total) if total else None,
        epoch=int(epoch) if epoch is not None else None,
        loss=values.get("trainer_loss_last"),
        samples_per_second=optional("trainer_samples_per_second"),
        heartbeat=datetime.fromtimestamp(heartbeat, UTC) if heartbeat else None,
        checkpoint_step=int(checkpoint) if checkpoint is not None and checkpoint >= 0 else None,
        # The trainer says -1 for a fresh start: that is "resumed from step 0".
        resumed_from_step=max(0, int(resumed)) if resumed is not None else None,
        seconds_per_step=time_in_steps / steps_timed if steps_timed and time_in_steps is not None else None,
    )


async def fetch_progress(session: aiohttp.ClientSession, pod_ip: str, port: int = api.METRICS_PORT) -> Progress | None:
    """Scrape one endpoint; None when the trainer is not serving yet (connection refused, timeout)."""
    url = f"http://{pod_ip}:{port}/metrics"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)) as response:
            if response.status != 200:
                return None
            return parse_progress(await response.text())
    except (aiohttp.ClientError, TimeoutError):
        # Expected while the trainer starts or after it exits; the stall check covers a silent trainer.
        return None
