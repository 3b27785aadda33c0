"""Generate the chart's Grafana dashboards (training-job.json, operator.json) and hold the metrics contract.

Run from the repository root after changing a panel or a metric name; the tests fail while the committed
JSON differs from what this script writes::

    python charts/kubetrain/dashboards/generate.py

It builds them with grafana-foundation-sdk (in the ``test`` extra: ``pip install -e '.[test]'``); the chart
ships the JSON and needs nothing at install time.

``TRAINER_METRICS``, ``OPERATOR_METRICS`` and ``DCGM_METRICS`` are the one list of metric names the
dashboards and the chart's alerts may use (``tests/test_dashboards.py`` and ``tests/test_alerts.py`` check
every query against them). When the trainer or the operator renames a metric, edit it here, regenerate, and
fix the queries the tests point at.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from string import ascii_uppercase
from typing import TypeVar

from grafana_foundation_sdk.builders import common as options
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

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
# training_job and node_index (no attempt: a label per attempt made new series at every restart; the attempt is
# in the TrainingJob's status). Job-wide values (steps, samples, tokens, model FLOPs, loss, non-finite
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
    "kubetrain_pod_replacements_total": "counter",
    "kubetrain_checkpoint_requests_total": "counter",
    "kubetrain_job_goodput_seconds": "gauge",
    "kubetrain_api_requests_total": "counter",
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
# these only. The PodMonitor adds training_job and node_index to trainer series.
TARGET_LABELS = frozenset({"namespace", "pod", "container", "instance", "job", "endpoint", "service"})
TRAINER_LABELS = TARGET_LABELS | {"rank", "local_rank", "training_job", "node_index", "phase", "le", "name"}
# kubetrain_job_goodput_seconds names its job by job_namespace and training_job (its target's namespace is the
# operator's), with the bucket of status.goodput; kubetrain_checkpoint_requests_total has the result of each;
# kubetrain_api_requests_total the verb, resource and answer code of each call.
OPERATOR_LABELS = TARGET_LABELS | {"handler", "phase", "reason", "le", "job_namespace", "training_job", "bucket",
                                   "result", "verb", "resource", "code"}
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
# Panels and dashboards, on grafana-foundation-sdk's typed builders.

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
Query = tuple[str, str]  # (PromQL expression, legend format)
AnyPanel = TypeVar("AnyPanel", stat.Panel, timeseries.Panel)
Section = tuple[str, list[stat.Panel | timeseries.Panel]]  # a row's title, then its panels left to right


def _with_queries(panel: AnyPanel, queries: tuple[Query, ...], *, instant: bool = False) -> AnyPanel:
    # Each target names the datasource variable too: Grafana sends a target without one to the default source.
    for ref_id, (expr, legend) in zip(ascii_uppercase, queries, strict=False):
        query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(DATASOURCE)
        panel.with_target(query.instant() if instant else query)
    return panel


def timeseries_panel(
    title: str, description: str, unit: str, *queries: Query, width: int, height: int = 8
) -> timeseries.Panel:
    # showLegend explicitly: the SDK writes false unless told, and Grafana then hides the legend.
    legend = options.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST).show_legend(True)
    tooltip = options.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
    panel = timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
    panel = panel.legend(legend.placement(common.LegendPlacement.BOTTOM)).tooltip(tooltip)
    return _with_queries(panel.span(width).height(height), queries)


def stat_panel(title: str, description: str, unit: str, *queries: Query, width: int, height: int = 4) -> stat.Panel:
    last_value = options.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
    panel = stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
    panel = panel.reduce_options(last_value).color_mode(common.BigValueColorMode.VALUE)
    panel = panel.graph_mode(common.BigValueGraphMode.NONE).text_mode(common.BigValueTextMode.AUTO)
    return _with_queries(panel.span(width).height(height), queries, instant=True)


def stacked(panel: timeseries.Panel) -> timeseries.Panel:
    return panel.stacking(options.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)


# Variable ids are set to the names: the SDK's default id is one zero UUID for every variable, and Grafana
# keys its variable state by id.
def datasource_variable() -> dashboard.DatasourceVariable:
    return dashboard.DatasourceVariable("datasource").id("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, *, multi: bool = False) -> dashboard.QueryVariable:
    variable = dashboard.QueryVariable(name).id(name).label(label).datasource(DATASOURCE).regex("")
    variable = variable.query({"query": query, "refId": f"{name}-variable"}).multi(multi).include_all(multi)
    variable = variable.refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
    return variable.all_value(".*") if multi else variable


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    board = dashboard.Dashboard(title).uid(uid).description(description).tags(["kubetrain"]).editable()
    board = board.tooltip(model.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-6h", "now")
    return board.timezone("browser").version(1).annotations([])


def with_sections(board: dashboard.Dashboard, sections: list[Section]) -> model.Dashboard:
    """Each row followed by its panels; ids count up from 1 in reading order."""
    ids = itertools.count(1)
    for title, panels in sections:
        board.with_row(dashboard.Row(title).id(next(ids)))
        # The SDK starts a new line once the current one is full (24 columns), not before a panel that would
        # cross the edge: each section's widths add up to whole lines (tests/test_dashboards.py checks the edge).
        for panel in panels:
            board.with_panel(panel.id(next(ids)))
    built = board.build()
    # The panels are already in schema 39's form (legend.showLegend set): no reason for Grafana to migrate
    # them from the SDK's default, 36.
    built.schema_version = 39
    return built


# ---------------------------------------------------------------------------------------------------------
# Training job

RI = "[$__rate_interval]"
# Every trainer query selects one job; ranks narrow further where a panel is per rank.
JOB = 'namespace="$namespace", training_job="$job"'
RANK = f'{JOB}, rank=~"$rank"'
# The first process of node 0. A gang restart replaces every pod, and Prometheus scrapes a new pod at a new
# address (its `instance` label): distinct instances of this process are the attempts seen.
FIRST_PROCESS = f'{JOB}, node_index="0", local_rank="0"'
# DCGM series name the pod, not the job: trainer pods are "<job>-<node index>". GPU panels aggregate per pod
# so that `trainer... or DCGM...` keeps the trainer's series and falls back to DCGM's pod by pod.
DCGM_POD = 'namespace="$namespace", pod=~"$job-[0-9]+"'


def status_section() -> Section:
    heartbeat_age = dashboard.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
        [model.Threshold(None, "green"), model.Threshold(300, "orange"), model.Threshold(600, "red")]
    )
    eta = (
        f"(max(trainer_total_steps{{{JOB}}} > 0) - max(trainer_step{{{JOB}}}))"
        f" / max(rate(trainer_steps_total{{{JOB}}}{RI}))"
    )
    attempts = f"count(count by (instance) (last_over_time(trainer_world_size{{{FIRST_PROCESS}}}[$__range])))"
    return "Status and progress", [
        stat_panel(
            "Progress", "Last step over the total number of steps (rank 0).", "percentunit",
            (f"max(trainer_step{{{JOB}}}) / max(trainer_total_steps{{{JOB}}} > 0)", "progress"), width=4,
        ).min(0).max(1),
        stat_panel("Step", "Current optimizer step.", "none", (f"max(trainer_step{{{JOB}}})", "step"), width=3),
        stat_panel("Epoch", "Current epoch.", "none", (f"max(trainer_epoch{{{JOB}}})", "epoch"), width=3),
        stat_panel("ETA", "Remaining steps divided by the current step rate.", "s", (eta, "eta"), width=3),
        stat_panel(
            "Ranks reporting", "Ranks whose metrics Prometheus scrapes, against the world size.", "none",
            (f"count(trainer_world_size{{{JOB}}})", "reporting"),
            (f"max(trainer_world_size{{{JOB}}})", "world size"),
            width=4,
        ),
        stat_panel(
            "Last step", "Age of the newest training step (the heartbeat the stall alert watches).", "s",
            (f"time() - max(trainer_last_step_timestamp_seconds{{{JOB}}} > 0)", "age"), width=3,
        ).thresholds(heartbeat_age),
        stat_panel(
            "Restarts in range",
            "Gang restarts seen in the time range: the pods of node 0 that reported metrics, minus one"
            " (every attempt starts new pods; the job's own count is its status.restarts).",
            "none",
            (f"{attempts} - 1", "restarts"),
            width=4,
        ),
    ]


def optimisation_section() -> Section:
    mean_loss = f"max(rate(trainer_loss_sum{{{JOB}}}{RI})) / max(rate(trainer_loss_count{{{JOB}}}{RI}))"
    return "Optimisation", [
        timeseries_panel(
            "Loss",
            "Training loss (all-reduced over ranks): the exact mean over the interval from the summary's sum and"
            " count, the last step's loss, and the held-out loss at the last evaluation.",
            "none",
            (mean_loss, "mean loss"),
            (f"max(trainer_loss_last{{{JOB}}})", "last step"),
            (f"max(trainer_eval_loss{{{JOB}}})", "eval loss"),
            width=12,
        ),
        timeseries_panel(
            "Learning rate", "Learning rate of the optimizer (rank 0).", "none",
            (f"max(trainer_learning_rate{{{JOB}}})", "learning rate"), width=6,
        ),
        timeseries_panel(
            "Gradient norm", "Global gradient norm before clipping, per rank.", "none",
            (f"trainer_grad_norm{{{RANK}}}", "rank {{rank}}"), width=6,
        ),
        timeseries_panel(
            "Non-finite losses", "NaN or infinite losses per interval.", "none",
            (f"max(increase(trainer_nonfinite_loss_total{{{JOB}}}{RI}))", "non-finite"), width=12, height=6,
        ),
        timeseries_panel(
            "Resumed from step",
            "The checkpoint step the running attempt resumed from (-1: a fresh start); it moves when a gang"
            " restart resumes from a newer checkpoint.",
            "none",
            (f"max(trainer_resumed_from_step{{{JOB}}})", "resumed from"),
            width=12,
            height=6,
        ),
    ]


def throughput_section() -> Section:
    step_buckets = f"rate(trainer_step_duration_seconds_bucket{{{RANK}}}{RI})"
    mean_step = (
        f"sum(rate(trainer_step_duration_seconds_sum{{{RANK}}}{RI}))"
        f" / sum(rate(trainer_step_duration_seconds_count{{{RANK}}}{RI}))"
    )
    data_wait_share = (
        f'sum by (rank) (rate(trainer_step_phase_seconds_total{{{RANK}, phase="data_wait"}}{RI}))'
        f" / sum by (rank) (rate(trainer_step_phase_seconds_total{{{RANK}}}{RI}))"
    )
    return "Throughput and step time", [
        timeseries_panel(
            "Throughput", "Samples and tokens per second, whole job (every rank reports the job-wide counters).",
            "short",
            (f"max(rate(trainer_samples_total{{{JOB}}}{RI}))", "samples/s"),
            (f"max(rate(trainer_tokens_total{{{JOB}}}{RI}))", "tokens/s"),
            width=8,
        ),
        timeseries_panel(
            "Model TFLOP/s", "Model FLOPs per second of the whole job.", "none",
            (f"max(rate(trainer_model_flops_total{{{JOB}}}{RI})) / 1e12", "TFLOP/s"), width=4,
        ),
        timeseries_panel(
            "MFU",
            "Model FLOPs utilisation against the GPUs' peak (reported when the task counts FLOPs on a known GPU).",
            "percentunit",
            (f"max(trainer_mfu_ratio{{{JOB}}})", "MFU"),
            width=4,
        ).min(0).max(1),
        timeseries_panel(
            "Step duration", "Step time quantiles from the histogram, whole job.", "s",
            (f"histogram_quantile(0.5, sum by (le) ({step_buckets}))", "p50"),
            (f"histogram_quantile(0.95, sum by (le) ({step_buckets}))", "p95"),
            (mean_step, "mean"),
            width=8,
        ),
        stacked(timeseries_panel(
            "Step-time breakdown", "Seconds per second spent in each phase of the step, all ranks.", "s",
            (f"sum by (phase) (rate(trainer_step_phase_seconds_total{{{RANK}}}{RI}))", "{{phase}}"), width=12,
        )),
        timeseries_panel(
            "Data-wait share",
            "Share of step time waiting for the data loader, per rank"
            " (the DataLoaderBound alert fires above 30% by default).",
            "percentunit",
            (data_wait_share, "rank {{rank}}"),
            width=12,
        ).min(0).max(1),
    ]


def gpu_section() -> Section:
    memory_share = (
        f"max by (pod) (trainer_gpu_memory_used_bytes{{{RANK}}} / (trainer_gpu_memory_total_bytes{{{RANK}}} > 0))"
        f" or max by (pod) (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}}"
        f" / (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}} + DCGM_FI_DEV_FB_FREE{{{DCGM_POD}}}))"
    )
    return "GPUs (trainer NVML metrics, or DCGM exporter when present)", [
        timeseries_panel(
            "GPU utilisation",
            "Mean GPU busy fraction per pod: the trainer's NVML reading, else DCGM's; and DCGM's graphics-engine"
            " activity where the exporter runs.",
            "percentunit",
            (
                f"avg by (pod) (trainer_gpu_utilization_ratio{{{RANK}}})"
                f" or avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{{DCGM_POD}}}) / 100",
                "{{pod}}",
            ),
            (f"avg by (pod) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{DCGM_POD}}})", "{{pod}} engine active (DCGM)"),
            width=12,
        ).min(0).max(1),
        timeseries_panel(
            "GPU memory used", "Device memory in use on the fullest GPU of each pod (NVML, else DCGM).", "bytes",
            (
                f"max by (pod) (trainer_gpu_memory_used_bytes{{{RANK}}})"
                f" or max by (pod) (DCGM_FI_DEV_FB_USED{{{DCGM_POD}}}) * 1048576",
                "{{pod}}",
            ),
            width=12,
        ),
        timeseries_panel(
            "GPU power", "Board power draw of all GPUs of each pod (NVML, else DCGM).", "watt",
            (
                f"sum by (pod) (trainer_gpu_power_watts{{{RANK}}})"
                f" or sum by (pod) (DCGM_FI_DEV_POWER_USAGE{{{DCGM_POD}}})",
                "{{pod}}",
            ),
            width=8,
        ),
        timeseries_panel(
            "GPU temperature", "Hottest GPU of each pod (NVML, else DCGM).", "celsius",
            (
                f"max by (pod) (trainer_gpu_temperature_celsius{{{RANK}}})"
                f" or max by (pod) (DCGM_FI_DEV_GPU_TEMP{{{DCGM_POD}}})",
                "{{pod}}",
            ),
            width=8,
        ),
        timeseries_panel(
            "GPU memory share", "Used share of device memory on the fullest GPU of each pod (NVML, else DCGM).",
            "percentunit", (memory_share, "{{pod}}"), width=8,
        ).min(0).max(1),
        *allocator_panels(),
    ]


def allocator_panels() -> list[timeseries.Panel]:
    return [
        timeseries_panel(
            "PyTorch allocator", "CUDA caching allocator per rank: allocated, reserved and peak.", "bytes",
            (f"trainer_gpu_allocator_allocated_bytes{{{RANK}}}", "allocated, rank {{rank}}"),
            (f"trainer_gpu_allocator_reserved_bytes{{{RANK}}}", "reserved, rank {{rank}}"),
            (f"trainer_gpu_allocator_peak_bytes{{{RANK}}}", "peak, rank {{rank}}"),
            width=12,
        ),
        timeseries_panel(
            "Allocator retries and OOMs", "cudaMalloc retries (memory pressure) and out-of-memory errors per interval.",
            "none",
            (f"sum(increase(trainer_gpu_alloc_retries_total{{{RANK}}}{RI}))", "retries"),
            (f"sum(increase(trainer_gpu_ooms_total{{{RANK}}}{RI}))", "OOMs"),
            width=12,
        ),
    ]


def restarts_section() -> Section:
    checkpoint_mean = (
        f"sum by (rank) (increase(trainer_checkpoint_duration_seconds_sum{{{RANK}}}[1h]))"
        f" / sum by (rank) (increase(trainer_checkpoint_duration_seconds_count{{{RANK}}}[1h]))"
    )
    return "Restarts and checkpoints", [
        timeseries_panel(
            "World size",
            "Processes in the job, as its ranks report it (a change: an elastic resize, or a restart at another"
            " size).",
            "none",
            (f"max(trainer_world_size{{{JOB}}})", "world size"),
            width=8,
        ),
        timeseries_panel(
            "Last checkpoint step", "Step of the newest checkpoint written.", "none",
            (f"max(trainer_checkpoint_last_step{{{JOB}}})", "checkpoint step"), width=8,
        ),
        timeseries_panel(
            "Checkpoint duration", "Mean checkpoint save time per rank over the last hour (from the histogram).", "s",
            (checkpoint_mean, "rank {{rank}}"), width=8,
        ),
    ]


# The operator's series of one job (status.goodput); max: one operator at a time reports it, or none.
GOODPUT_JOB = 'job_namespace="$namespace", training_job="$job"'
GOODPUT = f"kubetrain_job_goodput_seconds{{{GOODPUT_JOB}}}"


def goodput_section() -> Section:
    share = f'max(kubetrain_job_goodput_seconds{{{GOODPUT_JOB}, bucket="training"}})'
    return "Goodput", [
        stacked(timeseries_panel(
            "Goodput",
            "Where the job's wall time went (status.goodput): queued, starting, training, stalled, restarting, and"
            " lost (training after the last checkpoint, computed again after a restart). The buckets add up to"
            " the time since the job's creation.",
            "s",
            (f"max by (bucket) ({GOODPUT})", "{{bucket}}"),
            width=16,
        )),
        stat_panel(
            "Goodput share", "Training time over the job's wall time so far (kubectl get tj -o wide: Goodput).",
            "percentunit", (f"{share} / sum(max by (bucket) ({GOODPUT}))", "share"), width=8,
        ).min(0).max(1),
    ]


def build_training_job() -> model.Dashboard:
    board = new_dashboard(
        "kubetrain-training-job",
        "kubetrain / Training job",
        "One TrainingJob: progress, optimisation, throughput, step time, GPUs, restarts, checkpoints and goodput.",
    )
    board.variables([
        datasource_variable(),
        query_variable("namespace", "Namespace", "label_values(trainer_world_size, namespace)"),
        query_variable("job", "Training job", 'label_values(trainer_world_size{namespace="$namespace"}, training_job)'),
        query_variable("rank", "Rank", f"label_values(trainer_world_size{{{JOB}}}, rank)", multi=True),
    ])
    sections = [status_section(), optimisation_section(), throughput_section(), gpu_section(), restarts_section(),
                goodput_section()]
    return with_sections(board, sections)


# ---------------------------------------------------------------------------------------------------------
# Operator


def operator_jobs_section() -> Section:
    time_to_running = "histogram_quantile({}, sum by (le) (rate(kubetrain_time_to_running_seconds_bucket{})))"
    return "Jobs", [
        stacked(timeseries_panel(
            "Jobs by phase", "TrainingJobs the operator manages, by phase.", "none",
            ("sum by (phase) (kubetrain_jobs)", "{{phase}}"), width=12,
        )),
        timeseries_panel(
            "Time to running", "From creation to all pods running: quantiles over the interval.", "s",
            (time_to_running.format("0.5", RI), "p50"),
            (time_to_running.format("0.9", RI), "p90"),
            width=12,
        ),
        timeseries_panel(
            "Pod creations", "Trainer pods created per second.", "ops",
            (f"sum(rate(kubetrain_pod_creations_total{RI}))", "pods/s"), width=12,
        ),
        timeseries_panel(
            "Restarts by reason", "Gang restarts per interval, by reason; and lost pods replaced alone, the others "
            "waiting for them at the same attempt.", "none",
            (f"sum by (reason) (increase(kubetrain_restarts_total{RI}))", "gang restart: {{reason}}"),
            (f"sum by (reason) (increase(kubetrain_pod_replacements_total{RI}))", "pod replaced: {{reason}}"),
            width=12,
        ),
        timeseries_panel(
            "Checkpoints asked before a disruption", "Rank 0 asked to checkpoint now because a node under a running "
            "job was cordoned or tainted NoExecute, per interval: taken, or failed (then asked again).", "none",
            (f"sum by (result) (increase(kubetrain_checkpoint_requests_total{RI}))", "{{result}}"),
            width=12,
        ),
    ]


def operator_reconcile_section() -> Section:
    latency = "histogram_quantile({}, sum by (le, handler) (rate(kubetrain_reconcile_duration_seconds_bucket{})))"
    return "Reconciliation", [
        timeseries_panel(
            "Reconcile rate", "Handler invocations per second.", "ops",
            (f"sum by (handler) (rate(kubetrain_reconcile_duration_seconds_count{RI}))", "{{handler}}"), width=8,
        ),
        timeseries_panel(
            "Reconcile latency", "p50 and p99 handler latency.", "s",
            (latency.format("0.5", RI), "p50 {{handler}}"),
            (latency.format("0.99", RI), "p99 {{handler}}"),
            width=8,
        ),
        timeseries_panel(
            "Reconcile errors", "Handler errors per second (kopf retries them with backoff).", "ops",
            (f"sum by (handler) (rate(kubetrain_reconcile_errors_total{RI}))", "{{handler}}"), width=8,
        ),
    ]


def operator_api_section() -> Section:
    return "API server", [
        stacked(timeseries_panel(
            "API requests", "The operator's own calls per second (not kopf's watches and events), by verb and "
            "resource.", "reqps",
            (f"sum by (verb, resource) (rate(kubetrain_api_requests_total{RI}))", "{{verb}} {{resource}}"),
            width=12,
        )),
        timeseries_panel(
            "API errors", "Calls per second that got an error status (429: throttled by API Priority and Fairness, "
            "tried again) or no answer ('error').", "reqps",
            (f'sum by (code, resource) (rate(kubetrain_api_requests_total{{code!="2xx"}}{RI}))',
             "{{code}} {{resource}}"),
            width=12,
        ),
    ]


def build_operator() -> model.Dashboard:
    board = new_dashboard(
        "kubetrain-operator",
        "kubetrain / Operator",
        "The kubetrain operator: jobs by phase, time to running, restarts, reconcile rate, latency and errors, and "
        "its calls to the API server.",
    )
    board.variables([datasource_variable()])
    return with_sections(board, [operator_jobs_section(), operator_reconcile_section(), operator_api_section()])


DASHBOARDS: dict[str, Callable[[], model.Dashboard]] = {
    "training-job.json": build_training_job,
    "operator.json": build_operator,
}


def render(build: Callable[[], model.Dashboard]) -> str:
    """Serialise a dashboard the way it is committed (stable key order, two-space indent)."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> None:
    here = Path(__file__).resolve().parent
    for filename, build in DASHBOARDS.items():
        (here / filename).write_text(render(build))
        print(f"wrote {here / filename}")


if __name__ == "__main__":
    main()
