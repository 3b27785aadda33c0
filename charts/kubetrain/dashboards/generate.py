"""Generate the chart's Grafana dashboards (training-job.json, operator.json) and hold the metrics contract.

Run from the repository root after changing a panel or a metric name; the tests fail while the committed
JSON differs from what this script writes::

    python charts/kubetrain/dashboards/generate.py

``TRAINER_METRICS``, ``OPERATOR_METRICS`` and ``DCGM_METRICS`` are the one list of metric names the
dashboards and the chart's alerts may use (``tests/test_dashboards.py`` and ``tests/test_alerts.py`` check
every query against them). When the trainer or the operator renames a metric, edit it here, regenerate, and
fix the queries the tests point at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "DASHBOARDS",
    "DCGM_LABELS",
    "DCGM_METRICS",
    "OPERATOR_LABELS",
    "OPERATOR_METRICS",
    "TRAINER_LABELS",
    "TRAINER_METRICS",
    "build_operator",
    "build_training_job",
    "exposed_names",
    "main",
]

# name -> Prometheus type, as trainer_image/kubetrain_trainer/metrics.py and gpu.py export them. Every trainer
# series carries rank and local_rank (one GPU per process: no gpu label); the PodMonitor adds namespace, pod,
# training_job, node_index and attempt. Job-wide values (steps, samples, tokens, model FLOPs, loss, non-finite
# losses) are reported by every rank: queries take their max over ranks, never their sum.
TRAINER_METRICS: dict[str, str] = {
    "trainer_steps_total": "counter",
    "trainer_step": "gauge",
    "trainer_total_steps": "gauge",
    "trainer_samples_total": "counter",
    "trainer_tokens_total": "counter",
    "trainer_samples_per_second": "gauge",
    "trainer_loss": "summary",
    "trainer_loss_last": "gauge",
    "trainer_learning_rate": "gauge",
    "trainer_grad_norm": "gauge",
    "trainer_step_duration_seconds": "histogram",
    "trainer_step_phase_seconds_total": "counter",
    "trainer_last_step_timestamp_seconds": "gauge",
    "trainer_epoch": "gauge",
    "trainer_world_size": "gauge",
    "trainer_checkpoint_duration_seconds": "histogram",
    "trainer_checkpoint_last_step": "gauge",
    "trainer_resumed_from_step": "gauge",
    "trainer_nonfinite_loss_total": "counter",
    "trainer_model_flops_total": "counter",
    "trainer_mfu_ratio": "gauge",
    "trainer_eval_loss": "gauge",
    "trainer_eval_metric": "gauge",
    "trainer_gpu_utilization_ratio": "gauge",
    "trainer_gpu_memory_used_bytes": "gauge",
    "trainer_gpu_memory_total_bytes": "gauge",
    "trainer_gpu_power_watts": "gauge",
    "trainer_gpu_temperature_celsius": "gauge",
    "trainer_gpu_allocator_allocated_bytes": "gauge",
    "trainer_gpu_allocator_reserved_bytes": "gauge",
    "trainer_gpu_allocator_peak_bytes": "gauge",
    "trainer_gpu_alloc_retries_total": "counter",
    "trainer_gpu_ooms_total": "counter",
}

# The operator's own metrics (served on :8080/metrics, scraped by the chart's ServiceMonitor).
OPERATOR_METRICS: dict[str, str] = {
    "kubetrain_reconcile_duration_seconds": "histogram",
    "kubetrain_reconcile_errors_total": "counter",
    "kubetrain_jobs": "gauge",
    "kubetrain_time_to_running_seconds": "histogram",
    "kubetrain_pod_creations_total": "counter",
    "kubetrain_restarts_total": "counter",
}

# NVIDIA DCGM exporter, where the cluster runs it (labels gpu, namespace and pod of the GPU's user, as the
# exporter maps them with its Kubernetes pod mapping and honorLabels).
DCGM_METRICS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge",  # percent, 0-100
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",  # ratio, 0-1
    "DCGM_FI_DEV_FB_USED": "gauge",  # MiB
    "DCGM_FI_DEV_FB_FREE": "gauge",  # MiB
    "DCGM_FI_DEV_POWER_USAGE": "gauge",  # watts
    "DCGM_FI_DEV_GPU_TEMP": "gauge",  # degrees Celsius
}

# Labels each source's series carry (Prometheus target labels included): queries may filter and group on
# these only. The PodMonitor adds training_job, node_index and attempt to trainer series.
TARGET_LABELS = frozenset({"namespace", "pod", "container", "instance", "job", "endpoint", "service"})
TRAINER_LABELS = TARGET_LABELS | {"rank", "local_rank", "training_job", "node_index", "attempt", "phase", "le", "name"}
OPERATOR_LABELS = TARGET_LABELS | {"handler", "phase", "reason", "le"}
DCGM_LABELS = TARGET_LABELS | {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exposed_names(metrics: dict[str, str]) -> set[str]:
    """The series names Prometheus stores for these metrics (histograms and summaries expand)."""
    names: set[str] = set()
    for name, kind in metrics.items():
        suffixes = _SUFFIXES.get(kind)
        if suffixes is None:
            names.add(name)
        else:
            names.update(name + suffix for suffix in suffixes)
    return names


# ---------------------------------------------------------------------------------------------------------
# A small builder: enough of Grafana's dashboard model (schemaVersion 39) for timeseries and stat panels.

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH = 24


class _Layout:
    """Places panels left to right in rows of 24 columns and hands out panel ids."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0
        self._row_height = 0
        self._next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._take_id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": _WIDTH, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, panel: dict[str, Any], width: int, height: int) -> None:
        if self._x + width > _WIDTH:
            self._newline()
        panel["id"] = self._take_id()
        panel["gridPos"] = {"h": height, "w": width, "x": self._x, "y": self._y}
        self.panels.append(panel)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        self._y += self._row_height
        self._x = 0
        self._row_height = 0

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


