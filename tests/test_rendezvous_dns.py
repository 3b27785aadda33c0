"""Node 0 hosts torchrun's rendezvous store whatever the cluster DNS answers in its first seconds.

Left to itself, torchrun makes node 0 the host only when the endpoint ``<job>-0.<job>`` resolves to one of
its own addresses; a lookup refused at that moment (a record not yet published, a DNS server under load)
makes every agent a client of a store nobody serves, and the gang waits rendezvousTimeoutSeconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.procs import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]
Json = Any

# Longer than the two pods' start-up skew, so that node 0's own first lookups fall inside it.
HIDDEN_S = 12
# Far longer than the test waits: on the old launch the gang sat out this whole timeout before failing.
RENDEZVOUS_TIMEOUT_S = 600

# A real collective over gloo: the workers find rank 0 through MASTER_ADDR, node 0's name, after the rendezvous.
ALL_REDUCE = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "total = torch.ones(1)\n"
    "dist.all_reduce(total)\n"
    "assert total.item() == dist.get_world_size() == 2, total\n"
    "print('all-reduced', total.item(), flush=True)\n"
    "dist.destroy_process_group()\n"
)


def _pod_ips(jobs: Jobs, name: str, count: int) -> dict[str, str]:
    """Pod name to IP once ``count`` pods of the job have one (they keep it until they end)."""
    found: dict[str, str] = {}

    def placed() -> bool:
        found.update({p["metadata"]["name"]: p["status"]["podIP"] for p in jobs.pods(name)
                      if p.get("status", {}).get("podIP")})
        return len(found) >= count
    wait_for(placed, 120, f"{count} pods of {name} with an IP", interval=0.2)
    return found


def test_the_gang_forms_when_node_0_cannot_resolve_its_own_name_at_start(lab: Lab, jobs: Jobs,
                                                                         namespace: str) -> None:
    name = "late-dns"
    hidden = lab.hide_dns_name(f"{name}-0.{name}.{namespace}.svc.cluster.local", seconds=HIDDEN_S)
    jobs.create(name, {
        "nodes": 2,
        "procsPerNode": 1,
        "resources": {"cpu": "100m", "memory": "1Gi", "sharedMemory": "64Mi"},
        "command": ["python", "-c", ALL_REDUCE],
        "failurePolicy": {"rendezvousTimeoutSeconds": RENDEZVOUS_TIMEOUT_S},
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    })
    ips = _pod_ips(jobs, name, 2)
    # A quarter of the rendezvous timeout: on the old launch the job was still waiting then (and later failed).
    status = jobs.wait_phase(name, "Succeeded", timeout=RENDEZVOUS_TIMEOUT_S / 4)

    assert ips[f"{name}-0"] in hidden.refused_clients, (
        f"node 0 ({ips}) never asked for its own name while it was hidden (refused: {hidden.refused_clients}): "
        "the test did not reproduce the race")
    assert status.get("restarts", 0) == 0 and not status.get("failures"), status
    assert "all-reduced 2.0" in lab.pod_log(namespace, f"{name}-0").read_text()
