"""The operator container's arguments, as the chart renders them, are accepted and applied by `kubetrain operator`.

`helm template` renders the chart for every ci/*-values.yaml and every value the schema allows for the
operator's logging; the rendered args go to the real click command, stopped just before kopf.run
(tests/operator_cli.py). An argument the CLI rejects would crash-loop the operator pod: here it fails a test.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.controller.operator_main import LOG_FORMATS, LOG_LEVELS
from kubetrain.core import api
from tests.operator_cli import Launch, launch_operator
from tests.test_chart_support import CHART, CI_VALUES, one, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
OPERATOR_VALUES = SCHEMA["properties"]["operator"]["properties"]
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
DEFAULT_VALUES = CHART / "ci" / "default-values.yaml"
# What kopf.configure makes of each level (the root logger's level; asyncio's records only in debug).
ROOT_LEVEL = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG, "debug": logging.DEBUG}

CASES = [
    *((values, f"operator.logLevel={level}") for values in CI_VALUES for level in OPERATOR_VALUES["logLevel"]["enum"]),
    *((DEFAULT_VALUES, f"operator.logFormat={fmt}") for fmt in OPERATOR_VALUES["logFormat"]["enum"]),
    (DEFAULT_VALUES, "operator.apiConnections=64"),
    (DEFAULT_VALUES, "operator.looksPerSecond=50"),
]


def _case_id(case: tuple[Path, str]) -> str:
    return f"{case[0].name.removesuffix('-values.yaml')}-{case[1].split('.')[-1]}"


def _operator_args(values: Path, setting: str) -> list[str]:
    docs = render((values,), sets=(setting,))
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    assert args[0] == "operator", args
    return args[1:]


def _value(values: Path, key: str, setting: str = "") -> Any:
    """operator.<key> as helm resolves it: --set, then the values file, then values.yaml."""
    name, _, value = setting.partition("=")
    if name == f"operator.{key}":
        return yaml.safe_load(value)  # as helm reads a --set value
    overrides = (yaml.safe_load(values.read_text()) or {}).get("operator", {})
    return overrides.get(key, DEFAULTS["operator"][key])


def _rendered(args: list[str], option: str) -> str:
    """The value of the last ``--option=value`` in the rendered args (the one click keeps)."""
    given = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{option}=")]
    assert given, f"{option} not rendered: {args}"
    return given[-1]


def test_schema_offers_exactly_the_cli_choices() -> None:
    assert tuple(OPERATOR_VALUES["logLevel"]["enum"]) == LOG_LEVELS
    assert tuple(OPERATOR_VALUES["logFormat"]["enum"]) == LOG_FORMATS
    # Strings, and the booleans an unquoted YAML on/off reads as (the chart renders them as on/off).
    assert SCHEMA["properties"]["gangScheduling"]["enum"] == [*api.GangScheduling, True, False]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_operator_accepts_and_applies_the_chart_args(case: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    values, setting = case
    args = _operator_args(values, setting)
    launch = launch_operator(args, monkeypatch)
    assert launch.exit_code == 0, f"kubetrain operator {' '.join(args)}\n{launch.output}"
    _assert_watches_what_the_values_say(launch, values)
    level = _value(values, "logLevel", setting)
    assert (launch.root_level, launch.asyncio_propagates) == (ROOT_LEVEL[level], level == "debug")
    _assert_log_format(launch, _value(values, "logFormat", setting))
    assert launch.config.trainer_image == _rendered(args, "--trainer-image")
    gang = (yaml.safe_load(values.read_text()) or {}).get("gangScheduling", DEFAULTS["gangScheduling"])
    gang = {True: "on", False: "off"}.get(gang, gang)
    assert launch.config.gang_scheduling == gang == _rendered(args, "--gang-scheduling")
    assert launch.metrics_port == _value(values, "metricsPort", setting)
    assert launch.config.api_connections == _value(values, "apiConnections", setting)
    assert launch.config.looks_per_second == _value(values, "looksPerSecond", setting)


def _assert_watches_what_the_values_say(launch: Launch, values: Path) -> None:
    assert launch.run_kwargs is not None, "kopf.run was not reached"
    watched = tuple((yaml.safe_load(values.read_text()) or {}).get("watchNamespaces", ()))
    assert launch.run_kwargs["namespaces"] == watched
    assert launch.run_kwargs["clusterwide"] is (not watched)
    port = _value(values, "healthPort")
    assert launch.run_kwargs["liveness_endpoint"] == f"http://0.0.0.0:{port}/healthz"


def _assert_log_format(launch: Launch, log_format: str) -> None:
    line = launch.log_line("reconciled", logging.WARNING)
    if log_format == "json":
        assert json.loads(line)["message"] == "reconciled"
    elif log_format == "full":
        assert "WARNING" in line and line.endswith("reconciled")
    else:
        assert line == "reconciled"


def test_an_argument_the_operator_rejects_fails_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard itself: an extra argument `kubetrain operator` does not know stops it before kopf."""
    args = _operator_args(DEFAULT_VALUES, "operator.extraArgs[0]=--quiet")
    assert args[-1] == "--quiet"
    launch = launch_operator(args, monkeypatch)
    assert launch.exit_code == 2 and launch.run_kwargs is None, launch.output
    assert "unrecognized arguments: --quiet" in launch.output
