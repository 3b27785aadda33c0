"""The one launch builder: pods and `kubetrain run` start the program the same way."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubetrain import api
from kubetrain.local import plan_local_run
from kubetrain.manifests import build_pod
from kubetrain.spec import TrainingJob, parse

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
        shared = {name for name in pod if name.startswith(("PET_", "KUBETRAIN_", "TORCH_"))} - PLACEMENT
        assert shared, "the pod has no launch variables"
        assert {name: local.get(name) for name in shared} == {name: pod[name] for name in shared}


def test_the_program_is_the_same_in_a_pod_and_locally(tmp_path: Path) -> None:
    job = _example("trainingjob-cpu.yaml")
    pod_args = build_pod(job, 0, attempt=0)["spec"]["containers"][0]["args"]
    local_command = plan_local_run(job, tmp_path, 29500, 9500).commands[0]
    assert list(local_command[-len(pod_args):]) == pod_args
