"""Shared helpers of the chart, alert, dashboard and image tests (this module holds no tests).

- ``helm(...)`` / ``render(...)``: the lab's helm binary (built from its Go module and cached by
  ``tests.lab.build``) run on ``charts/kubetrain``.
- ``promtool()``: Debian's ``prometheus`` package provides it (``.ci/run`` installs it).
- ``contract()``: the one list of metric names (``charts/kubetrain/dashboards/generate.py``).
- ``metric_names(expr)``: the metric names a PromQL expression reads, for the contract checks.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "kubetrain"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "kubetrain"
NAMESPACE = "kubetrain-system"


def kube_version() -> str:
    """The lab's Kubernetes version: what the chart is installed into. Passed explicitly because a helm
    built from its Go module without helm's Makefile ldflags assumes Kubernetes v1.20."""
    from tests.lab.versions import KUBERNETES_VERSION

    return KUBERNETES_VERSION


@functools.cache
def helm_binary() -> str:
    """The lab's helm (cached under ~/.cache/kubetrain-lab; built once from its Go module if missing)."""
    from tests.lab.build import ensure_binary

    return str(ensure_binary("helm"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def template_args(values_files: tuple[Path, ...] = (), sets: tuple[str, ...] = (), release: str = RELEASE) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version()]
    for path in values_files:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    return args


@functools.cache
def _render_text(values_files: tuple[Path, ...], sets: tuple[str, ...], release: str) -> str:
    return helm(*template_args(values_files, sets, release)).stdout


def render(
    values_files: tuple[Path, ...] = (), sets: tuple[str, ...] = (), release: str = RELEASE
) -> list[dict[str, Any]]:
    """The objects `helm template` renders (fresh copies: callers may mutate them)."""
    text = _render_text(tuple(values_files), tuple(sets), release)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package (apt-get install prometheus)")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


@functools.cache
def _generator() -> ModuleType:
    path = CHART / "dashboards" / "generate.py"
    spec = importlib.util.spec_from_file_location("kubetrain_dashboards", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generator() -> ModuleType:
    """``charts/kubetrain/dashboards/generate.py``, loaded as a module."""
    return _generator()


def contract() -> dict[str, set[str]]:
    """Series names each source exposes: trainer, operator, dcgm."""
    gen = generator()
    return {
        "trainer": gen.exposed_names(gen.TRAINER_METRICS),
        "operator": gen.exposed_names(gen.OPERATOR_METRICS),
        "dcgm": gen.exposed_names(gen.DCGM_METRICS),
    }


_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "by",
    "without",
    "on",
    "ignoring",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (bare names; no __name__ matchers in our queries)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call is None and name not in _KEYWORDS:
            names.add(name)
    return names


def labels_of_source() -> dict[str, frozenset[str]]:
    gen = generator()
    return {"trainer": gen.TRAINER_LABELS, "operator": gen.OPERATOR_LABELS, "dcgm": gen.DCGM_LABELS}


def unknown_labels(expr: str) -> set[str]:
    """Labels an expression filters or groups on that none of the series it reads carry."""
    names = contract()
    allowed_by_source = labels_of_source()
    unknown: set[str] = set()
    used_sources = {source for source, series in names.items() if metric_names(expr) & series}
    for metric, matchers in re.findall(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
        sources = [source for source, series in names.items() if metric in series]
        allowed = set().union(*(allowed_by_source[source] for source in sources))
        unknown |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers)) - allowed
    grouping = re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr)
    allowed = set().union(*(allowed_by_source[source] for source in used_sources))
    for labels in grouping:
        unknown |= {label.strip() for label in labels.split(",") if label.strip()} - allowed
    return unknown


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
