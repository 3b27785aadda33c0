"""The one free-port helper: ports below the kernel's ephemeral range, free when chosen."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kubetrain.cli import ports


def test_ports_come_from_below_the_kernels_ephemeral_range_and_the_node_port_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        base = ports.free_port_range(4)
        assert base >= 20000 and base + 3 < min(low, 30000)


def test_a_taken_port_is_never_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("20006\t60999\n")  # leaves 20000-20005 to choose from
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", ephemeral)
    held = []
    try:
        for port in (20000, 20001, 20003):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(listener)
            try:
                listener.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip(f"port {port} is in use on this machine")
        chosen = {ports.free_port_range(2) for _ in range(30)}
        assert chosen == {20004}
    finally:
        for listener in held:
            listener.close()


def test_without_room_below_the_range_the_kernel_picks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", ephemeral)
    port = ports.free_port()
    assert 1024 <= port <= 65535
