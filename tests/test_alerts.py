"""The chart's alerts: rendered from the PrometheusRule template, checked and unit-tested with promtool.

The rules promtool sees are exactly the chart's: ``spec.groups`` of the rendered PrometheusRule, written
to a plain rules file next to copies of ``tests/promtool/*.yaml`` (which name it in ``rule_files``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_chart_support import contract, metric_names, one, render, run_promtool, unknown_labels, write_yaml

PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool"
RULES_FILE = "kubetrain-rules.yaml"  # the name the unit tests load
ENABLED = ("prometheusRule.enabled=true",)
EXPECTED_ALERTS = {
    "TrainingJobStalled",
    "TrainingJobNonFiniteLoss",
    "TrainingJobThroughputDrop",
    "TrainingJobDataLoaderBound",
    "TrainingJobRankMissing",
    "GPUUnderutilized",
    "GPUMemoryNearFull",
    "KubetrainOperatorReconcileErrors",
}


def rule_groups(sets: tuple[str, ...] = ENABLED) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(render(sets=sets), "PrometheusRule")["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] or [] if "alert" in rule}


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rules")
    write_yaml(directory / RULES_FILE, {"groups": rule_groups()})
    for test_file in PROMTOOL_TESTS.glob("*.yaml"):
        shutil.copy(test_file, directory / test_file.name)
    return directory


def unit_tests() -> list[dict[str, Any]]:
    files = sorted(PROMTOOL_TESTS.glob("*.yaml"))
    assert files, f"no promtool unit tests in {PROMTOOL_TESTS}"
    cases = []
    for path in files:
        content = yaml.safe_load(path.read_text())
        assert content["rule_files"] == [RULES_FILE], path.name
        cases += content["tests"]
    return cases


def test_the_chart_ships_every_expected_alert() -> None:
    assert set(alerts(rule_groups())) == EXPECTED_ALERTS


def test_promtool_check_rules_accepts_the_rendered_rules(rules_dir: Path) -> None:
    result = run_promtool("check", "rules", str(rules_dir / RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass(rules_dir: Path) -> None:
    files = sorted(path.name for path in rules_dir.glob("*.yaml") if path.name != RULES_FILE)
    result = run_promtool("test", "rules", *files, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for case in unit_tests():
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert firing >= EXPECTED_ALERTS, f"no firing case for {sorted(EXPECTED_ALERTS - firing)}"
    assert silent >= EXPECTED_ALERTS, f"no silent case for {sorted(EXPECTED_ALERTS - silent)}"


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_has_a_window_a_severity_and_runbook_annotations(name: str) -> None:
    rule = alerts(rule_groups())[name]
    assert rule["for"] not in ("", "0", "0s", "0m")
    assert rule["labels"]["severity"] in ("critical", "warning", "info")
    annotations = rule["annotations"]
    assert annotations["summary"] and len(annotations["description"]) > 80
    assert annotations["runbook_url"].endswith(f"#{name.lower()}")


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_reads_only_metrics_of_the_contract(name: str) -> None:
    known = set().union(*contract().values())
    used = metric_names(alerts(rule_groups())[name]["expr"])
    assert used, "no metric found in the expression"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_filters_and_groups_on_labels_its_series_carry(name: str) -> None:
    assert unknown_labels(alerts(rule_groups())[name]["expr"]) == set()


def test_training_alerts_are_per_training_job() -> None:
    for name, rule in alerts(rule_groups()).items():
        if name.startswith("TrainingJob") or name.startswith("GPU"):
            assert "training_job" in rule["expr"], name
            assert (
                "$labels.training_job" in rule["annotations"]["summary"] or "pod" in rule["annotations"]["summary"]
            ), name


def test_alerts_can_be_tuned_and_switched_off() -> None:
    groups = rule_groups(
        (
            *ENABLED,
            "prometheusRule.alerts.GPUUnderutilized.enabled=false",
            "prometheusRule.alerts.TrainingJobStalled.threshold=1800",
            "prometheusRule.alerts.TrainingJobStalled.for=20m",
            "prometheusRule.alerts.TrainingJobStalled.severity=warning",
            "prometheusRule.additionalAlertLabels.team=ml",
        )
    )
    rules = alerts(groups)
    assert set(rules) == EXPECTED_ALERTS - {"GPUUnderutilized"}
    stalled = rules["TrainingJobStalled"]
    assert ") > 1800" in stalled["expr"] and "> 600" not in stalled["expr"]
    assert stalled["for"] == "20m"
    assert stalled["labels"] == {"severity": "warning", "team": "ml"}


def test_rules_stay_valid_with_every_alert_switched_off(tmp_path: Path) -> None:
    sets = (*ENABLED, *(f"prometheusRule.alerts.{name}.enabled=false" for name in sorted(EXPECTED_ALERTS)))
    groups = rule_groups(sets)
    assert alerts(groups) == {}
    result = run_promtool("check", "rules", str(write_yaml(tmp_path / RULES_FILE, {"groups": groups})))
    assert result.returncode == 0, result.stdout + result.stderr
