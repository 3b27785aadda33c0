"""One scrape of the trainer's metrics endpoint (rank 0 of pod 0), read by core/progress.py."""

from __future__ import annotations

import aiohttp

from kubetrain.core import api
from kubetrain.core.progress import read_progress
from kubetrain.core.status import Scrape

__all__ = ["SCRAPE_TIMEOUT_SECONDS", "fetch_progress"]

# How long one scrape may take: the reconcile loop must never wait on a slow trainer.
SCRAPE_TIMEOUT_SECONDS = 3.0


async def fetch_progress(session: aiohttp.ClientSession, pod_ip: str, port: int = api.METRICS_PORT) -> Scrape:
    """Scrape one endpoint; a failed Scrape when it cannot be read (connection refused, timeout, HTTP error)."""
    url = f"http://{pod_ip}:{port}/metrics"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)) as response:
            if response.status != 200:
                return Scrape(error=f"{url} answered HTTP {response.status}")
            return read_progress(await response.text())
    except TimeoutError:
        return Scrape(error=f"{url} did not answer within {SCRAPE_TIMEOUT_SECONDS:.0f}s")
    except (aiohttp.ClientError, UnicodeDecodeError) as error:
        return Scrape(error=f"{url}: {type(error).__name__}: {error}"[:256])
