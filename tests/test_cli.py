"""`kubetrain validate | render | run` without a cluster (and render checked by the real API server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kubetrain.cli import main
from kubetrain.local import plan_local_run
from kubetrain.spec import parse
from tests.invalid_specs import base_job
from tests.lab.lab import Lab

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_validate_accepts_every_example() -> None:
    result = CliRunner().invoke(main, ["validate", *map(str, EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert result.output.count("valid TrainingJob") == len(EXAMPLES)


def test_validate_names_the_field_and_what_is_allowed(tmp_path: Path) -> None:
    job = base_job()
    job["spec"]["nodes"] = 0
    job["spec"]["env"] = [{"name": "RANK", "value": "1"}]
    path = write(tmp_path, yaml.safe_dump(job))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{path}: spec.nodes: must be at least 1 (got 0)" in result.output


def test_validate_reports_yaml_syntax_errors_with_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, "apiVersion: kubetrain.io/v1alpha1\nkind: TrainingJob\nspec: [unclosed\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert "YAML syntax error" in result.output and "line 4" in result.output


def test_validate_reports_unknown_fields(tmp_path: Path) -> None:
    job = base_job()
    job["spec"]["trainer"]["maxStep"] = 10
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, yaml.safe_dump(job)))])
    assert result.exit_code == 2
    assert "spec.trainer.maxStep: unknown field" in result.output


def test_validate_checks_every_file_and_fails_if_one_is_bad(tmp_path: Path) -> None:
    good = write(tmp_path, yaml.safe_dump(base_job()), "good.yaml")
    bad = write(tmp_path, "kind: Nope\n", "bad.yaml")
    result = CliRunner().invoke(main, ["validate", str(good), str(bad)])
    assert result.exit_code == 2
    assert "good.yaml: valid" in result.output and "bad.yaml: kind: must be TrainingJob" in result.output


def test_render_prints_the_service_and_one_pod_per_node() -> None:
    result = CliRunner().invoke(main, ["render", str(ROOT / "examples" / "trainingjob-cpu.yaml"), "-n", "ml"])
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.output))
    assert [o["kind"] for o in objects] == ["Service", "Pod", "Pod"]
    assert {o["metadata"]["namespace"] for o in objects} == {"ml"}


def test_render_refuses_an_invalid_file(tmp_path: Path) -> None:
    job = base_job()
    job["spec"]["gpusPerNode"] = 99
    result = CliRunner().invoke(main, ["render", str(write(tmp_path, yaml.safe_dump(job)))])
    assert result.exit_code == 1
    assert "spec.gpusPerNode: must be at most 16" in result.output


def test_run_refuses_gpus_this_machine_lacks() -> None:
    result = CliRunner().invoke(main, ["run", str(ROOT / "examples" / "trainingjob-gpu.yaml")])
    assert result.exit_code == 1
    assert "spec.gpusPerNode" in result.output and "gpusPerNode: 0" in result.output


def test_local_run_plan_has_one_agent_per_node(tmp_path: Path) -> None:
    job = parse(yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text()))
    plan = plan_local_run(job, tmp_path, rendezvous_port=29500, metrics_port=9500)
    assert len(plan.commands) == 2
    command = plan.commands[0]
    assert "--nnodes=2" in command and "--nproc-per-node=2" in command
    assert "--rdzv-endpoint=127.0.0.1:29500" in command and command[-2:] == ("-m", "kubetrain_trainer")
    assert [e["KUBETRAIN_METRICS_PORT"] for e in plan.environments] == ["9500", "9502"]
    assert json.loads(plan.environments[1]["KUBETRAIN_CONFIG"])["trainer"]["task"] == "digits"
    assert plan.checkpoint_dir == tmp_path / "digits" / "checkpoints"


@pytest.mark.lab
def test_rendered_objects_pass_server_side_dry_run(lab: Lab, namespace: str) -> None:
    for example in EXAMPLES:
        result = CliRunner().invoke(main, ["render", str(example), "-n", namespace])
        assert result.exit_code == 0, result.output
        applied = lab.kubectl("apply", "--dry-run=server", "-f", "-", stdin=result.output, check=False)
        assert applied.returncode == 0, f"{example.name}: {applied.stderr}"
