"""The benchmark command's own logic: figure lines, verdicts, selection, --list. No timing is asserted here;
speed targets live in ``python -m bench`` (ratios against a baseline measured in the same run)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import burst
from bench.__main__ import all_benchmarks, main, select
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, format_figure, format_value, median, percentile, to_json
from bench.trainer import TrainerRun, capacity_short, one_process_disturbed, plain_short, throughput

REPO = Path(__file__).resolve().parent.parent
AT_MOST = Goal("<=", 1.5, "why")
AT_LEAST = Goal(">=", 0.97, "why")


def test_verdict_follows_the_goal_direction() -> None:
    assert Figure("a", 1.21, "x", AT_MOST).verdict == "met"
    assert Figure("a", 1.5, "x", AT_MOST).verdict == "met"  # the bound itself meets the goal
    assert Figure("a", 1.51, "x", AT_MOST).verdict == "missed"
    assert Figure("a", 0.99, "x", AT_LEAST).verdict == "met"
    assert Figure("a", 0.9, "x", AT_LEAST).verdict == "missed"


def test_a_miss_the_machine_caused_is_disturbed_and_says_why() -> None:
    figure = Figure("a", 0.65, "", Goal(">=", 0.70), "2 processes", disturbed="capacity 1.80x")
    assert figure.verdict == "DISTURBED" and not figure.met
    assert format_figure(figure).endswith("0.650 (2 processes; DISTURBED: capacity 1.80x)  goal >= 0.700  DISTURBED")
    assert Figure("a", 0.75, "", Goal(">=", 0.70), disturbed="x").verdict == "met"  # a met goal stays met
    assert Figure("a", None, "", Goal(">=", 0.70), error="boom", disturbed="x").verdict == "missed"


def test_scaling_misses_are_the_machines_only_when_its_capacity_explains_them() -> None:
    goal = Goal(">=", 0.70)
    assert "0.722" in capacity_short(0.65, 1.80, goal)  # 0.65 x 2 / 1.8: the code's own cost meets the goal
    assert capacity_short(0.55, 1.80, goal) == ""  # 0.611 against the capacity: the code's own miss
    assert capacity_short(0.65, 2.0, goal) == ""  # the machine gave two full cores: nothing to excuse
    assert one_process_disturbed(2.2, 2) != "" and one_process_disturbed(1.9, 2) == ""


def test_ddp_misses_are_pytorchs_on_this_machine_only_when_a_plain_loop_misses_too() -> None:
    goal = Goal(">=", 0.90)
    assert "0.640" in plain_short(0.65, 0.64, 1.02, goal)  # plain DDP misses too; the trainer keeps up with it
    assert plain_short(0.65, 0.91, 0.71, goal) == ""  # plain DDP meets the goal: the trainer's own miss
    assert plain_short(0.60, 0.64, 0.94, goal) == ""  # both miss, but the trainer lags the plain loop by > 5 %
    assert plain_short(0.92, 0.64, 1.40, goal) == ""  # a met goal needs no excuse


def test_unmeasured_or_non_finite_figures_miss() -> None:
    assert Figure("a", None, "x", AT_MOST, error="boom").verdict == "missed"
    assert Figure("a", 1.0, "x", AT_MOST, error="boom").verdict == "missed"
    assert Figure("a", float("nan"), "x", AT_MOST).verdict == "missed"
    assert Figure("a", float("inf"), "x", AT_LEAST).verdict == "missed"


def test_figure_line_has_name_value_unit_detail_goal_and_verdict() -> None:
    line = format_figure(Figure("operator.time_to_running_ratio", 1.2134, "x", AT_MOST,
                                "job 4.8 s / bare pod 4.0 s"))
    assert line == "operator.time_to_running_ratio  1.21 x (job 4.8 s / bare pod 4.0 s)  goal <= 1.50  met"


def test_failed_figure_is_one_line_with_the_error() -> None:
    spec = FigureSpec("trainer.x", "%", AT_MOST)
    line = format_figure(spec.failed("RuntimeError: two\nlines"), name_width=12)
    assert line == "trainer.x     n/a (RuntimeError: two lines)  goal <= 1.50  missed"


def test_values_print_with_three_significant_digits() -> None:
    assert [format_value(v) for v in (1234.5, 12.345, 1.2345, 0.12345, 0.0012345)] == [
        "1234", "12.3", "1.23", "0.123", "0.0012"]


def test_percentiles_interpolate_like_numpy() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([7.0], 90) == 7.0


def test_json_results_carry_goal_and_verdict() -> None:
    results = to_json([Figure("a", 2.0, "x", AT_MOST, "d", extra={"job_s": 1.0})], quick=True)
    (row,) = results["figures"]
    assert results["quick"] is True
    assert row["goal"] == {"op": "<=", "value": 1.5, "reason": "why"}
    assert row["verdict"] == "missed" and row["extra"] == {"job_s": 1.0}
    json.dumps(results)


def test_every_figure_has_a_unique_name_and_a_reasoned_goal() -> None:
    figures = [f for b in all_benchmarks() for f in b.figures]
    names = [f.name for f in figures]
    assert len(names) == len(set(names)) >= 5
    assert all(f.goal.reason for f in figures)
    assert [b.needs_lab for b in all_benchmarks()] == sorted(b.needs_lab for b in all_benchmarks())


def test_selection_by_name_prefix_or_figure() -> None:
    benchmarks = all_benchmarks()
    assert [b.name for b in select(benchmarks, ["core"])] == ["core.reconcile", "core.validate"]
    assert [b.name for b in select(benchmarks, ["operator.memory_ratio"])] == ["operator.memory"]
    assert not any(b.needs_lab for b in select(benchmarks, [], no_lab=True))
    with pytest.raises(ValueError, match="unknown benchmark"):
        select(benchmarks, ["nope"])


def test_a_failing_benchmark_reports_its_figures_as_missed(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import run

    spec = FigureSpec("demo.ratio", "x", AT_MOST)

    def broken(_: Context) -> list[Figure]:
        raise RuntimeError("no lab today")

    figures, all_ran = run([Benchmark("demo", "a demo", (spec,), broken)], Context(verbose=False))
    assert not all_ran and figures[0].error == "RuntimeError: no lab today"
    assert capsys.readouterr().out == "demo.ratio  n/a (RuntimeError: no lab today)  goal <= 1.50  missed\n"


def test_throughput_skips_warm_up_and_reads_the_step_lines() -> None:
    lines = [{"event": "step", "step": s, "time": 100.0 + s / 100} for s in range(25, 501, 25)]
    lines[0]["time"] = 0.0  # a slow first window, before the warm-up cut
    rate = throughput(TrainerRun(nproc=2, steps=500, events=tuple(lines), wall_s=9.0), batch=64)
    assert rate.steps_per_s == pytest.approx(100.0)
    assert rate.samples_per_s == pytest.approx(100.0 * 64 * 2)


def test_list_runs_nothing_and_names_every_figure() -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "--list"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=True)
    for bench in all_benchmarks():
        assert bench.name in result.stdout
        for figure in bench.figures:
            assert f"{figure.name}  {figure.goal}" in result.stdout


def test_unknown_name_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--list", "no.such.benchmark"])
    assert exit_info.value.code == 2


def test_peer_jobs_are_the_same_work_for_both_operators() -> None:
    from bench.peer import COMMAND, TINY_IMAGE, pytorchjob, trainingjob_spec

    job = pytorchjob("j", 8)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 7)
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert (container["name"], container["image"], container["command"]) == ("pytorch", TINY_IMAGE, list(COMMAND))
    assert "Worker" not in pytorchjob("j", 1)["spec"]["pytorchReplicaSpecs"]
    assert pytorchjob("j", 2, suspend=True)["spec"]["runPolicy"]["suspend"] is True
    spec = trainingjob_spec(8, suspend=True)
    assert (spec["nodes"], spec["image"], spec["command"], spec["runPolicy"]["suspend"]) == (
        8, TINY_IMAGE, list(COMMAND), True)
    assert spec["resources"]["cpu"] == container["resources"]["requests"]["cpu"]


def test_exec_only_image_torchrun_runs_the_command_after_its_flags(tmp_path: Path) -> None:
    from tests.lab.images import exec_only_image

    torchrun = exec_only_image(tmp_path).prefix / "bin" / "torchrun"
    argv = [str(torchrun), "--nnodes=2", "--no-python", "echo", "hello", "--flag"]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "hello --flag\n"


def test_peer_runs_with_its_best_settings_on_free_ports(tmp_path: Path) -> None:
    from bench.peer import PEER_QPS, PeerOperator

    argv = PeerOperator(tmp_path / "op", tmp_path / "kubeconfig", tmp_path / "log").argv()
    assert "--enable-scheme=pytorchjob" in argv and f"--kube-api-qps={PEER_QPS}" in argv
    assert f"--kube-api-burst={PEER_QPS}" in argv and "--leader-elect=false" in argv
    ports = [a.rsplit(":", 1)[-1] for a in argv if a.startswith(("--metrics-bind", "--health-probe"))]
    assert len(ports) == 2 and all(p.isdigit() and p not in {"8080", "8081"} for p in ports)


def test_a_bursts_status_writes_are_counted_from_the_api_servers_requests() -> None:
    from bench.peer import count_status_writes

    def line(verb: str, resource: str, subresource: str, code: str, value: float) -> str:
        return (f'apiserver_request_total{{code="{code}",component="apiserver",dry_run="",group="g",'
                f'resource="{resource}",scope="resource",subresource="{subresource}",verb="{verb}",'
                f'version="v1"}} {value}')
    exposition = "\n".join([
        "# HELP apiserver_request_total Counter of apiserver requests.",
        "# TYPE apiserver_request_total counter",
        line("PATCH", "trainingjobs", "status", "200", 120),
        line("PATCH", "trainingjobs", "status", "409", 3),  # refused writes cost the API server too
        line("PUT", "trainingjobs", "status", "200", 2),
        line("PATCH", "trainingjobs", "", "200", 50),  # the spec: not a status write
        line("GET", "trainingjobs", "status", "200", 7),
        line("PUT", "pytorchjobs", "status", "200", 101),
    ]) + "\n"
    assert count_status_writes(exposition, "trainingjobs") == 125
    assert count_status_writes(exposition, "pytorchjobs") == 101
    assert count_status_writes(exposition, "jobs") == 0


def test_peer_suspension_and_object_counts_read_both_kinds() -> None:
    from collections import Counter

    from bench.peer import describe_kinds, is_suspended

    assert is_suspended({"status": {"phase": "Suspended"}})
    assert is_suspended({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}})
    assert not is_suspended({"status": {"conditions": [{"type": "Suspended", "status": "False"}]}})
    assert not is_suspended({})
    assert describe_kinds(Counter({"ConfigMap": 1, "Service": 2, "Pod": 2})) == "2 Pod, 2 Service, 1 ConfigMap"


def test_the_operators_calls_per_job_come_from_its_own_request_count() -> None:
    exposition = "\n".join([
        "# TYPE kubetrain_api_requests counter",
        'kubetrain_api_requests_total{verb="create",resource="pods",code="2xx"} 10.0',
        'kubetrain_api_requests_total{verb="create",resource="pods",code="409"} 2.0',
        'kubetrain_api_requests_total{verb="patch",resource="trainingjobs/status",code="2xx"} 25.0',
        'kubetrain_api_requests_created{verb="create",resource="pods",code="2xx"} 1.7e9',
        "# TYPE kubetrain_pod_creations counter",
        "kubetrain_pod_creations_total 10.0", ""])
    lab = SimpleNamespace(operator=SimpleNamespace(metrics=lambda: exposition))
    calls = burst.kubetrain_calls(lab)  # type: ignore[arg-type]
    assert calls == Counter({"create pods": 12, "patch trainingjobs/status": 25})
    assert burst.per_job(calls, 10) == "3.70 calls a job: patch trainingjobs/status 2.50, create pods 1.20"


@pytest.mark.parametrize(("context", "rounds"), [
    (Context(verbose=False), 7), (Context(quick=True, verbose=False), 3),
    (Context(quick=True, verbose=False, repeats=1), 1), (Context(verbose=False, repeats=12), 12)])
def test_rounds_are_a_benchmarks_own_unless_given(context: Context, rounds: int) -> None:
    assert context.rounds(quick=3, full=7) == rounds
    context.close()


def test_zero_rounds_are_refused_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--list"])
    assert "0: give 1 or more rounds" in capsys.readouterr().err


def test_a_pod_watch_times_when_the_last_pod_was_created_and_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from bench import frontier

    watch = frontier.PodWatch.__new__(frontier.PodWatch)  # its state alone: no lab, no watch thread
    watch._objects, watch._lock, watch._created, watch._bound = {}, threading.Lock(), {}, {}
    clock = [100.0]
    monkeypatch.setattr(frontier.time, "monotonic", lambda: clock[0])

    def seen(uid: str, node: str = "", deleting: bool = False) -> None:
        pod = {"metadata": {"name": uid, "uid": uid, "labels": {"job": "a"}}, "spec": {"nodeName": node}}
        if deleting:
            pod["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
        watch._objects[uid] = pod
        watch._noted(pod)
    seen("p0")
    clock[0] = 102.0
    seen("p1")
    seen("p0", node="n0")
    clock[0] = 105.0
    seen("p1", node="n1")
    seen("p1", node="n1")  # a later change: the first time counts
    clock[0] = 109.0
    seen("old", node="n2", deleting=True)  # being deleted: not the job's
    of_job = lambda pod: pod["metadata"]["labels"]["job"] == "a"  # noqa: E731
    assert watch.milestones(of_job, since=99.0) == (3.0, 6.0)
    seen("p2")
    assert watch.milestones(of_job, since=99.0) == (10.0, float("inf"))  # one not bound yet


def test_a_plain_clients_pods_spread_over_machines_as_the_jobs_do() -> None:
    from bench.cluster import bare_objects, job_spec

    service, *pods = bare_objects("bare-0", "ns", job_spec("print(1)", 3))
    assert len(pods) == 3 and service["spec"]["selector"] == {"bench.kubetrain.io/bare": "bare-0"}
    for pod in pods:
        (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items(), "the spread must select its own pods"
