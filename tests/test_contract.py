"""The operator's pods and the trainer image agree: env names, ports, config shape, defaults, entrypoint.

The trainer cannot import the operator (it runs in its own image), so the contract is written twice;
these tests keep the two copies in step.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from kubetrain.core import api
from kubetrain.core.manifests import RUN_AS_USER, build_pod
from kubetrain.core.spec import parse
from kubetrain_trainer import checkpoint as trainer_checkpoint
from kubetrain_trainer import config as trainer_config
from kubetrain_trainer import exposition as trainer_exposition
from kubetrain_trainer import rejoin as trainer_rejoin
from kubetrain_trainer import stacks as trainer_stacks
from tests.invalid_specs import base_job

ROOT = Path(__file__).parent.parent
EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml")) if "trainer:" in p.read_text()]


def test_env_names_and_ports_match() -> None:
    assert trainer_config.CONFIG_ENV == api.ENV.CONFIG
    assert trainer_config.CHECKPOINT_DIR_ENV == api.ENV.CHECKPOINT_DIR
    assert trainer_config.DATA_DIR_ENV == api.ENV.DATA_DIR
    assert trainer_config.METRICS_PORT_ENV == api.ENV.METRICS_PORT
    assert trainer_rejoin.REJOIN_TIMEOUT_ENV == api.ENV.REJOIN_TIMEOUT
    assert trainer_config.DEFAULT_METRICS_PORT == api.METRICS_PORT
    assert trainer_stacks.STACKS_PATH == api.STACKS_PATH
    assert trainer_exposition.CHECKPOINT_PATH == api.CHECKPOINT_PATH


def test_the_status_names_the_checkpoint_directory_the_trainer_writes() -> None:
    found = trainer_checkpoint.STEP_DIR.match(api.checkpoint_dir(123))
    assert found is not None and int(found.group(1)) == 123


def _pod_env(document: dict) -> dict[str, str]:  # type: ignore[type-arg]
    pod = build_pod(parse(document), 0, 0)
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_trainer_accepts_the_config_the_operator_passes(path: Path) -> None:
    env = _pod_env(yaml.safe_load(path.read_text()))
    parsed = trainer_config.parse_config(json.loads(env[api.ENV.CONFIG]), env)
    assert parsed.checkpoint.path == env[api.ENV.CHECKPOINT_DIR]


def test_crd_defaults_are_the_trainers_defaults() -> None:
    document = base_job()
    document["spec"]["trainer"] = {"task": "digits", "maxSteps": 10}
    from_crd = trainer_config.parse_config(json.loads(_pod_env(document)[api.ENV.CONFIG]), {})
    from_trainer = trainer_config.parse_config({"trainer": {"task": "digits", "maxSteps": 10}}, {})
    assert asdict(from_crd.trainer) == asdict(from_trainer.trainer)
    assert asdict(from_crd.data) | {"path": None} == asdict(from_trainer.data) | {"path": None}
    assert asdict(from_crd.checkpoint) == asdict(from_trainer.checkpoint)


def test_trainer_image_runs_what_the_pods_ask_for() -> None:
    dockerfile = (ROOT / "trainer_image" / "Dockerfile").read_text()
    pod = build_pod(parse(base_job()), 0, 0)
    container = pod["spec"]["containers"][0]
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (.+)$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == container["command"]
    assert command == container["args"]
    assert re.search(rf"^USER {RUN_AS_USER}(:{RUN_AS_USER})?$", dockerfile, re.M)
    exposed = set(re.search(r"^EXPOSE (.+)$", dockerfile, re.M).group(1).split())  # type: ignore[union-attr]
    assert {str(api.METRICS_PORT), str(api.RENDEZVOUS_PORT)} <= exposed
