"""Free TCP ports on 127.0.0.1: the one helper the CLI, the lab, the tests and the benchmarks share.

A port is chosen at random between 20000 and 29999, below the kernel's ephemeral range, where the kernel never
hands out a port on its own, and probed by binding it. A port the kernel picks (bind to port 0) comes from that
ephemeral range: until the caller binds it, the kernel may give it to any process's outgoing connection or
port-0 listener. A trainer's metrics ports are bound seconds after they are chosen, once torch has loaded, while
torchrun and gloo open port-0 sockets of their own, any of which could take a port picked that way. Another
explicit binder can still take a port in between; the probe only shows that it was free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "free_port_range"]

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default range is 32768-60999
# Not below: kubelet (10248-10259), etcd (2379-2380) and other well-known services live there.
_LOWEST = 20000
_HIGHEST = 29999  # 30000-32767 is Kubernetes' NodePort range, which a node's kube-proxy may hold


def free_port() -> int:
    """One free port."""
    return free_port_range(1)


def free_port_range(count: int, tries: int = 200) -> int:
    """The first of ``count`` consecutive free ports (ranks serve metrics on base + local rank)."""
    highest_base = min(_ephemeral_low() - 1, _HIGHEST) - count + 1
    for _ in range(tries):
        base = random.randint(_LOWEST, highest_base) if highest_base >= _LOWEST else _kernel_pick()
        if _all_bindable(range(base, base + count)):
            return base
    raise OSError(f"no {count} consecutive free ports on 127.0.0.1 after {tries} tries")


def _kernel_pick() -> int:
    """For a machine whose ephemeral range leaves no room below it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


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
