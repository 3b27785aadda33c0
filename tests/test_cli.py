"""`kubetrain validate | render | run` without a cluster (and render checked by the real API server)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kubetrain.__main__ import main as kubetrain_main
from kubetrain.cli.commands import main
from kubetrain.cli.local import plan_local_run
from kubetrain.controller import operator_main
from kubetrain.controller.operator_main import LOG_FORMATS
from kubetrain.core import api
from kubetrain.core.schema import field_problems
from kubetrain.core.spec import parse
from tests.invalid_specs import base_job
from tests.lab.lab import Lab
from tests.operator_cli import launch_operator

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


def _rendered_images(*args: str) -> set[str]:
    result = CliRunner().invoke(main, ["render", *args])
    assert result.exit_code == 0, result.output
    return {o["spec"]["containers"][0]["image"] for o in yaml.safe_load_all(result.output) if o["kind"] == "Pod"}


def test_render_gives_jobs_without_an_image_the_trainer_image(tmp_path: Path) -> None:
    job = str(write(tmp_path, yaml.safe_dump(base_job())))
    assert _rendered_images(job) == {api.DEFAULT_TRAINER_IMAGE}
    assert _rendered_images(job, "--trainer-image", "registry.example.com/kubetrain/trainer:0.1.0") == {
        "registry.example.com/kubetrain/trainer:0.1.0"}


def test_render_keeps_the_jobs_own_image(tmp_path: Path) -> None:
    document = base_job()
    document["spec"]["image"] = "registry.example.com/team/trainer:7"
    job = str(write(tmp_path, yaml.safe_dump(document)))
    assert _rendered_images(job, "--trainer-image", "registry.example.com/kubetrain/trainer:0.1.0") == {
        "registry.example.com/team/trainer:7"}


@pytest.mark.parametrize("command", ["render", "operator"])
@pytest.mark.parametrize(("image", "problem"), [("", "at least 1 characters"), ("my image", "must match the pattern")])
def test_trainer_image_obeys_the_bounds_of_spec_image(command: str, image: str, problem: str, tmp_path: Path) -> None:
    target = [str(write(tmp_path, yaml.safe_dump(base_job())))] if command == "render" else ["--all-namespaces"]
    result = CliRunner().invoke(main, [command, *target, "--trainer-image", image])
    assert result.exit_code == 2, result.output
    assert "--trainer-image" in result.output and problem in result.output


def test_operator_hands_its_settings_to_kopf_and_the_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launch_operator(["-n", "team-a", "-n", "team-b", "--metrics-port=9090", "--liveness=",
                              "--progress-interval=30", "--trainer-image=registry.example.com/kubetrain/trainer:1"],
                             monkeypatch)
    assert launch.exit_code == 0, launch.output
    assert launch.run_kwargs is not None
    assert launch.run_kwargs["namespaces"] == ("team-a", "team-b") and launch.run_kwargs["clusterwide"] is False
    assert launch.run_kwargs["liveness_endpoint"] is None
    assert type(launch.run_kwargs["loop"]).__module__.startswith("uvloop")  # installed by the operator extra
    assert launch.metrics_port == 9090
    assert launch.config.trainer_image == "registry.example.com/kubetrain/trainer:1"
    assert launch.config.progress_interval == 30


def test_operator_refuses_named_namespaces_beside_all_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf would raise a TypeError at start-up (an operator is either cluster-wide or namespaced)."""
    launch = launch_operator(["--all-namespaces", "--namespace=team-*"], monkeypatch)
    assert launch.exit_code == 2 and launch.run_kwargs is None, launch.output
    assert "--namespace and --all-namespaces exclude each other" in launch.output


def test_operator_with_a_namespace_pattern_has_kopf_watch_every_namespace_and_picks_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launch_operator(["-n", "team-*", "-n", "ml"], monkeypatch)
    assert launch.exit_code == 0, launch.output
    assert launch.run_kwargs is not None
    assert launch.run_kwargs["clusterwide"] is True and launch.run_kwargs["namespaces"] == ()
    assert launch.config.namespace_patterns == ("team-*", "ml")
    assert launch.config.serves("team-a") and launch.config.serves("ml") and not launch.config.serves("mlops")


