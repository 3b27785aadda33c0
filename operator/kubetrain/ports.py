"""Free TCP ports on 127.0.0.1: the one helper the CLI, the lab, the tests and the benchmarks share.

The kernel picks the port and the probe socket is closed before the caller binds it, so another process
may take it in between; every caller here starts its server at once, which keeps that window small.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_port_range"]

_HIGHEST_PORT = 65535


def free_port() -> int:
    """One free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port_range(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive free ports (ranks serve metrics on base + local rank)."""
    for _ in range(tries):
        base = free_port()
        if base + count - 1 > _HIGHEST_PORT:
            continue
        if _all_bindable(range(base, base + count)):
            return base
    raise OSError(f"no {count} consecutive free ports on 127.0.0.1 after {tries} tries")


def _all_bindable(ports: range) -> bool:
    probes: list[socket.socket] = []
    try:
        for port in ports:
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probes.append(probe)
            probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for probe in probes:
            probe.close()
