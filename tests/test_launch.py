"""The one launch builder: pods and `kubetrain run` start the program the same way."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.cli.local import plan_local_run
from kubetrain.core import api
from kubetrain.core.manifests import build_pod
from kubetrain.core.naming import pod_name
from kubetrain.core.spec import TrainingJob, parse

ROOT = Path(__file__).resolve().parent.parent

# Facts that differ between a pod and a local agent by design (see launch.Placement).
PLACEMENT = {api.ENV.RDZV_ENDPOINT, api.ENV.METRICS_PORT, api.ENV.CHECKPOINT_DIR, api.ENV.DATA_DIR}


def _example(name: str) -> TrainingJob:
    return parse(yaml.safe_load((ROOT / "examples" / name).read_text()))


def _pod_values(job: TrainingJob, index: int) -> dict[str, str]:
    container = build_pod(job, index, attempt=0)["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_a_pod_and_a_local_agent_get_the_same_launch(tmp_path: Path) -> None:
    job = _example("trainingjob-cpu.yaml")
    plan = plan_local_run(job, tmp_path, rendezvous_port=29500, metrics_port=9500)
    for index, local in enumerate(plan.environments):
        pod = _pod_values(job, index)
        # A lost pod is replaced, and its peers wait for it; a local run's processes are not.
        shared = {name for name in pod if name.startswith(("PET_", "KUBETRAIN_", "TORCH_"))} - PLACEMENT - {
            api.ENV.REJOIN_TIMEOUT, api.ENV.LOCAL_ADDR}
        assert shared, "the pod has no launch variables"
        assert {name: local.get(name) for name in shared} == {name: pod[name] for name in shared}


def test_the_program_is_the_same_in_a_pod_and_locally(tmp_path: Path) -> None:
    job = _example("trainingjob-cpu.yaml")
    pod_args = build_pod(job, 0, attempt=0)["spec"]["containers"][0]["args"]
    local_command = plan_local_run(job, tmp_path, 29500, 9500).commands[0]
    assert list(local_command[-len(pod_args):]) == pod_args


def test_an_elastic_gang_can_lose_every_node_its_range_allows() -> None:
    document = yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text())
    fixed = _pod_values(parse(document), 0)
    assert fixed[api.ENV.MAX_RESTARTS] == "0" and "last_call" not in fixed[api.ENV.RDZV_CONF]
    document["spec"] |= {"nodes": 3, "elastic": {"minNodes": 1, "maxNodes": 4},
                         "failurePolicy": {"maxRestarts": 2}}
    elastic = _pod_values(parse(document), 0)
    assert elastic[api.ENV.MAX_RESTARTS] == "5", "its own 2, plus one per node the range lets go"
    assert elastic[api.ENV.RDZV_CONF].split(",") == ["is_host=true", "join_timeout=600", "read_timeout=600",
                                                     "keep_alive_interval=1", "keep_alive_max_attempt=4",
                                                     "last_call_timeout=5"]


@pytest.mark.parametrize(("nodes", "seconds"), [(2, 1), (16, 1), (17, 2), (64, 4), (65, 5), (4096, 5)])
def test_small_gangs_beat_often_so_that_a_lost_agent_is_let_go_soon(nodes: int, seconds: int) -> None:
    # torchrun reads keep_alive_interval as whole seconds; a lost agent goes after 3 missed heartbeats.
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    document = yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text())
    document["spec"] |= {"nodes": nodes}
    conf = _parse_rendezvous_config(_pod_values(parse(document), 1)[api.ENV.RDZV_CONF])
    params = RendezvousParameters("c10d", "job-0.job:29400", "id", nodes, nodes, **conf)
    assert params.get_as_int("keep_alive_interval") == seconds
    assert params.get_as_int("keep_alive_max_attempt") == 4, "beats go 1-2 intervals apart: 4 misses leave 2 of slack"


def _agent_name(job: TrainingJob, index: int, bin_dir: Path, pid: int = 1) -> Any:
    """torch's name for node ``index``'s agent (its _NodeDesc) in one run of its container, whose torchrun has
    ``pid``: the container's command runs with a ``torchrun`` in ``bin_dir`` that prints the name it was given."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    container = build_pod(job, index, attempt=0)["spec"]["containers"][0]
    fqdn = f"{job.name}-{index}.{job.name}.default.svc.cluster.local"  # torch's default: socket.getfqdn()
    fake = bin_dir / "torchrun"
    fake.write_text(f'#!/bin/sh\necho "${{{api.ENV.LOCAL_ADDR}:-{fqdn}}}"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", api.ENV.POD_NAME: pod_name(job.name, index)}
    run = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True,
                         check=True)
    return _NodeDesc(run.stdout.strip(), pid, 0)


def test_every_run_of_an_agent_is_a_new_member_of_the_rendezvous_and_node_0_stays_rank_0(tmp_path: Path) -> None:
    # torch names an agent by FQDN and pid; a replacement pod, or a pod restarted in place by its kubelet, has both
    # in a container, and would be taken for the member that left. torch ranks the agents by name: node 0 must
    # still sort first (global rank 0 is read there).
    document = yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text())
    document["spec"] |= {"nodes": 12}
    job = parse(document)
    first = [_agent_name(job, i, tmp_path) for i in range(12)]
    assert _agent_name(job, 1, tmp_path) != first[1]
    assert _agent_name(job, 0, tmp_path) == first[0], "node 0 keeps its FQDN: the workers meet there"
    assert sorted(first)[0] == first[0]
    assert sorted([*first[:3], _agent_name(job, 3, tmp_path), *first[4:]])[0] == first[0]


def _hosts(environments: list[dict[str, str]]) -> list[bool | None]:
    """Each node's is_host, read back as torchrun parses --rdzv-conf and its c10d backend reads it."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    return [RendezvousParameters("c10d", "job-0.job:29400", "id", 1, 1,
                                 **_parse_rendezvous_config(env[api.ENV.RDZV_CONF])).get_as_bool("is_host")
            for env in environments]


@pytest.mark.parametrize("elastic", [None, {"minNodes": 2, "maxNodes": 4}])
def test_node_0_is_told_that_it_hosts_the_rendezvous_store_and_no_other_node_is(
        elastic: dict[str, int] | None, tmp_path: Path) -> None:
    # Left to itself, torchrun decides by resolving the endpoint: a lookup that fails makes node 0 a client too.
    document = yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text())
    document["spec"] |= {"nodes": 3} | ({"elastic": elastic} if elastic else {})
    job = parse(document)
    assert _hosts([_pod_values(job, index) for index in range(3)]) == [True, False, False]
    for attempt in (1, 2):  # a restarted gang's node 0 hosts again
        env = build_pod(job, 0, attempt)["spec"]["containers"][0]["env"]
        assert _hosts([{e["name"]: e["value"] for e in env if "value" in e}]) == [True]
    local = plan_local_run(job, tmp_path, rendezvous_port=29500, metrics_port=9500).environments
    assert _hosts([dict(env) for env in local]) == [True, False, False]