def test_the_built_in_trainer_image_meets_the_bounds_of_spec_image() -> None:
    # The CLI checks only another --trainer-image (the check loads the whole CRD): the default must pass it.
    assert field_problems("spec.image", api.DEFAULT_TRAINER_IMAGE) == []


def test_operator_defaults_to_the_trainer_image_and_normal_plain_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launch_operator(["--all-namespaces"], monkeypatch)
    assert launch.exit_code == 0, launch.output
    assert launch.config.trainer_image == api.DEFAULT_TRAINER_IMAGE
    assert launch.root_level == logging.INFO
    assert launch.log_line("reconciled") == "reconciled"


@pytest.mark.parametrize(
    ("args", "level", "asyncio_too"),
    [
        (["--log-level=quiet"], logging.WARNING, False),
        (["--log-level=normal"], logging.INFO, False),
        (["--log-level=verbose"], logging.DEBUG, False),
        (["-v"], logging.DEBUG, False),
        (["--log-level=debug"], logging.DEBUG, True),
        (["-v", "--log-level=quiet"], logging.WARNING, False),  # the last one wins
        (["--log-level=quiet", "-v"], logging.DEBUG, False),
    ],
)
def test_operator_log_level_reaches_the_root_logger(args: list[str], level: int, asyncio_too: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launch_operator(["--all-namespaces", *args], monkeypatch)
    assert launch.exit_code == 0, launch.output
    assert (launch.root_level, launch.asyncio_propagates) == (level, asyncio_too)


def test_operator_log_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = {}
    for log_format in LOG_FORMATS:
        launch = launch_operator(["--all-namespaces", f"--log-format={log_format}"], monkeypatch)
        assert launch.exit_code == 0, launch.output
        lines[log_format] = launch.log_line("reconciled", logging.WARNING)
    assert lines["plain"] == "reconciled"
    assert lines["full"].startswith("[") and "WARNING" in lines["full"] and lines["full"].endswith("reconciled")
    assert json.loads(lines["json"])["message"] == "reconciled"


@pytest.mark.parametrize("args", [["--log-level=loud"], ["--log-format=xml"], ["--quiet"]])
def test_operator_rejects_unknown_logging_arguments(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launch_operator(["--all-namespaces", *args], monkeypatch)
    assert launch.exit_code == 2 and launch.run_kwargs is None, launch.output


def test_operator_help_lists_its_options_from_either_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """The console script's dispatcher and click's `operator` command both print argparse's one definition."""
    result = CliRunner().invoke(main, ["operator", "--help"])
    assert result.exit_code == 0, result.output
    with pytest.raises(SystemExit) as exited:
        kubetrain_main(["operator", "--help"])
    assert exited.value.code == 0
    for output in (result.output, capsys.readouterr().out):
        assert output.startswith("usage: kubetrain operator")
        words = " ".join(output.split())  # argparse wraps to the terminal's width
        image = f"--trainer-image REF {operator_main.TRAINER_IMAGE_HELP} (default: {api.DEFAULT_TRAINER_IMAGE})"
        assert image in words
        assert "(default: normal)" in words and "(default: None)" not in words


def test_run_refuses_gpus_this_machine_lacks() -> None:
    result = CliRunner().invoke(main, ["run", str(ROOT / "examples" / "trainingjob-gpu.yaml")])
    assert result.exit_code == 1
    assert "spec.gpusPerNode" in result.output and "gpusPerNode: 0" in result.output


def test_local_run_plan_has_one_agent_per_node(tmp_path: Path) -> None:
    job = parse(yaml.safe_load((ROOT / "examples" / "trainingjob-cpu.yaml").read_text()))
    plan = plan_local_run(job, tmp_path, rendezvous_port=29500, metrics_port=9500)
    assert len(plan.commands) == 2
    assert plan.commands[0][-2:] == ("-m", "kubetrain_trainer")
    env = plan.environments[0]
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "2")
    assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:29500"
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
