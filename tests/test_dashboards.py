"""The chart's Grafana dashboards: generated, well-formed, on the datasource variable, and every query
valid PromQL (promtool parses it) that reads only metrics of the trainer/operator/DCGM contract."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_chart_support import (
    CHART,
    contract,
    find,
    generator,
    metric_names,
    render,
    run_promtool,
    unknown_labels,
    write_yaml,
)

DASHBOARD_DIR = CHART / "dashboards"
FILES = ("training-job.json", "operator.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Values for Grafana's variables when promtool parses the queries.
VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "6h",
    "$namespace": "ml",
    "$job": "digits",
    "$rank": ".*",
}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARD_DIR / name).read_text())
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in panels(dashboard) for target in panel["targets"]]


def fill(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    gen = generator()
    assert sorted(gen.DASHBOARDS) == sorted(FILES)
    for name, build in gen.DASHBOARDS.items():
        assert (DASHBOARD_DIR / name).read_text() == gen.render(build), (
            f"{name} is stale: run python charts/kubetrain/dashboards/generate.py"
        )


@pytest.mark.parametrize("name", FILES)
def test_dashboard_is_well_formed(name: str) -> None:
    dashboard = load(name)
    assert dashboard["uid"] and dashboard["title"].startswith("kubetrain / ")
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
    for panel in panels(dashboard):
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_uids_are_unique() -> None:
    uids = [load(name)["uid"] for name in FILES]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", FILES)
def test_every_panel_and_query_uses_the_datasource_variable(name: str) -> None:
    dashboard = load(name)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_training_job_dashboard_filters_by_namespace_job_and_rank() -> None:
    dashboard = load("training-job.json")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "rank"]
    assert variables["rank"]["multi"] and variables["rank"]["includeAll"]
    for title, expr in queries(dashboard):
        if metric_names(expr) & contract()["trainer"]:
            assert 'training_job="$job"' in expr and 'namespace="$namespace"' in expr, title


@pytest.mark.parametrize(
    ("name", "titles"),
    [
        (
            "training-job.json",
            {
                "Progress",
                "Loss",
                "Learning rate",
                "Gradient norm",
                "Throughput",
                "Step duration",
                "Step-time breakdown",
                "Data-wait share",
                "GPU utilisation",
                "GPU memory used",
                "GPU power",
                "GPU temperature",
                "Restarts in range",
                "Last checkpoint step",
                "Checkpoint duration",
                "Goodput",
            },
        ),
        (
            "operator.json",
            {"Reconcile rate", "Reconcile latency", "Reconcile errors", "Jobs by phase", "Time to running"},
        ),
    ],
)
def test_dashboard_has_the_panels_the_issue_asks_for(name: str, titles: set[str]) -> None:
    assert titles <= {panel["title"] for panel in panels(load(name))}


@pytest.mark.parametrize("title", ["GPU utilisation", "GPU memory used", "GPU power", "GPU temperature"])
def test_gpu_panels_fall_back_to_dcgm_metrics(title: str) -> None:
    (panel,) = [p for p in panels(load("training-job.json")) if p["title"] == title]
    used = set().union(*(metric_names(target["expr"]) for target in panel["targets"]))
    assert used & contract()["trainer"], title
    assert used & contract()["dcgm"], title
    assert any(" or " in target["expr"] for target in panel["targets"]), title


def test_operator_dashboard_reads_operator_metrics_only() -> None:
    for title, expr in queries(load("operator.json")):
        assert metric_names(expr) <= contract()["operator"], title


@pytest.mark.parametrize("name", FILES)
def test_every_query_reads_only_metrics_of_the_contract(name: str) -> None:
    known = set().union(*contract().values())
    for title, expr in queries(load(name)):
        used = metric_names(expr)
        assert used, f"{title}: no metric in {expr}"
        assert used <= known, f"{title}: unknown metrics {sorted(used - known)}"


@pytest.mark.parametrize("name", FILES)
def test_every_query_filters_and_groups_on_labels_its_series_carry(name: str) -> None:
    for title, expr in queries(load(name)):
        assert unknown_labels(expr) == set(), f"{title}: {expr}"


def test_label_check_catches_labels_the_series_lack() -> None:
    assert unknown_labels('max by (pod, gpu) (trainer_gpu_power_watts{training_job="a"})') == {"gpu"}
    assert unknown_labels('DCGM_FI_DEV_GPU_TEMP{training_job="a"}') == {"training_job"}
    assert unknown_labels('sum by (handler) (rate(kubetrain_reconcile_errors_total{handler="x"}[5m]))') == set()


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    rules = []
    for name in FILES:
        dashboard = load(name)
        exprs = [expr for _, expr in queries(dashboard)]
        exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
        for expr in exprs:
            # label_values(selector, label) is Grafana's: promtool checks its selector.
            query = expr.removeprefix("label_values(").rsplit(",", 1)[0] if expr.startswith("label_values(") else expr
            rules.append({"record": f"dashboard:query_{len(rules)}", "expr": fill(query)})
    path = write_yaml(tmp_path / "dashboards.rules.yaml", {"groups": [{"name": "dashboards", "rules": rules}]})
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# Two attempts of a 2-node job, 2 ranks per node: (pod address, world size, resumed-from step, sample values).
# Attempt 1 starts new pods (same names, new addresses) after a 2-minute gap, at world size 2, from step 100.
ATTEMPTS = [("10.0.0", 4, -1, "{}x10"), ("10.0.1", 2, 100, "_x12 {}x20")]


def _attempt_series() -> list[dict[str, str]]:
    series = []
    for (address, world_size, resumed, values), node, local_rank in itertools.product(ATTEMPTS, (0, 1), (0, 1)):
        labels = (
            f'namespace="ml", training_job="digits", pod="digits-{node}", node_index="{node}",'
            f' rank="{2 * node + local_rank}", local_rank="{local_rank}",'
            f' instance="{address}.{node}:{9400 + local_rank}"'
        )
        series.append({"series": f"trainer_world_size{{{labels}}}", "values": values.format(world_size)})
        series.append({"series": f"trainer_resumed_from_step{{{labels}}}", "values": values.format(resumed)})
    return series


@pytest.mark.parametrize(
    ("title", "eval_time", "value"),
    [
        ("Restarts in range", "5m", 0),
        ("Restarts in range", "25m", 1),
        ("Resumed from step", "5m", -1),
        ("Resumed from step", "25m", 100),
        ("World size", "25m", 2),
    ],
)
def test_restart_panels_tell_attempts_apart_without_an_attempt_label(
    tmp_path: Path, title: str, eval_time: str, value: int
) -> None:
    (expr,) = [expr for panel_title, expr in queries(load("training-job.json")) if panel_title == title]
    check = {"expr": fill(expr), "eval_time": eval_time, "exp_samples": [{"labels": "{}", "value": value}]}
    write_yaml(tmp_path / "none.rules.yaml", {"groups": []})
    test = {"interval": "1m", "input_series": _attempt_series(), "promql_expr_test": [check]}
    write_yaml(tmp_path / "attempts.test.yaml", {"rule_files": ["none.rules.yaml"], "tests": [test]})
    result = run_promtool("test", "rules", "attempts.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_metric_name_check_catches_unknown_and_renamed_metrics() -> None:
    """The contract checks above can fail: the extractor sees every selected name, and only those."""
    expr = (
        'sum by (le, handler) (rate(kubetrain_reconcile_duration_seconds_bucket{handler=~"a|b"}[5m]))'
        " / on (namespace) group_left (training_job) trainer_world_sizee offset 1h"
        " or histogram_quantile(0.9, DCGM_FI_DEV_GPU_UTIL) * 1e12 unless vector(1)"
    )
    assert metric_names(expr) == {
        "kubetrain_reconcile_duration_seconds_bucket",
        "trainer_world_sizee",
        "DCGM_FI_DEV_GPU_UTIL",
    }
    assert "trainer_world_sizee" not in set().union(*contract().values())


def test_chart_ships_the_committed_dashboards_as_labelled_configmaps() -> None:
    docs = render(sets=("dashboards.enabled=true",))
    configmaps = {doc["metadata"]["name"]: doc for doc in find(docs, "ConfigMap")}
    assert set(configmaps) == {"kubetrain-dashboard-training-job", "kubetrain-dashboard-operator"}
    for name in FILES:
        key = name.removesuffix(".json")
        configmap = configmaps[f"kubetrain-dashboard-{key}"]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert json.loads(configmap["data"][f"kubetrain-{key}.json"]) == load(name)