def _target(expr: str, legend: str, ref: str, *, instant: bool = False) -> dict[str, Any]:
    target: dict[str, Any] = {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
    }
    if instant:
        target["instant"] = True
        target["range"] = False
    return target


def _panel(
    kind: str,
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str,
    *,
    instant: bool = False,
    **options: Any,
) -> dict[str, Any]:
    refs = "ABCDEFGH"
    defaults: dict[str, Any] = {"unit": unit}
    defaults.update(options.pop("defaults", {}))
    panel: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [_target(expr, legend, refs[i], instant=instant) for i, (expr, legend) in enumerate(queries)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options.pop("panel_options", {}),
    }
    panel.update(options)
    return panel


def timeseries(title: str, description: str, queries: list[tuple[str, str]], unit: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault(
        "panel_options",
        {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )
    return _panel("timeseries", title, description, queries, unit, **kw)


def stat(title: str, description: str, queries: list[tuple[str, str]], unit: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault(
        "panel_options",
        {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        },
    )
    return _panel("stat", title, description, queries, unit, instant=True, **kw)


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def _query_variable(name: str, label: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    variable: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "current": {},
        "hide": 0,
        "refresh": 2,
        "sort": 1,
        "regex": "",
        "includeAll": multi,
        "multi": multi,
    }
    if multi:
        variable["allValue"] = ".*"
    return variable


def _dashboard(
    uid: str, title: str, description: str, variables: list[dict[str, Any]], layout: _Layout
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kubetrain"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "links": [],
        "panels": layout.panels,
    }


# ---------------------------------------------------------------------------------------------------------
# Training job

RI = "[$__rate_interval]"
# Every trainer query selects one job; ranks narrow further where a panel is per rank.
JOB = 'namespace="$namespace", training_job="$job"'
RANK = f'{JOB}, rank=~"$rank"'
# DCGM series name the pod, not the job: trainer pods are "<job>-<node index>". GPU panels aggregate per pod
# so that `trainer... or DCGM...` keeps the trainer's series and falls back to DCGM's pod by pod.
DCGM_POD = 'namespace="$namespace", pod=~"$job-[0-9]+"'


def build_training_job() -> dict[str, Any]:
    lay = _Layout()
    lay.row("Status and progress")
    lay.add(
        stat(
            "Progress",
            "Last step over the total number of steps (rank 0).",
            [(f"max(trainer_step{{{JOB}}}) / max(trainer_total_steps{{{JOB}}} > 0)", "progress")],
            "percentunit",
            defaults={"min": 0, "max": 1},
        ),
        4,
        4,
    )
    lay.add(stat("Step", "Current optimizer step.", [(f"max(trainer_step{{{JOB}}})", "step")], "none"), 3, 4)
    lay.add(stat("Epoch", "Current epoch.", [(f"max(trainer_epoch{{{JOB}}})", "epoch")], "none"), 3, 4)
    lay.add(
        stat(
            "ETA",
            "Remaining steps divided by the current step rate.",
            [
                (
                    f"(max(trainer_total_steps{{{JOB}}} > 0) - max(trainer_step{{{JOB}}}))"
                    f" / max(rate(trainer_steps_total{{{JOB}}}{RI}))",
                    "eta",
                )
            ],
            "s",
        ),
        3,
        4,
    )
    lay.add(
        stat(
            "Ranks reporting",
            "Ranks whose metrics Prometheus scrapes, against the world size.",
            [
                (f"count(trainer_world_size{{{JOB}}})", "reporting"),
                (f"max(trainer_world_size{{{JOB}}})", "world size"),
            ],
            "none",
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Last step",
            "Age of the newest training step (the heartbeat the stall alert watches).",
            [(f"time() - max(trainer_last_step_timestamp_seconds{{{JOB}}} > 0)", "age")],
            "s",
            defaults={
                "thresholds": {
                    "mode": "absolute",
                    "steps": [
                        {"color": "green", "value": None},
                        {"color": "orange", "value": 300},
                        {"color": "red", "value": 600},
                    ],
                }
            },
        ),
        3,
        4,
    )
    lay.add(
        stat(
            "Restarts in range",
            "Gang restarts seen in the time range (distinct attempts minus one).",
            [
                (
                    f"count(count by (attempt) (last_over_time(trainer_world_size{{{JOB}}}[$__range]))) - 1",
                    "restarts",
                )
            ],
            "none",
        ),
        4,
        4,
    )

    lay.row("Optimisation")
    lay.add(
        timeseries(
            "Loss",
            "Training loss (all-reduced over ranks): the exact mean over the interval from the summary's sum and"
            " count, the last step's loss, and the held-out loss at the last evaluation.",
            [
                (
                    f"max(rate(trainer_loss_sum{{{JOB}}}{RI})) / max(rate(trainer_loss_count{{{JOB}}}{RI}))",
                    "mean loss",
                ),
                (f"max(trainer_loss_last{{{JOB}}})", "last step"),
                (f"max(trainer_eval_loss{{{JOB}}})", "eval loss"),
            ],
            "none",
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Learning rate",
            "Learning rate of the optimizer (rank 0).",
            [(f"max(trainer_learning_rate{{{JOB}}})", "learning rate")],
            "none",
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Gradient norm",
            "Global gradient norm before clipping, per rank.",
            [(f"trainer_grad_norm{{{RANK}}}", "rank {{rank}}")],
            "none",
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Non-finite losses",
            "NaN or infinite losses per interval.",
            [(f"max(increase(trainer_nonfinite_loss_total{{{JOB}}}{RI}))", "non-finite")],
            "none",
        ),
        12,
        6,
    )
    lay.add(
        timeseries(
            "Resumed from step",
            "The checkpoint step each attempt resumed from (0: a fresh start).",
            [(f"max by (attempt) (trainer_resumed_from_step{{{JOB}}})", "attempt {{attempt}}")],
            "none",
        ),
        12,
        6,
    )

    lay.row("Throughput and step time")
    lay.add(
        timeseries(
            "Throughput",
            "Samples and tokens per second, whole job (every rank reports the job-wide counters).",
            [
                (f"max(rate(trainer_samples_total{{{JOB}}}{RI}))", "samples/s"),
                (f"max(rate(trainer_tokens_total{{{JOB}}}{RI}))", "tokens/s"),
            ],
            "short",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Model TFLOP/s",
            "Model FLOPs per second of the whole job.",
            [(f"max(rate(trainer_model_flops_total{{{JOB}}}{RI})) / 1e12", "TFLOP/s")],
            "none",
        ),
        4,
        8,
    )
    lay.add(
        timeseries(
            "MFU",
            "Model FLOPs utilisation against the GPUs' peak (reported when the task counts FLOPs on a known GPU).",
            [(f"max(trainer_mfu_ratio{{{JOB}}})", "MFU")],
            "percentunit",
            defaults={"min": 0, "max": 1},
        ),
        4,
        8,
    )
    lay.add(
        timeseries(
            "Step duration",
            "Step time quantiles from the histogram, whole job.",
            [
                (
                    f"histogram_quantile(0.5, sum by (le) (rate(trainer_step_duration_seconds_bucket{{{RANK}}}{RI})))",
                    "p50",
                ),
                (
                    f"histogram_quantile(0.95, sum by (le) (rate(trainer_step_duration_seconds_bucket{{{RANK}}}{RI})))",
                    "p95",
                ),
                (
                    f"sum(rate(trainer_step_duration_seconds_sum{{{RANK}}}{RI}))"
                    f" / sum(rate(trainer_step_duration_seconds_count{{{RANK}}}{RI}))",
                    "mean",
                ),
            ],
            "s",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Step-time breakdown",
            "Seconds per second spent in each phase of the step, all ranks.",
            [(f"sum by (phase) (rate(trainer_step_phase_seconds_total{{{RANK}}}{RI}))", "{{phase}}")],
            "s",
            defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 40}},
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Data-wait share",
            "Share of step time waiting for the data loader, per rank"
            " (the DataLoaderBound alert fires above 30% by default).",
            [
                (
                    f'sum by (rank) (rate(trainer_step_phase_seconds_total{{{RANK}, phase="data_wait"}}'
                    f"{RI})) / sum by (rank) (rate(trainer_step_phase_seconds_total{{{RANK}}}"
                    f"{RI}))",
                    "rank {{rank}}",
                )
            ],
            "percentunit",
            defaults={"min": 0, "max": 1},
        ),
        12,
        8,
    )

    lay.row("GPUs (trainer NVML metrics, or DCGM exporter when present)")
    lay.add(
        timeseries(
            "GPU utilisation",
            "Mean GPU busy fraction per pod: the trainer's NVML reading, else DCGM's; and DCGM's graphics-engine"
            " activity where the exporter runs.",
            [
                (
                    f"avg by (pod) (trainer_gpu_utilization_ratio{{{RANK}}})"
                    f" or avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{{DCGM_POD}}}) / 100",
                    "{{pod}}",
                ),
                (
                    f"avg by (pod) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{DCGM_POD}}})",
                    "{{pod}} engine active (DCGM)",
                ),
            ],
            "percentunit",
            defaults={"min": 0, "max": 1},
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "GPU memory used",
            "Device memory in use on the fullest GPU of each pod (NVML, else DCGM).",
            [
                (
                    f"max by (pod) (trainer_gpu_memory_used_bytes{{{RANK}}})"
                    f" or max by (pod) (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}}) * 1048576",
                    "{{pod}}",
                )
            ],
            "bytes",
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "GPU power",
            "Board power draw of all GPUs of each pod (NVML, else DCGM).",
            [
                (
                    f"sum by (pod) (trainer_gpu_power_watts{{{RANK}}})"
                    f" or sum by (pod) (DCGM_FI_DEV_POWER_USAGE{{{DCGM_POD}}})",
                    "{{pod}}",
                )
            ],
            "watt",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "GPU temperature",
            "Hottest GPU of each pod (NVML, else DCGM).",
            [
                (
                    f"max by (pod) (trainer_gpu_temperature_celsius{{{RANK}}})"
                    f" or max by (pod) (DCGM_FI_DEV_GPU_TEMP{{{DCGM_POD}}})",
                    "{{pod}}",
                )
            ],
            "celsius",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "GPU memory share",
            "Used share of device memory on the fullest GPU of each pod (NVML, else DCGM).",
            [
                (
                    f"max by (pod) (trainer_gpu_memory_used_bytes{{{RANK}}}"
                    f" / (trainer_gpu_memory_total_bytes{{{RANK}}} > 0))"
                    f" or max by (pod) (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}}"
                    f" / (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}} + DCGM_FI_DEV_FB_FREE{{{DCGM_POD}}}))",
                    "{{pod}}",
                )
            ],
            "percentunit",
            defaults={"min": 0, "max": 1},
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "PyTorch allocator",
            "CUDA caching allocator per rank: allocated, reserved and peak.",
            [
                (f"trainer_gpu_allocator_allocated_bytes{{{RANK}}}", "allocated, rank {{rank}}"),
                (f"trainer_gpu_allocator_reserved_bytes{{{RANK}}}", "reserved, rank {{rank}}"),
                (f"trainer_gpu_allocator_peak_bytes{{{RANK}}}", "peak, rank {{rank}}"),
            ],
            "bytes",
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Allocator retries and OOMs",
            "cudaMalloc retries (memory pressure) and out-of-memory errors per interval.",
            [
                (f"sum(increase(trainer_gpu_alloc_retries_total{{{RANK}}}{RI}))", "retries"),
                (f"sum(increase(trainer_gpu_ooms_total{{{RANK}}}{RI}))", "OOMs"),
            ],
            "none",
        ),
        12,
        8,
    )

    lay.row("Restarts and checkpoints")
    lay.add(
        timeseries(
            "Attempts",
            "World size reported per attempt: a new line is a gang restart.",
            [(f"max by (attempt) (trainer_world_size{{{JOB}}})", "attempt {{attempt}}")],
            "none",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Last checkpoint step",
            "Step of the newest checkpoint written.",
            [(f"max(trainer_checkpoint_last_step{{{JOB}}})", "checkpoint step")],
            "none",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Checkpoint duration",
            "Mean checkpoint save time per rank over the last hour (from the histogram).",
            [
                (
                    f"sum by (rank) (increase(trainer_checkpoint_duration_seconds_sum{{{RANK}}}[1h]))"
                    f" / sum by (rank) (increase(trainer_checkpoint_duration_seconds_count{{{RANK}}}[1h]))",
                    "rank {{rank}}",
                )
            ],
            "s",
        ),
        8,
        8,
    )

    variables = [
        _datasource_variable(),
        _query_variable("namespace", "Namespace", "label_values(trainer_world_size, namespace)"),
        _query_variable(
            "job", "Training job", 'label_values(trainer_world_size{namespace="$namespace"}, training_job)'
        ),
        _query_variable("rank", "Rank", f"label_values(trainer_world_size{{{JOB}}}, rank)", multi=True),
    ]
    return _dashboard(
        "kubetrain-training-job",
        "kubetrain / Training job",
        "One TrainingJob: progress, optimisation, throughput, step time, GPUs, restarts and checkpoints.",
        variables,
        lay,
    )


# ---------------------------------------------------------------------------------------------------------
# Operator


def build_operator() -> dict[str, Any]:
    lay = _Layout()
    lay.row("Jobs")
    lay.add(
        timeseries(
            "Jobs by phase",
            "TrainingJobs the operator manages, by phase.",
            [("sum by (phase) (kubetrain_jobs)", "{{phase}}")],
            "none",
            defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 40}},
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Time to running",
            "From creation to all pods running: quantiles over the interval.",
            [
                (
                    f"histogram_quantile(0.5, sum by (le) (rate(kubetrain_time_to_running_seconds_bucket{RI})))",
                    "p50",
                ),
                (
                    f"histogram_quantile(0.9, sum by (le) (rate(kubetrain_time_to_running_seconds_bucket{RI})))",
                    "p90",
                ),
            ],
            "s",
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Pod creations",
            "Trainer pods created per second.",
            [(f"sum(rate(kubetrain_pod_creations_total{RI}))", "pods/s")],
            "ops",
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Restarts by reason",
            "Gang restarts per interval, by reason.",
            [(f"sum by (reason) (increase(kubetrain_restarts_total{RI}))", "{{reason}}")],
            "none",
        ),
        12,
        8,
    )

    lay.row("Reconciliation")
    lay.add(
        timeseries(
            "Reconcile rate",
            "Handler invocations per second.",
            [(f"sum by (handler) (rate(kubetrain_reconcile_duration_seconds_count{RI}))", "{{handler}}")],
            "ops",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Reconcile latency",
            "p50 and p99 handler latency.",
            [
                (
                    "histogram_quantile(0.5, sum by (le, handler) (rate("
                    f"kubetrain_reconcile_duration_seconds_bucket{RI})))",
                    "p50 {{handler}}",
                ),
                (
                    "histogram_quantile(0.99, sum by (le, handler) (rate("
                    f"kubetrain_reconcile_duration_seconds_bucket{RI})))",
                    "p99 {{handler}}",
                ),
            ],
            "s",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Reconcile errors",
            "Handler errors per second (kopf retries them with backoff).",
            [(f"sum by (handler) (rate(kubetrain_reconcile_errors_total{RI}))", "{{handler}}")],
            "ops",
        ),
        8,
        8,
    )

    return _dashboard(
        "kubetrain-operator",
        "kubetrain / Operator",
        "The kubetrain operator: jobs by phase, time to running, restarts, and reconcile rate, latency and errors.",
        [_datasource_variable()],
        lay,
    )


DASHBOARDS = {"training-job.json": build_training_job, "operator.json": build_operator}


def render(build: Any) -> str:
    """Serialise a dashboard the way it is committed (stable key order, two-space indent)."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    here = Path(__file__).resolve().parent
    for filename, build in DASHBOARDS.items():
        (here / filename).write_text(render(build))
        print(f"wrote {here / filename}")


if __name__ == "__main__":
    main()
