"""The reconcile decision, case by case: the lifecycle and every branch of the failure taxonomy.

Most cases go through ``reconcile`` (lifecycle.py), which takes failures.py's and status_policy.py's steps too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kubetrain.core.failures import ApiFailure, classify, failed_reconcile, recovered, retry_delay, while_retrying
from kubetrain.core.lifecycle import reconcile
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.core.status import Progress, Scrape
from kubetrain.core.status_policy import SCRAPE_RECHECK_SECONDS, Decision, may_wait, must_persist_before_acting
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

NOW = datetime(2026, 11, 1, 10, 10, tzinfo=UTC)
Json = Any


def job(**spec: Json) -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"uid": "uid-1", "generation": 2}
    for key, value in spec.items():
        document["spec"][key] = value
    if "command" in spec:  # a user's program instead of the built-in trainer
        del document["spec"]["trainer"]
    return parse(document)


def running(**extra: Json) -> dict[str, Json]:
    return {"phase": "Running", "attempt": 0, "restarts": 0, "startTime": "2026-11-01T10:00:00Z",
            "runningTime": "2026-11-01T10:01:00Z", "nodes": {"desired": 2}} | extra


KNOWN = {"type": "ProgressKnown", "status": "True", "reason": "MetricsScraped", "message": "",
         "lastTransitionTime": "2026-11-01T10:01:00Z"}


def reasons(decision: Decision) -> list[str]:
    return [e.reason for e in decision.events]


def condition(decision: Decision, kind: str) -> dict[str, Json]:
    return next(c for c in decision.status["conditions"] if c["type"] == kind)


class TestLifecycle:
    def test_new_job_creates_every_pod_and_is_pending(self) -> None:
        decision = reconcile(job(), {}, [], NOW)
        assert decision.create == (0, 1)
        assert decision.status["phase"] == "Pending"
        assert decision.status["attempt"] == 0 and decision.status["restarts"] == 0
        assert decision.status["startTime"] == "2026-11-01T10:10:00Z"
        assert decision.status["observedGeneration"] == 2
        assert decision.status["selector"] == "kubetrain.io/job-name=valid,kubetrain.io/job-uid=uid-1"
        assert reasons(decision) == ["PodsCreated"]
        assert condition(decision, "Created")["status"] == "True"

    def test_partially_created_attempt_creates_the_rest(self) -> None:
        decision = reconcile(job(), {"phase": "Pending"}, states(pod(0, "Pending")), NOW)
        assert decision.create == (1,)

    def test_unscheduled_pods_keep_the_job_pending(self) -> None:
        pods = states(pod(0), pod(1, "Pending", scheduled=False))
        decision = reconcile(job(), {"phase": "Pending"}, pods, NOW)
        assert decision.status["phase"] == "Pending"
        assert "valid-1" in decision.status["message"]
        assert decision.create == ()

    GANG = ("pod group is unschedulable, 0/1 placements are available, first placement status: minCount (2) "
            "cannot be satisfied: 1 scheduled, 0 remaining")

    @pytest.mark.parametrize(("pods", "reason", "says"), [
        ((pod(0, "Pending", unschedulable=GANG), pod(1, "Pending", unschedulable=GANG)), "Unschedulable",
         f"waiting for 2 pod(s) to be scheduled: valid-0, valid-1; the scheduler: {GANG}"),
        ((pod(0), pod(1, "Pending", unschedulable="0/2 nodes are available: 2 Insufficient cpu.")), "Unschedulable",
         "waiting for 1 pod(s) to be scheduled: valid-1; the scheduler: 0/2 nodes are available: 2 Insufficient cpu."),
        ((pod(0), pod(1, "Pending", scheduled=False)), "PodsPending",  # not tried yet: nothing to tell
         "waiting for 1 pod(s) to be scheduled: valid-1"),
    ])
    def test_pods_the_scheduler_cannot_place_say_why(self, pods: tuple[Json, ...], reason: str, says: str) -> None:
        decision = reconcile(job(), {"phase": "Pending"}, states(*pods), NOW)
        assert (decision.status["phase"], decision.status["message"]) == ("Pending", says)
        running_condition = condition(decision, "Running")
        assert (running_condition["status"], running_condition["reason"]) == ("False", reason)
        assert running_condition["message"] == says
        assert decision.create == () and decision.delete == ()  # it waits: nothing is restarted or failed
        assert_valid_status(decision.status)

    def test_scheduled_but_not_running_is_starting(self) -> None:
        decision = reconcile(job(), {"phase": "Pending"}, states(pod(0), pod(1, "Pending")), NOW)
        assert decision.status["phase"] == "Starting"
        assert decision.status["nodes"]["summary"] == "1/2"

    def test_all_running_is_running(self) -> None:
        decision = reconcile(job(), {"phase": "Starting"}, states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Running"
        assert decision.status["runningTime"] == "2026-11-01T10:10:00Z"
        assert reasons(decision) == ["AllPodsRunning"]
        assert condition(decision, "Running")["status"] == "True"
        assert decision.requeue_after == 600  # the stall check comes back

    def test_running_again_emits_no_duplicate_event(self) -> None:
        decision = reconcile(job(), running(), states(pod(0), pod(1)), NOW)
        assert decision.events == ()

    def test_all_succeeded_is_succeeded_at_100_percent_with_final_loss(self) -> None:
        pods = states(pod(0, "Succeeded", exit_code=0, message='{"step": 10, "loss": 0.042}'),
                      pod(1, "Succeeded", exit_code=0))
        decision = reconcile(job(), running(progress={"step": 8, "loss": 0.1}), pods, NOW)
        assert decision.status["phase"] == "Succeeded"
        assert decision.status["completionTime"] == "2026-11-01T10:10:00Z"
        assert condition(decision, "Succeeded")["status"] == "True"
        assert condition(decision, "Running")["status"] == "False"
        progress = decision.status["progress"]
        assert (progress["percent"], progress["step"], progress["loss"]) == (100, 10, 0.042)
        assert decision.delete == ()  # finished pods stay for their logs (cleanPodPolicy Running)

    def test_resumed_attempt_records_its_resume_step_from_the_final_report(self) -> None:
        # A short attempt can finish between two progress scrapes: the trainer's last words still say where
        # it resumed from.
        report = '{"step": 300, "loss": 0.04, "resumedFromStep": 150}'
        def finished(attempt: int) -> Json:
            return states(pod(0, "Succeeded", exit_code=0, message=report, attempt=attempt),
                          pod(1, "Succeeded", exit_code=0, attempt=attempt))
        decision = reconcile(job(), running(attempt=1, restarts=1, progress={"step": 120}), finished(1), NOW)
        assert decision.status["progress"]["resumedFromStep"] == 150
        first = reconcile(job(), running(progress={"step": 120}), finished(0), NOW)  # attempt 0 resumes nothing
        assert "resumedFromStep" not in first.status["progress"]

    def test_one_pod_done_while_the_other_runs_waits(self) -> None:
        decision = reconcile(job(), running(), states(pod(0, "Succeeded", exit_code=0), pod(1)), NOW)
        assert decision.status["phase"] == "Running"


class TestFailures:
    def test_error_exit_gang_restarts_and_counts(self) -> None:
        pods = states(pod(0, "Failed", exit_code=1, node="node-1"), pod(1))
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["phase"] == "Restarting"
        assert (decision.status["attempt"], decision.status["restarts"]) == (1, 1)
        assert set(decision.delete) == {"valid-0", "valid-1"}
        (failure,) = decision.status["failures"]
        assert failure | {"time": None} == {
            "attempt": 0, "pod": "valid-0", "node": "node-1", "exitCode": 1, "reason": "Error",
            "counted": True, "time": None, "message": "pod valid-0 on node node-1 failed with exit code 1 (Error)",
            "recovery": "GangRestart",
        }
        assert reasons(decision) == ["PodFailed"]
        assert "runningTime" not in decision.status

    def test_error_after_backoff_limit_fails_the_job(self) -> None:
        pods = states(pod(0, "Failed", exit_code=2), pod(1))
        decision = reconcile(job(failurePolicy={"backoffLimit": 1}), running(restarts=1), pods, NOW)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "BackoffLimitExceeded"
        assert "exit code 2" in decision.status["message"]
        assert decision.delete == ("valid-1",)
        assert decision.status["failures"][-1]["exitCode"] == 2

    def test_backoff_limit_zero_fails_at_once(self) -> None:
        decision = reconcile(job(failurePolicy={"backoffLimit": 0}), running(),
                             states(pod(0, "Failed", exit_code=1), pod(1)), NOW)
        assert decision.status["phase"] == "Failed"

    def test_oom_fails_the_job_with_its_reason(self) -> None:
        pods = states(pod(0), pod(1, "Failed", exit_code=137, reason="OOMKilled"))
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "OOMKilled"
        assert "spec.resources.memory" in decision.status["message"]
        assert decision.delete == ("valid-0",)

    def test_trainer_config_error_fails_without_retrying(self) -> None:
        report = '{"reason": "ConfigError", "exitCode": 2, "message": "trainer.options.layers: not a number"}'
        pods = states(pod(0, "Failed", exit_code=1, message=report), pod(1))
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "InvalidTrainerConfig"
        assert "trainer.options.layers" in decision.status["message"]

    def test_oom_restarts_when_the_policy_says_so(self) -> None:
        pods = states(pod(0), pod(1, "Failed", exit_code=137, reason="OOMKilled"))
        decision = reconcile(job(failurePolicy={"restartOnOOM": True}), running(), pods, NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.status["restarts"] == 1

    def test_disruption_restarts_without_counting(self) -> None:
        pods = states(pod(0, "Failed", exit_code=143, disrupted=True), pod(1))
        decision = reconcile(job(failurePolicy={"backoffLimit": 0}), running(), pods, NOW)
        assert decision.status["phase"] == "Restarting"
        assert (decision.status["restarts"], decision.status["disruptions"]) == (0, 1)
        assert decision.status["failures"][0]["counted"] is False
        assert reasons(decision) == ["Disrupted"]

    def test_the_first_failure_names_the_cause(self) -> None:
        pods = states(
            pod(0, "Failed", exit_code=1, finished_at="2026-11-01T10:06:00Z"),  # lost its peer
            pod(1, "Failed", exit_code=143, disrupted=True, finished_at="2026-11-01T10:05:00Z"),
        )
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["restarts"] == 0
        assert decision.status["disruptions"] == 1
        assert len(decision.status["failures"]) == 2

    def test_vanished_pod_is_a_disruption(self) -> None:
        decision = reconcile(job(command=["python", "train.py"]), running(), states(pod(0)), NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.status["disruptions"] == 1
        assert decision.delete == ("valid-0",)

    def test_pod_deleted_by_the_cluster_is_a_disruption(self) -> None:
        pods = states(pod(0, deleting="2026-11-01T10:09:55Z", node="node-1"), pod(1))
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.status["disruptions"] == 1 and decision.status["restarts"] == 0
        assert decision.delete == ("valid-1",)
        assert decision.status["failures"][0]["node"] == "node-1"

    def test_failures_list_is_bounded(self) -> None:
        history = [{"attempt": i, "reason": "Error"} for i in range(20)]
        decision = reconcile(job(), running(failures=history), states(pod(0, "Failed", exit_code=1), pod(1)), NOW)
        assert len(decision.status["failures"]) == 20
        assert decision.status["failures"][-1]["pod"] == "valid-0"


def three_nodes(**spec: Json) -> TrainingJob:
    return job(nodes=3, **spec)


EVICTING = "2026-11-01T10:09:55Z"


class TestLostPodReplaced:
    """A lost pod other than node 0 is made again alone, at the same attempt, while the others wait for it."""

    def test_an_evicted_pod_is_replaced_alone_and_counted_once(self) -> None:
        pods = states(pod(0), pod(1, deleting=EVICTING, node="node-1", uid="u-1"), pod(2))
        first = reconcile(three_nodes(), running(nodes={"desired": 3}), pods, NOW)
        assert first.status["phase"] == "Restarting"
        assert (first.status["attempt"], first.status["restarts"], first.status["disruptions"]) == (0, 0, 1)
        assert first.delete == () and not first.create  # it is being deleted; the others stay
        (record,) = first.status["failures"]
        assert (record["pod"], record["podUID"], record["recovery"], record["counted"]) == (
            "valid-1", "u-1", "PodReplaced", False)
        assert reasons(first) == ["Disrupted"]
        assert "runningTime" not in first.status
        assert_valid_status(first.status)
        again = reconcile(three_nodes(), first.status, pods, NOW + timedelta(seconds=5))
        assert again.status["disruptions"] == 1 and len(again.status["failures"]) == 1
        assert reasons(again) == [] and again.status["phase"] == "Restarting"

    def test_once_it_is_gone_it_is_made_again_at_the_same_attempt(self) -> None:
        evicted = reconcile(three_nodes(), running(nodes={"desired": 3}),
                            states(pod(0), pod(1, deleting=EVICTING, uid="u-1"), pod(2)), NOW)
        gone = reconcile(three_nodes(), evicted.status, states(pod(0), pod(2)), NOW + timedelta(seconds=5))
        assert list(gone.create) == [1] and gone.delete == ()
        assert (gone.status["attempt"], gone.status["disruptions"]) == (0, 1)
        assert reasons(gone) == ["PodReplaced"]
        back = reconcile(three_nodes(), gone.status, states(pod(0), pod(1, uid="u-2"), pod(2)),
                         NOW + timedelta(seconds=30))
        assert back.status["phase"] == "Running" and back.status["disruptions"] == 1
        assert back.status["runningTime"] == "2026-11-01T10:10:30Z"  # the stall clock starts again

    def test_a_failed_disrupted_pod_is_deleted_and_replaced(self) -> None:
        pods = states(pod(0), pod(1), pod(2, "Failed", exit_code=137, disrupted=True, uid="u-2"))
        decision = reconcile(three_nodes(), running(nodes={"desired": 3}), pods, NOW)
        assert decision.delete == ("valid-2",)
        assert (decision.status["attempt"], decision.status["disruptions"]) == (0, 1)
        assert decision.status["failures"][0]["recovery"] == "PodReplaced"

    def test_a_vanished_pod_is_made_again_in_the_same_pass_and_counted_once(self) -> None:
        decision = reconcile(three_nodes(), running(nodes={"desired": 3}), states(pod(0), pod(2)), NOW)
        assert list(decision.create) == [1] and decision.delete == ()
        assert (decision.status["attempt"], decision.status["disruptions"]) == (0, 1)
        assert reasons(decision) == ["Disrupted", "PodReplaced"]
        again = reconcile(three_nodes(), decision.status, states(pod(0), pod(2)), NOW + timedelta(seconds=1))
        assert again.status["disruptions"] == 1

    @pytest.mark.parametrize(("why", "spec", "lost"), [
        ("node 0 hosts the rendezvous store", {}, 0),
        ("a user's program exits on the lost peer", {"command": ["python", "train.py"]}, 1),
    ])
    def test_otherwise_the_gang_restarts(self, why: str, spec: dict[str, Json], lost: int) -> None:
        pods = states(*(pod(i, deleting=EVICTING if i == lost else None, uid=f"u-{i}") for i in range(3)))
        decision = reconcile(three_nodes(**spec), running(nodes={"desired": 3}), pods, NOW)
        assert decision.status["attempt"] == 1, why
        assert decision.status["failures"][0]["recovery"] == "GangRestart"

    def test_survivors_that_gave_up_on_the_replacement_restart_the_gang_uncounted(self) -> None:
        evicted = reconcile(three_nodes(), running(nodes={"desired": 3}),
                            states(pod(0), pod(1, deleting=EVICTING, uid="u-1"), pod(2)), NOW)
        gave_up = '{"reason": "PeerLost", "exitCode": 5, "message": "no replacement joined"}'
        pods = states(pod(0, "Failed", exit_code=1, message=gave_up), pod(1, "Pending", scheduled=False),
                      pod(2, "Failed", exit_code=1, message=gave_up))
        decision = reconcile(three_nodes(), evicted.status, pods, NOW + timedelta(minutes=11))
        assert decision.status["attempt"] == 1
        assert (decision.status["restarts"], decision.status["disruptions"]) == (0, 1)
        assert reasons(decision) == ["ReplacementTimeout"]
        assert decision.status["failures"][-1]["recovery"] == "GangRestart"

    def test_a_replacement_that_timed_out_in_the_rendezvous_restarts_the_gang_and_the_job_goes_on(self) -> None:
        # torch dropped the live agents (late heartbeats): the replacement alone formed a new round and waited
        # out join_timeout. Without a replacement in this attempt, the same failure ends the job.
        evicted = reconcile(three_nodes(), running(nodes={"desired": 3}),
                            states(pod(0), pod(1, deleting=EVICTING, uid="u-1"), pod(2)), NOW)
        pods = states(pod(0), pod(1, "Failed", exit_code=1, message=TestRendezvousTimeout.TAIL), pod(2))
        decision = reconcile(three_nodes(), evicted.status, pods, NOW + timedelta(minutes=10))
        assert (decision.status["phase"], decision.status["attempt"]) == ("Restarting", 1)
        assert (decision.status["restarts"], decision.status["disruptions"]) == (0, 1)
        assert reasons(decision) == ["ReplacementTimeout"]
        unreplaced = reconcile(three_nodes(), running(nodes={"desired": 3}), pods, NOW)
        assert unreplaced.status["phase"] == "Failed"

    def test_the_disruption_limit_still_ends_the_job(self) -> None:
        pods = states(pod(0), pod(1, deleting=EVICTING, uid="u-1"), pod(2))
        decision = reconcile(three_nodes(failurePolicy={"disruptionLimit": 1}),
                             running(nodes={"desired": 3}, disruptions=1), pods, NOW)
        assert decision.status["phase"] == "Failed"
        assert "recovery" not in decision.status["failures"][0]
        assert set(decision.delete) == {"valid-0", "valid-2"}


class TestGangRestart:
    def test_old_attempt_pods_are_deleted_before_the_next_attempt(self) -> None:
        pods = states(pod(0, "Failed", exit_code=1), pod(1, deleting="2026-11-01T10:09:50Z"))
        decision = reconcile(job(), running(phase="Restarting", attempt=1, restarts=1), pods, NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.delete == ("valid-0",)
        assert decision.create == ()

    def test_next_attempt_starts_when_old_pods_are_gone(self) -> None:
        decision = reconcile(job(), running(phase="Restarting", attempt=1, restarts=1), [], NOW)
        assert decision.create == (0, 1)
        assert decision.status["phase"] == "Pending"
        assert reasons(decision) == ["PodsCreated"]

    def test_pod_stuck_terminating_on_a_lost_node_is_force_deleted(self) -> None:
        pods = states(pod(0, deleting="2026-11-01T10:00:00Z", disrupted=True,
                          disruption_reason="DeletionByTaintManager"))
        decision = reconcile(job(), running(phase="Restarting", attempt=1), pods, NOW)
        assert decision.force_delete == ("valid-0",)

    def test_pod_terminating_on_a_node_that_answers_is_never_force_deleted(self) -> None:
        """Fencing: its processes may still write; the next attempt waits until the kubelet confirms."""
        pods = states(pod(0, deleting="2026-11-01T10:00:00Z"))
        decision = reconcile(job(), running(phase="Restarting", attempt=1), pods, NOW)
        assert decision.force_delete == () and decision.create == ()
        assert decision.requeue_after is not None and decision.status["phase"] == "Restarting"

    def test_stall_restarts_and_sets_the_condition(self) -> None:
        # the last scrape (10:09:55) read a heartbeat of 10:02: seen stale
        status = running(progress={"heartbeatTime": "2026-11-01T10:02:00Z", "step": 5,
                                   "updatedAt": "2026-11-01T10:09:55Z"}, conditions=[KNOWN])
        decision = reconcile(job(failurePolicy={"stallTimeoutSeconds": 300}), status, states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Restarting"
        assert condition(decision, "Stalled")["status"] == "True"
        assert decision.status["restarts"] == 1
        assert reasons(decision) == ["NoHeartbeat"]

    def test_fresh_heartbeat_is_not_a_stall(self) -> None:
        status = running(progress={"heartbeatTime": "2026-11-01T10:09:00Z"})
        decision = reconcile(job(failurePolicy={"stallTimeoutSeconds": 300}), status, states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Running"
        assert decision.requeue_after == 240

    def test_user_program_without_heartbeat_is_never_stalled(self) -> None:
        program = parse(base_job() | {"spec": {"command": ["python", "train.py"]}} | {
            "metadata": {"name": "valid", "uid": "uid-1", "generation": 1}})
        status = running(runningTime="2026-10-01T00:00:00Z")
        assert reconcile(program, status, states(pod(0)), NOW).status["phase"] == "Running"

    def test_stall_detection_can_be_disabled(self) -> None:
        status = running(runningTime="2026-10-01T00:00:00Z")
        decision = reconcile(job(failurePolicy={"stallTimeoutSeconds": 0}), status, states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Running"


class TestRunPolicy:
    def test_suspend_deletes_pods_and_keeps_the_job(self) -> None:
        decision = reconcile(job(runPolicy={"suspend": True}), running(), states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Suspended"
        assert set(decision.delete) == {"valid-0", "valid-1"}
        assert condition(decision, "Suspended")["status"] == "True"

    def test_resume_starts_a_new_attempt_with_a_fresh_deadline(self) -> None:
        decision = reconcile(job(), {"phase": "Suspended", "attempt": 2, "startTime": "2026-10-01T00:00:00Z"}, [], NOW)
        assert decision.status["attempt"] == 3
        assert decision.status["restarts"] == 0
        assert decision.status["startTime"] == "2026-11-01T10:10:00Z"
        assert decision.create == (0, 1)
        assert "Resumed" in reasons(decision)
        assert condition(decision, "Suspended")["status"] == "False"

    def test_a_resumed_attempt_does_not_show_the_last_attempts_resume_step(self) -> None:
        stored = {"phase": "Suspended", "attempt": 1, "progress": {"step": 90, "resumedFromStep": 0}}
        decision = reconcile(job(), stored, [], NOW)
        assert decision.status["attempt"] == 2
        assert decision.status["progress"] == {"step": 90}  # the new attempt says where it resumed once it is read

    def test_deadline_fails_the_job_and_stops_its_pods(self) -> None:
        decision = reconcile(job(runPolicy={"activeDeadlineSeconds": 300}), running(), states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "DeadlineExceeded"
        assert set(decision.delete) == {"valid-0", "valid-1"}

    def test_deadline_not_reached_requeues_for_it(self) -> None:
        deadline_only = job(runPolicy={"activeDeadlineSeconds": 900}, failurePolicy={"stallTimeoutSeconds": 0})
        decision = reconcile(deadline_only, running(), states(pod(0), pod(1)), NOW)
        assert decision.status["phase"] == "Running"
        assert decision.requeue_after == 300

    @pytest.mark.parametrize(("policy", "deleted"), [("All", {"valid-0", "valid-1"}), ("Running", {"valid-1"}),
                                                     ("None", set())])
    def test_clean_pod_policy_on_failure(self, policy: str, deleted: set[str]) -> None:
        status = {"phase": "Failed", "completionTime": "2026-11-01T10:09:00Z"}
        decision = reconcile(job(runPolicy={"cleanPodPolicy": policy}), status,
                             states(pod(0, "Failed", exit_code=1), pod(1)), NOW)
        assert set(decision.delete) == deleted

    def test_ttl_deletes_the_finished_job(self) -> None:
        status = {"phase": "Succeeded", "completionTime": "2026-11-01T10:00:00Z"}
        assert reconcile(job(runPolicy={"ttlSecondsAfterFinished": 60}), status, [], NOW).delete_job
        later = reconcile(job(runPolicy={"ttlSecondsAfterFinished": 3600}), status, [], NOW)
        assert not later.delete_job and later.requeue_after == 3000


class TestElastic:
    def elastic(self, nodes: int) -> TrainingJob:
        return job(nodes=nodes, elastic={"minNodes": 1, "maxNodes": 4})

    def test_scale_up_adds_pods_to_the_running_attempt(self) -> None:
        decision = reconcile(self.elastic(3), running(), states(pod(0), pod(1)), NOW)
        assert decision.create == (2,)
        assert decision.status["attempt"] == 0
        assert reasons(decision) == ["Scaled"]

    CPU = "0/3 nodes are available: 3 Insufficient cpu."

    @pytest.mark.parametrize(("min_nodes", "phase", "reason"), [
        (2, "Running", "MinimumPodsRunning"),  # torchrun trains with the two while the third waits for room
        (3, "Pending", "Unschedulable"),       # below its minimum an elastic job waits like a fixed one
    ])
    def test_an_elastic_gang_at_its_minimum_is_running(self, min_nodes: int, phase: str, reason: str) -> None:
        elastic = job(nodes=3, elastic={"minNodes": min_nodes, "maxNodes": 3})
        pods = states(pod(0), pod(1), pod(2, "Pending", unschedulable=self.CPU))
        decision = reconcile(elastic, {"phase": "Pending", "attempt": 0, "restarts": 0}, pods, NOW)
        assert decision.status["phase"] == phase, decision.status["message"]
        assert condition(decision, "Running")["reason"] == reason
        assert f"valid-2; the scheduler: {self.CPU}" in decision.status["message"]
        assert decision.create == () and decision.delete == ()
        assert_valid_status(decision.status)

    def test_the_last_pods_joining_an_elastic_gang_are_told_once(self) -> None:
        elastic = job(nodes=3, elastic={"minNodes": 2, "maxNodes": 3})
        at_minimum = reconcile(elastic, {"phase": "Pending", "attempt": 0, "restarts": 0},
                               states(pod(0), pod(1), pod(2, "Pending", unschedulable=self.CPU)), NOW)
        assert reasons(at_minimum) == ["MinimumPodsRunning"]
        still = reconcile(elastic, at_minimum.status, states(pod(0), pod(1), pod(2, "Pending")), NOW)
        assert reasons(still) == [] and still.status["phase"] == "Running"
        whole = reconcile(elastic, still.status, states(pod(0), pod(1), pod(2)), NOW)
        assert reasons(whole) == ["AllPodsRunning"]
        assert whole.status["message"].startswith("all 3 pods running")
        assert reasons(reconcile(elastic, whole.status, states(pod(0), pod(1), pod(2)), NOW)) == []

    def test_scale_down_deletes_the_pods_above_nodes_and_keeps_the_attempt(self) -> None:
        pods = states(pod(0), pod(1), pod(2))
        decision = reconcile(self.elastic(2), running(nodes={"desired": 3}), pods, NOW)
        assert decision.delete == ("valid-2",)
        assert decision.status["phase"] == "Running"
        assert decision.status["attempt"] == 0 and decision.status["restarts"] == 0
        assert decision.status["nodes"]["desired"] == 2
        assert reasons(decision) == ["ScaledDown"]

    def test_a_leaving_pods_exit_is_not_a_failure(self) -> None:
        leaving = pod(2, phase="Failed", deleting="2026-11-01T10:09:00Z", exit_code=1)
        decision = reconcile(self.elastic(2), running(nodes={"desired": 3}), states(pod(0), pod(1), leaving), NOW)
        assert decision.status["phase"] == "Running" and decision.status["attempt"] == 0
        assert "failures" not in decision.status and reasons(decision) == []

    def test_survivors_succeed_while_the_leaving_pod_terminates(self) -> None:
        done = [pod(i, phase="Succeeded", exit_code=0) for i in (0, 1)]
        decision = reconcile(self.elastic(2), running(nodes={"desired": 3}),
                             states(*done, pod(2, deleting="2026-11-01T10:09:00Z")), NOW)
        assert decision.status["phase"] == "Succeeded"

    def test_a_fixed_size_job_regroups_the_gang_without_counting(self) -> None:
        decision = reconcile(job(nodes=2), running(nodes={"desired": 3}), states(pod(0), pod(1), pod(2)), NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.status["restarts"] == 0 and decision.status["attempt"] == 1
        assert "scaled from 3 to 2" in decision.status["message"]


class TestProgress:
    def test_progress_and_checkpoint_are_recorded(self) -> None:
        progress = Progress(step=5, total_steps=10, loss=0.5, samples_per_second=64, checkpoint_step=4,
                            heartbeat=NOW, resumed_from_step=0)
        decision = reconcile(job(), running(), states(pod(0), pod(1)), NOW, progress)
        assert decision.status["progress"]["summary"] == "50% (5/10)"
        assert decision.status["lastCheckpoint"] == {"step": 4, "time": "2026-11-01T10:10:00Z",
                                                     "path": "/checkpoints/step_000000004", "claimName": "checkpoints"}
        assert decision.events == ()

    def test_restart_at_step_zero_despite_a_checkpoint_is_reported(self) -> None:
        status = running(attempt=1, lastCheckpoint={"step": 40, "time": "2026-11-01T10:00:00Z"})
        decision = reconcile(job(), status, states(pod(0, attempt=1), pod(1, attempt=1)), NOW,
                             Progress(step=1, resumed_from_step=0))
        assert reasons(decision) == ["CheckpointNotResumed"]

    def test_gpu_seconds_accumulate_across_attempts(self) -> None:
        gpu_job = job(gpusPerNode=2, procsPerNode=2)
        status = running(gpuSecondsPriorAttempts=100.0)
        decision = reconcile(gpu_job, status, states(pod(0), pod(1)), NOW)
        # two pods for 600 s with 2 GPUs each, on top of 100 s before
        assert decision.status["gpuSeconds"] == 100.0 + 2 * 600 * 2
        assert decision.status["gpus"] == 4


class TestPodsOfAPreviousJobOfTheSameName:
    """A job deleted with --cascade=orphan leaves its pods; a new job of that name must never take them."""

    def test_succeeded_pod_of_a_previous_job_is_not_this_jobs_success(self) -> None:
        old = states(pod(0, "Succeeded", exit_code=0, job_uid="old-uid"), pod(1, "Succeeded", exit_code=0,
                                                                              job_uid="old-uid"))
        decision = reconcile(job(), {}, old, NOW)
        assert decision.status["phase"] == "Pending"
        assert decision.delete == ("valid-0", "valid-1")  # in the way of the names this job needs
        assert decision.create == ()  # not before they are gone
        assert "waiting for pod(s) valid-0, valid-1 of a previous job named valid to be deleted" \
            in decision.status["message"]
        assert condition(decision, "Running")["reason"] == "PreviousJobPodsTerminating"

    def test_pod_whose_owner_references_were_stripped_is_not_adopted(self) -> None:
        # a pod made before the job-uid label existed, orphaned: no label, no owner
        decision = reconcile(job(), {}, states(pod(0, job_uid=None), pod(1, job_uid=None)), NOW)
        assert decision.delete == ("valid-0", "valid-1") and decision.create == ()

    def test_own_pod_without_the_label_is_recognised_by_its_owner_reference(self) -> None:
        legacy = [pod(i, job_uid=None) for i in (0, 1)]
        for item in legacy:
            item["metadata"]["ownerReferences"] = [{"kind": "TrainingJob", "uid": "uid-1", "controller": True}]
        decision = reconcile(job(), running(), states(*legacy), NOW)
        assert decision.status["phase"] == "Running" and decision.delete == ()

    def test_names_are_free_again_once_the_old_pods_are_gone(self) -> None:
        deleting = states(pod(0, "Succeeded", exit_code=0, job_uid="old-uid", deleting="2026-11-01T10:09:59Z"))
        assert reconcile(job(), {}, deleting, NOW).create == ()
        assert reconcile(job(), {}, [], NOW).create == (0, 1)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (ApiFailure(422, 'Pod "x-0" is invalid: spec.volumes[3]: Invalid value', creating="pod x-0"),
         "InvalidPodSpec"),
        (ApiFailure(422, "status.nodes: Invalid value"), "ApiError"),  # our status write: not the user's spec
        (ApiFailure(403, 'pods "x-0" is forbidden: exceeded quota: q, requested: pods=1', creating="pod x-0"),
         "QuotaExceeded"),
        (ApiFailure(403, 'pods is forbidden: User "sa" cannot create resource "pods"'), "Forbidden"),
        (ApiFailure(409, "pod x-0 exists and belongs to ...", creating="pod x-0"), "NameTaken"),
        (ApiFailure(429, "too many requests"), "ApiUnavailable"),
        (ApiFailure(500, "etcdserver: request timed out"), "ApiUnavailable"),
        (ApiFailure(503, "service unavailable", creating="pod x-0"), "ApiUnavailable"),
        (ApiFailure(None, "ConnectionRefusedError: [Errno 111]"), "ApiUnavailable"),
        (ApiFailure(404, "namespaces not found"), "ApiError"),
        (ApiFailure(None, "KeyError: 'metadata'", internal=True), "ApiError"),
    ],
)
def test_api_failures_are_classified(failure: ApiFailure, reason: str) -> None:
    assert classify(failure) == reason


def test_retries_back_off_exponentially_up_to_a_minute() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 50)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


class TestFailedReconcile:
    INVALID = ApiFailure(422, 'Pod "valid-0" is invalid: spec.volumes[3]: Invalid value: "scratch": '
                              "may not specify more than 1 volume type", creating="pod valid-0")
    QUOTA = ApiFailure(403, 'pods "valid-0" is forbidden: exceeded quota: no-pods, requested: pods=1, '
                            "used: pods=0, limited: pods=0", creating="pod valid-0")

    def test_pods_the_api_server_refuses_fail_the_job_at_once(self) -> None:
        pending = reconcile(job(), {}, [], NOW).status
        decision = failed_reconcile(job(), pending, [], self.INVALID, now=NOW, retry_in=1)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "InvalidPodSpec"
        assert "may not specify more than 1 volume type" in decision.status["message"]
        assert "pod valid-0" in decision.status["message"]
        assert reasons(decision) == ["InvalidPodSpec"]
        assert decision.status["completionTime"]

    def test_quota_is_retried_and_the_status_says_so(self) -> None:
        pending = reconcile(job(), {}, [], NOW).status
        decision = failed_reconcile(job(), pending, [], self.QUOTA, now=NOW, retry_in=4)
        assert decision.status["phase"] == "Pending"
        error = condition(decision, "ReconcileError")
        assert error["status"] == "True" and error["reason"] == "QuotaExceeded"
        assert decision.status["message"].startswith("retrying in 4s: creating pod valid-0 failed: pods ")
        assert "exceeded quota: no-pods" in decision.status["message"]
        assert [(e.type, e.reason) for e in decision.events] == [("Warning", "QuotaExceeded")]
        assert "exceeded quota" in decision.events[0].message

    def test_the_next_reconcile_keeps_saying_it_retries_until_it_succeeds(self) -> None:
        pending = reconcile(job(), {}, [], NOW).status
        failed = failed_reconcile(job(), pending, [], self.QUOTA, now=NOW, retry_in=4).status
        again = reconcile(job(), failed, [], NOW)
        assert again.create == (0, 1)
        assert while_retrying(again.status)["message"].startswith("retrying in 4s")
        cleared = recovered(job(), again.status, NOW)
        assert next(c for c in cleared["conditions"] if c["type"] == "ReconcileError")["status"] == "False"
        assert cleared["message"].startswith("waiting for 2 pod(s) to be scheduled")
        assert "ReconcileError" not in {c["type"] for c in recovered(job(), pending, NOW)["conditions"]}


class TestProgressUnknown:
    """Rank 0 that cannot be scraped is progress unknown, never a stall; a stall is a heartbeat seen stale."""

    STALL: ClassVar[dict[str, int]] = {"stallTimeoutSeconds": 300}
    REFUSED = Scrape(error="http://10.0.0.1:9400/metrics: ClientConnectorError: connection refused")

    def test_a_failed_scrape_while_running_says_progress_is_unknown(self) -> None:
        decision = reconcile(job(), running(conditions=[KNOWN]), states(pod(0), pod(1)), NOW, self.REFUSED)
        known = condition(decision, "ProgressKnown")
        assert known["status"] == "False" and known["reason"] == "ScrapeFailed"
        assert "connection refused" in known["message"] and "not judged a stall" in known["message"]
        assert reasons(decision) == ["ScrapeFailed"]  # once, when it was known before
        again = reconcile(job(), decision.status, states(pod(0), pod(1)), NOW, self.REFUSED)
        assert again.events == ()

    def test_a_first_failed_read_is_read_again_before_it_is_reported(self) -> None:
        """A trainer that has finished stops serving while its pod still runs: no condition, no event yet."""
        first = Scrape(error=self.REFUSED.error, first_failure=True)
        decision = reconcile(job(), running(conditions=[KNOWN]), states(pod(0), pod(1)), NOW, first)
        assert condition(decision, "ProgressKnown")["status"] == "True" and decision.events == ()
        assert decision.requeue_after == SCRAPE_RECHECK_SECONDS

    def test_a_program_of_its_own_that_never_reports_is_told_how_to(self) -> None:
        """The zero-code answer for spec.command: progress unknown, and why, never a made-up step."""
        document = base_job()
        document["metadata"] |= {"uid": "uid-1", "generation": 2}
        document["spec"].pop("trainer")
        document["spec"]["command"] = ["python", "train.py"]
        own = parse(document)
        decision = reconcile(own, running(), states(pod(0), pod(1)), NOW, self.REFUSED)
        known = condition(decision, "ProgressKnown")
        assert known["status"] == "False" and "kubetrain_trainer.report()" in known["message"]
        assert "progress" not in decision.status or "step" not in decision.status["progress"]

    def test_a_failed_scrape_while_pods_start_is_not_reported(self) -> None:
        decision = reconcile(job(), running(phase="Starting"), states(pod(0), pod(1)), NOW, self.REFUSED)
        assert "ProgressKnown" not in {c["type"] for c in decision.status.get("conditions", [])}

    def test_a_successful_scrape_makes_progress_known_again(self) -> None:
        unknown = reconcile(job(), running(), states(pod(0), pod(1)), NOW, self.REFUSED).status
        decision = reconcile(job(), unknown, states(pod(0), pod(1)), NOW, Scrape(progress=Progress(step=3)))
        assert condition(decision, "ProgressKnown")["status"] == "True"
        assert decision.status["progress"]["step"] == 3

    def test_rank_0_never_scraped_is_never_a_stall(self) -> None:
        # the trainer has run for a month without one successful scrape (NetworkPolicy, port closed)
        status = running(runningTime="2026-10-01T00:00:00Z")
        decision = reconcile(job(failurePolicy=self.STALL), status, states(pod(0), pod(1)), NOW, self.REFUSED)
        assert decision.status["phase"] == "Running" and decision.status["restarts"] == 0

    def test_a_heartbeat_last_seen_fresh_is_not_a_stall_while_scrapes_fail(self) -> None:
        # seen fresh at 10:01; since then rank 0 cannot be read: the heartbeat may well be moving
        status = running(progress={"heartbeatTime": "2026-11-01T10:01:00Z", "updatedAt": "2026-11-01T10:01:00Z",
                                   "step": 9}, conditions=[KNOWN])
        decision = reconcile(job(failurePolicy=self.STALL), status, states(pod(0), pod(1)), NOW, self.REFUSED)
        assert decision.status["phase"] == "Running"
        assert condition(decision, "ProgressKnown")["status"] == "False"

    def test_a_heartbeat_seen_stale_is_a_stall(self) -> None:
        status = running(progress={"heartbeatTime": "2026-11-01T10:01:00Z", "updatedAt": "2026-11-01T10:01:00Z",
                                   "step": 9}, conditions=[KNOWN])
        seen = Progress(step=9, heartbeat=datetime(2026, 11, 1, 10, 1, tzinfo=UTC))
        decision = reconcile(job(failurePolicy=self.STALL), status, states(pod(0), pod(1)), NOW, seen)
        assert decision.status["phase"] == "Restarting" and reasons(decision) == ["NoHeartbeat"]

    def test_a_trainer_that_answers_without_a_heartbeat_is_judged_from_its_start(self) -> None:
        status = running(runningTime="2026-11-01T10:01:00Z", conditions=[KNOWN])
        decision = reconcile(job(failurePolicy=self.STALL), status, states(pod(0), pod(1)), NOW, Progress(step=0))
        assert decision.status["phase"] == "Restarting" and reasons(decision) == ["NoHeartbeat"]


DISRUPTION_LIMIT = 30  # failurePolicy.disruptionLimit's default


class TestRendezvousTimeout:
    # The end of torchrun's traceback when its join_timeout passes (the kubelet keeps the log's tail).
    TAIL = ("  File \".../c10d_rendezvous_backend.py\", line 180, in _create_tcp_store\n"
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError")

    def test_a_gang_that_cannot_all_be_placed_fails_with_rendezvous_timeout(self) -> None:
        pods = states(pod(0, "Failed", exit_code=1, message=self.TAIL), pod(1, "Pending", scheduled=False))
        decision = reconcile(job(failurePolicy={"rendezvousTimeoutSeconds": 120}), running(), pods, NOW)
        assert decision.status["phase"] == "Failed" and decision.status["restarts"] == 0
        failed = condition(decision, "Failed")
        assert failed["reason"] == "RendezvousTimeout"
        assert "rendezvousTimeoutSeconds=120" in failed["message"]
        assert "valid-1 never started in time" in failed["message"]
        assert "RendezvousTimeoutError" in decision.status["failures"][-1]["logTail"]

    def test_a_pod_placed_after_its_peers_exited_is_named_too(self) -> None:
        pods = states(pod(0, "Failed", exit_code=1, message=self.TAIL), pod(1, "Pending", scheduled=True))
        message = condition(reconcile(job(), running(), pods, NOW), "Failed")["message"]
        assert "valid-1 never started in time" in message

    def test_a_pod_placed_and_started_after_its_peer_gave_up_is_named_too(self) -> None:
        gave_up = pod(0, "Failed", exit_code=1, message=self.TAIL, finished_at="2026-11-01T10:05:00Z")
        late = pod(1)  # Running by the time the reconcile sees the failure: it started as its peer exited
        late["status"]["startTime"] = "2026-11-01T10:05:00Z"
        message = condition(reconcile(job(), running(), states(gave_up, late), NOW), "Failed")["message"]
        assert "valid-1 never started in time" in message
        early = pod(1)
        early["status"]["startTime"] = "2026-11-01T10:00:00Z"  # up all along
        message = condition(reconcile(job(), running(), states(gave_up, early), NOW), "Failed")["message"]
        assert "every pod started, but not all of them joined" in message

    def test_peers_that_never_reached_an_unstarted_node_0_are_a_rendezvous_timeout(self) -> None:
        lost = "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store"
        pods = states(pod(0, "Pending", scheduled=False), pod(1, "Failed", exit_code=1, message=lost))
        decision = reconcile(job(), running(), pods, NOW)
        assert condition(decision, "Failed")["reason"] == "RendezvousTimeout"
        assert "valid-0 never started in time" in condition(decision, "Failed")["message"]

    def test_node_0_placed_only_when_a_peer_gave_up_came_too_late(self) -> None:
        lost = "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store"
        peer = pod(1, "Failed", exit_code=1, message=lost, finished_at="2026-11-01T10:05:00Z")
        late = pod(0)
        late["status"]["startTime"] = "2026-11-01T10:05:00Z"
        decision = reconcile(job(), running(), states(late, peer), NOW)
        assert condition(decision, "Failed")["reason"] == "RendezvousTimeout"
        assert "valid-0 never started in time" in condition(decision, "Failed")["message"]
        early = pod(0)
        early["status"]["startTime"] = "2026-11-01T10:00:00Z"  # up all along: the store itself failed
        assert reconcile(job(), running(), states(early, peer), NOW).status["phase"] == "Restarting"

    def test_a_closed_rendezvous_waits_for_the_peer_that_closed_it(self) -> None:
        closed = "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"
        first = pod(0, "Failed", exit_code=1, message=closed, finished_at="2026-11-01T10:09:59Z")
        waiting = reconcile(job(), running(), states(first, pod(1)), NOW)
        assert waiting.status["phase"] == "Running" and 0 < (waiting.requeue_after or 0) <= 5
        cause = pod(1, "Failed", exit_code=1, message=self.TAIL, finished_at="2026-11-01T10:10:00Z")
        decision = reconcile(job(), running(), states(first, cause), NOW)
        assert condition(decision, "Failed")["reason"] == "RendezvousTimeout"
        later = reconcile(job(), running(), states(first, pod(1)), NOW + timedelta(seconds=10))
        assert later.status["phase"] == "Restarting", "no cause came: an ordinary failure"

    def test_another_error_of_torchrun_is_a_counted_restart(self) -> None:
        tail = "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: the store failed"
        decision = reconcile(job(), running(), states(pod(0, "Failed", exit_code=1, message=tail), pod(1)), NOW)
        assert decision.status["phase"] == "Restarting" and decision.status["restarts"] == 1


class TestDisruptionBound:
    EVICTED = staticmethod(lambda: states(pod(0, "Failed", exit_code=143, disrupted=True), pod(1)))

    def test_disruptions_up_to_the_limit_restart_without_counting(self) -> None:
        decision = reconcile(job(), running(disruptions=DISRUPTION_LIMIT - 1), self.EVICTED(), NOW)
        assert decision.status["phase"] == "Restarting"
        assert decision.status["disruptions"] == DISRUPTION_LIMIT and decision.status["restarts"] == 0

    def test_a_job_disrupted_over_and_over_fails_with_a_reason(self) -> None:
        decision = reconcile(job(), running(disruptions=DISRUPTION_LIMIT), self.EVICTED(), NOW)
        assert decision.status["phase"] == "Failed"
        failed = condition(decision, "Failed")
        assert failed["reason"] == "TooManyDisruptions"
        assert f"failurePolicy.disruptionLimit is {DISRUPTION_LIMIT}" in failed["message"]
        assert reasons(decision) == ["TooManyDisruptions"]
        assert decision.status["failures"][-1]["reason"] != "TooManyDisruptions"  # the disruption itself
        assert decision.delete == ("valid-1",)  # the rest of the gang stops

    def test_a_vanished_pod_counts_towards_the_bound(self) -> None:
        decision = reconcile(job(), running(disruptions=DISRUPTION_LIMIT), states(pod(0)), NOW)
        assert condition(decision, "Failed")["reason"] == "TooManyDisruptions"

    def test_the_limit_is_the_jobs_own(self) -> None:
        decision = reconcile(job(failurePolicy={"disruptionLimit": 0}), running(), self.EVICTED(), NOW)
        assert condition(decision, "Failed")["reason"] == "TooManyDisruptions"

    def test_scaling_is_not_a_disruption(self) -> None:
        elastic = job(nodes=2, elastic={"minNodes": 1, "maxNodes": 4})
        status = running(nodes={"desired": 3}, disruptions=DISRUPTION_LIMIT)
        decision = reconcile(elastic, status, states(pod(0), pod(1), pod(2)), NOW)
        assert decision.status["phase"] == "Running"
        assert decision.status.get("disruptions", DISRUPTION_LIMIT) == DISRUPTION_LIMIT


class TestAbsurdReports:
    """What a user program reports is not trusted: no value of it makes an invalid status."""

    @pytest.mark.parametrize("report", [
        '{"step": 1e30, "loss": NaN}', '{"step": -4, "loss": Infinity, "resumedFromStep": 1e30}',
        '{"step": "many", "loss": "low"}', '{"step": NaN, "loss": -Infinity}', '{"step": true, "loss": true}',
    ])
    def test_last_words_of_any_shape(self, report: str) -> None:
        pods = states(pod(0, "Succeeded", exit_code=0, message=report, attempt=1),
                      pod(1, "Succeeded", exit_code=0, attempt=1))
        status = running(attempt=1, progress={"step": 5, "loss": 0.5, "updatedAt": "2026-11-01T10:09:00Z"})
        decision = reconcile(job(), status, pods, NOW)
        assert decision.status["phase"] == "Succeeded"
        assert_valid_status(decision.status)

    @pytest.mark.parametrize("progress", [
        Progress(step=10**30), Progress(step=5, loss=float("nan"), samples_per_second=-1.0),
        Progress(step=5, total_steps=-3, checkpoint_step=10**30, resumed_from_step=-9, epoch=-1),
        Progress(step=5, samples_per_second=float("inf"), seconds_per_step=float("inf")),
    ])
    def test_scraped_progress_of_any_size(self, progress: Progress) -> None:
        decision = reconcile(job(), running(conditions=[KNOWN]), states(pod(0), pod(1)), NOW, progress)
        assert decision.status["phase"] == "Running"
        assert_valid_status(decision.status)


RESTARTED_AT = "2026-11-01T10:09:58Z"


class TestInPlaceRestart:
    """torchrun failed in a pod whose kubelet restarted its containers where it stands: same pod, same attempt."""

    def test_it_is_counted_once_and_the_gang_reforms_at_the_same_attempt(self) -> None:
        pods = states(pod(0, uid="u-0"), pod(1, uid="u-1", node="node-1", restarted=(1, 1, RESTARTED_AT)))
        first = reconcile(job(), running(), pods, NOW)
        assert first.status["phase"] == "Restarting" and first.delete == () and not first.create
        assert (first.status["attempt"], first.status["restarts"]) == (0, 1)
        (record,) = first.status["failures"]
        assert (record["pod"], record["podUID"], record["containerRestarts"], record["exitCode"]) == (
            "valid-1", "u-1", 1, 1)
        assert (record["recovery"], record["counted"], record["node"]) == ("InPlaceRestart", True, "node-1")
        assert reasons(first) == ["InPlaceRestart"] and "in place" in first.status["message"]
        assert condition(first, "Restarting")["reason"] == "InPlaceRestart"
        assert "runningTime" not in first.status
        assert_valid_status(first.status)
        again = reconcile(job(), first.status, pods, NOW + timedelta(seconds=5))
        assert again.status["restarts"] == 1 and len(again.status["failures"]) == 1 and reasons(again) != [
            "InPlaceRestart"]
        assert again.status["phase"] == "Running"  # both pods ready again: the stall clock starts again
        assert again.status["runningTime"] == "2026-11-01T10:10:05Z"

    def test_the_others_restarted_by_the_same_failure_are_not_counted_again(self) -> None:
        failed = states(pod(0, uid="u-0"), pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT)))
        first = reconcile(job(), running(), failed, NOW)
        store_lost = states(pod(0, uid="u-0", restarted=(1, 1, "2026-11-01T10:10:04Z")),
                            pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT)))
        second = reconcile(job(), first.status, store_lost, NOW + timedelta(seconds=5))
        assert second.status["restarts"] == 1
        assert [(r["pod"], r["counted"]) for r in second.status["failures"]] == [("valid-1", True), ("valid-0", False)]
        crash_again = states(pod(0, uid="u-0", restarted=(1, 1, "2026-11-01T10:10:04Z")),
                             pod(1, uid="u-1", restarted=(2, 1, "2026-11-01T10:10:09Z")))
        third = reconcile(job(), second.status, crash_again, NOW + timedelta(seconds=10))
        assert third.status["restarts"] == 2, "a pod's own next failure is a restart of its own"

    def test_the_run_that_ended_is_read_while_the_kubelet_restarts_the_pod_and_counted_once_after(self) -> None:
        # As the real kubelet (v1.37.2) shows it: first the run's own end, with the pod's AllContainersRestarting
        # condition; then restartCount 1, and a lastState that only says the kubelet removed the container.
        words = '{"reason": "Error", "exitCode": 1, "message": "ValueError: bad batch"}'
        restarting = pod(1, uid="u-1", exit_code=1, message=words)
        restarting["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
        first = reconcile(job(), running(), states(pod(0), restarting), NOW)
        (record,) = first.status["failures"]
        assert (record["containerRestarts"], record["exitCode"], record["counted"]) == (1, 1, True)
        assert "ValueError: bad batch" in record["logTail"] and first.status["restarts"] == 1
        removed = pod(1, uid="u-1", restarted=(1, 137, RESTARTED_AT))
        removed["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] = "RestartingAllContainers"
        after = reconcile(job(), first.status, states(pod(0), removed), NOW + timedelta(seconds=3))
        assert after.status["restarts"] == 1 and len(after.status["failures"]) == 1
        unseen = reconcile(job(), running(), states(pod(0), removed), NOW)  # the run's end never seen
        assert unseen.status["restarts"] == 1 and "exitCode" not in unseen.status["failures"][0]
        assert "how its run ended was not seen" in unseen.status["failures"][0]["message"]

    def test_a_run_that_ended_on_the_closed_rendezvous_is_a_consequence_whenever_it_comes(self) -> None:
        first = reconcile(job(), running(), states(pod(0), pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT))), NOW)
        closed = "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"
        later = NOW + timedelta(minutes=5)
        pods = states(pod(0), pod(1, uid="u-1", message=closed, restarted=(2, 1, "2026-11-01T10:14:58Z")))
        decision = reconcile(job(), first.status, pods, later)
        assert decision.status["restarts"] == 1 and decision.status["failures"][-1]["counted"] is False

    def test_a_gang_that_does_not_form_again_in_place_is_made_again_with_new_pods(self) -> None:
        closed = "RendezvousClosedError"
        status = reconcile(job(), running(), states(pod(0), pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT))),
                           NOW).status
        for run in range(2, 10):
            pods = states(pod(0), pod(1, uid="u-1", message=closed, restarted=(run, 1, RESTARTED_AT)))
            decision = reconcile(job(), status, pods, NOW + timedelta(seconds=5 * run))
            status = decision.status
            if status["attempt"] == 1:
                break
        assert (status["attempt"], status["restarts"], run) == (1, 1, 8), "2 nodes: 6 uncounted runs allowed"
        assert status["failures"][-1]["recovery"] == "GangRestart" and set(decision.delete) == {"valid-0", "valid-1"}

    def test_one_too_many_fails_the_job(self) -> None:
        pods = states(pod(0), pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT)))
        decision = reconcile(job(failurePolicy={"backoffLimit": 0}), running(), pods, NOW)
        assert decision.status["phase"] == "Failed" and set(decision.delete) == {"valid-0", "valid-1"}
        assert condition(decision, "Failed")["reason"] == "BackoffLimitExceeded"
        assert "recovery" not in decision.status["failures"][0]

    def test_a_rejected_configuration_fails_the_job_at_once(self) -> None:
        words = '{"reason": "ConfigError", "message": "unknown key lr_schedule"}'
        pods = states(pod(0), pod(1, uid="u-1", message=words, restarted=(1, 1, RESTARTED_AT)))
        decision = reconcile(job(), running(), pods, NOW)
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "InvalidTrainerConfig"
        assert "unknown key lr_schedule" in decision.status["message"]

    def test_a_pod_restarted_in_place_then_evicted_is_still_a_disruption(self) -> None:
        pods = states(pod(0), pod(1, uid="u-1", restarted=(1, 1, RESTARTED_AT)), pod(2))
        restarted = reconcile(three_nodes(), running(nodes={"desired": 3}), pods, NOW)
        evicted = states(pod(0), pod(1, uid="u-1", deleting=EVICTING, restarted=(1, 1, RESTARTED_AT)), pod(2))
        decision = reconcile(three_nodes(), restarted.status, evicted, NOW + timedelta(seconds=5))
        assert (decision.status["restarts"], decision.status["disruptions"]) == (1, 1)
        assert decision.status["failures"][-1]["recovery"] == "PodReplaced"


# Every reason a job can end Failed with, or that its status can show while retrying or while progress is
# unknown: each must be explained in the README's failure table.
DOCUMENTED_REASONS = [
    "BackoffLimitExceeded", "OOMKilled", "InvalidTrainerConfig", "DeadlineExceeded", "InvalidPodSpec",
    "TooManyDisruptions", "QuotaExceeded", "Forbidden", "ApiUnavailable", "NameTaken", "ApiError", "Reconciled",
    "ScrapeFailed", "MetricsScraped", "NotScrapedYet", "NoHeartbeat", "Disrupted", "PodFailed",
    "PreviousJobPodsTerminating", "RendezvousTimeout",
]


@pytest.mark.parametrize("reason", DOCUMENTED_REASONS)
def test_every_failure_reason_is_in_the_readme_table(reason: str) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("## Failures and restarts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert any(reason in row for row in rows), f"{reason} is not in the README's failure table"


def test_the_readme_states_the_disruption_bound() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "more than `failurePolicy.disruptionLimit` (default 30) such disruptions" in readme


def test_a_new_attempt_starts_with_progress_not_known_yet() -> None:
    """So that its trainer starting up (not serving yet) is neither a stall nor a lost rank 0 (no event)."""
    pods = states(pod(0, "Failed", exit_code=1), pod(1))
    restarted = reconcile(job(), running(conditions=[KNOWN]), pods, NOW).status
    known = next(c for c in restarted["conditions"] if c["type"] == "ProgressKnown")
    assert (known["status"], known["reason"]) == ("False", "NotScrapedYet")
    later = reconcile(job(), restarted | {"phase": "Running", "runningTime": "2026-11-01T10:10:00Z"},
                      states(pod(0, attempt=1), pod(1, attempt=1)), NOW, Scrape(error="connection refused"))
    assert later.events == ()


class TestWhichStatusChangesMayWait:
    """Pods starting one by one change only counts and messages: those writes fold into the next one."""

    def test_a_pod_more_running_may_wait(self) -> None:
        before = reconcile(job(), {}, [], NOW).status
        starting = reconcile(job(), before, states(pod(0, "Pending"), pod(1, "Pending")), NOW).status
        one_up = reconcile(job(), starting, states(pod(0), pod(1, "Pending")), NOW).status
        assert one_up["message"] != starting["message"]
        assert may_wait(starting, one_up)

    def test_placed_pods_starting_may_wait_for_the_write_that_says_running(self) -> None:
        pending = reconcile(job(), {}, [], NOW).status
        starting = reconcile(job(), pending, states(pod(0, "Pending"), pod(1, "Pending")), NOW).status
        assert (pending["phase"], starting["phase"]) == ("Pending", "Starting")
        assert may_wait(pending, starting)
        running = reconcile(job(), starting, states(pod(0), pod(1)), NOW).status
        assert not may_wait(pending, running), "Running flips a condition"
        assert not may_wait(starting, pending | {"message": "x"}), "back to Pending is news"

    def test_a_new_phase_a_flipped_condition_a_count_or_an_end_is_written_at_once(self) -> None:
        starting = reconcile(job(), reconcile(job(), {}, [], NOW).status,
                             states(pod(0, "Pending"), pod(1, "Pending")), NOW).status
        all_up = reconcile(job(), starting, states(pod(0), pod(1)), NOW).status
        assert all_up["phase"] != starting["phase"] and not may_wait(starting, all_up)
        assert not may_wait({}, starting), "the first status"
        flipped = [c | {"status": "True"} if c["type"] == "Running" else c for c in starting["conditions"]]
        assert not may_wait(starting, starting | {"conditions": flipped, "message": "x"})
        assert not may_wait(starting, starting | {"restarts": 1})
        assert not may_wait(starting, starting | {"failures": [{"reason": "OOMKilled"}]})
        assert not may_wait(starting | {"excludedNodes": [{"node": "n"}]}, starting), "a clear: one event"
        done = all_up | {"phase": "Succeeded"}
        assert not may_wait(done, done | {"message": "x"})


class TestWhatIsWrittenBeforeActing:
    """A crash between writing the status and acting on it must never lose a count or a post-mortem."""

    def test_creating_the_first_pods_acts_first(self) -> None:
        decision = reconcile(job(), {}, [], NOW)
        assert decision.create == (0, 1) and not must_persist_before_acting({}, decision)

    def test_a_gang_restart_is_written_before_its_pods_are_deleted(self) -> None:
        before = running()
        decision = reconcile(job(), before, states(pod(0, "Failed", exit_code=1), pod(1)), NOW)
        assert decision.delete and decision.status["attempt"] == 1
        assert must_persist_before_acting(before, decision)

    def test_a_new_attempts_pods_act_first(self) -> None:
        before = running(attempt=1, restarts=1, phase="Restarting")
        decision = reconcile(job(), before, [], NOW)
        assert decision.create == (0, 1) and not must_persist_before_acting(before, decision)
