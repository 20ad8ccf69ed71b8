"""Preemption accounting from a run's event log, and the recovery policy."""

from training_platform.launch import JobState, JobStatus
from training_platform.recovery.preemption import Interruption, Recovery, decide, summarize
from training_platform.spec import parse_spec


def ev(kind, at, **fields):
    return {"kind": kind, "at": at, **fields}


def test_sigterm_preemption_loses_no_steps_and_times_the_recovery():
    events = [
        ev("started", 0), ev("first_step", 1), ev("progress", 5, step=40), ev("checkpoint", 6, step=50),
        ev("preempted", 7, step=53, signal_at=6.5),
        ev("started", 9), ev("resumed", 10, step=53), ev("first_step", 11.5), ev("finished", 20, step=100),
    ]
    summary = summarize(events)
    assert summary.preemptions == 1
    (interruption,) = summary.interruptions
    assert interruption.kind == "preempted"
    assert interruption.lost_steps == 0
    assert interruption.recovery_seconds == 5.0  # from the signal, not from the checkpoint
    assert summary.finished and summary.attempts == 2


def test_kill_without_notice_loses_the_steps_since_the_last_checkpoint():
    events = [
        ev("started", 0), ev("first_step", 1), ev("checkpoint", 2, step=20), ev("progress", 3, step=30),
        ev("progress", 4, step=35),
        ev("started", 10), ev("resumed", 11, step=20), ev("first_step", 12),
    ]
    (interruption,) = summarize(events).interruptions
    assert interruption.kind == "killed"
    assert interruption.lost_steps == 15


def test_a_lost_node_is_an_interruption_dated_when_it_was_reported():
    """The worker on the lost node writes nothing as it dies; the orchestrator's node_failure event dates the loss."""
    events = [
        ev("started", 0), ev("first_step", 1), ev("checkpoint", 2, step=20), ev("progress", 3, step=30),
        ev("node_failure", 15, job_id="95", nodes=["tp-node1"]), ev("progress", 16, step=31),
        ev("started", 60), ev("resumed", 61, step=20), ev("first_step", 62),
    ]
    (interruption,) = summarize(events).interruptions
    assert interruption.kind == "node_failure"
    assert interruption.lost_steps == 11 and interruption.recovery_seconds == 47.0


def test_a_rerun_after_a_finished_run_is_not_an_interruption():
    events = [ev("started", 0), ev("finished", 1, step=10), ev("started", 2), ev("resumed", 3, step=10)]
    assert summarize(events).preemptions == 0


def test_pending_resume_is_reported_without_figures():
    events = [ev("started", 0), ev("preempted", 1, step=5), ev("started", 2)]
    (interruption,) = summarize(events).interruptions
    assert interruption.recovery_seconds is None


def _spec(spot=True, **policy):
    return parse_spec({"name": "r", "team": "t", "owner": "o", "resources": {"spot": spot}, "preemption": policy})


def _summary(n):
    events = [ev("started", 0)]
    for i in range(n):
        events += [ev("preempted", i * 10 + 1, step=i), ev("started", i * 10 + 2), ev("first_step", i * 10 + 3)]
    return summarize(events)


def test_policy_follows_requeued_jobs_and_resumes_gone_ones():
    assert decide(_spec(), JobStatus(JobState.REQUEUED), _summary(1)).action == Recovery.FOLLOW
    assert decide(_spec(), JobStatus(JobState.PREEMPTED), _summary(1)).action == Recovery.RESUME
    assert decide(_spec(), JobStatus(JobState.FAILED), _summary(0)).action == Recovery.NONE


def test_policy_falls_back_to_on_demand_then_gives_up():
    spec = _spec(fallback_to_ondemand_after=2, max_preemptions=4)
    assert decide(spec, JobStatus(JobState.PREEMPTED), _summary(2)).action == Recovery.RESUME_ON_DEMAND
    assert decide(_spec(spot=False, fallback_to_ondemand_after=2), JobStatus(JobState.PREEMPTED), _summary(2)).action \
        == Recovery.RESUME
    give_up = decide(spec, JobStatus(JobState.PREEMPTED), _summary(4))
    assert give_up.action == Recovery.GIVE_UP
    assert "max_preemptions" in give_up.reason


def test_a_time_limit_stop_or_a_lost_node_is_an_interruption_but_no_preemption():
    """A run requeued at its Slurm time limit (the batch script writes time_limit after the worker's stop) or
    after a lost node was not taken back by the spot market: neither counts toward the spot fallback."""
    time_limit = [
        ev("started", 0), ev("first_step", 1), ev("checkpoint", 2, step=50),
        ev("preempted", 7, step=53, signal_at=6.5), ev("time_limit", 8, job_id="7"),
        ev("started", 9), ev("resumed", 10, step=53), ev("first_step", 11.5),
    ]
    summary = summarize(time_limit)
    (interruption,) = summary.interruptions
    assert (interruption.kind, interruption.lost_steps, interruption.recovery_seconds) == ("time_limit", 0, 5.0)
    assert summary.preemptions == 0 and summary.other_interruptions == 1
    # Slurm (no accounting) counts every requeue as a preemption; the log takes the time limit off.
    assert summary.preemptions_with(JobStatus(JobState.RUNNING, preemptions=1, restarts=1)) == 0

    lost_node = [ev("started", 0), ev("node_failure", 5, nodes=["n1"]), ev("started", 60), ev("first_step", 62)]
    assert summarize(lost_node).preemptions == 0
    both = [*time_limit, ev("preempted", 20, step=60), ev("started", 21), ev("first_step", 22)]
    assert summarize(both).preemptions == 1
    assert summarize(both).preemptions_with(JobStatus(JobState.RUNNING, preemptions=2, restarts=2)) == 1


def test_a_job_waiting_after_its_time_limit_is_not_counted_as_preempted():
    """Between the requeue and the next attempt's start the log's last attempt ended at the time limit."""
    waiting = summarize([ev("started", 0), ev("preempted", 7, step=53), ev("time_limit", 8)])
    assert waiting.ended == "time_limit" and waiting.interruptions == []
    requeued = JobStatus(JobState.REQUEUED, preemptions=1, restarts=1)
    assert waiting.preemptions_with(requeued) == 0
    spec = _spec(fallback_to_ondemand_after=1, max_preemptions=1)
    assert decide(spec, JobStatus(JobState.PREEMPTED, preemptions=1), waiting).action == Recovery.RESUME
    preempted = summarize([ev("started", 0), ev("preempted", 7, step=53)])
    assert preempted.ended == "preempted" and preempted.preemptions_with(requeued) == 1


def test_each_kind_of_interruption_is_observed_by_its_own_name():
    from sensors.preemption import observation

    for kind, label in [("preempted", "preemption"), ("killed", "killed without notice"),
                        ("node_failure", "node failure"), ("time_limit", "time limit")]:
        interruption = Interruption(at=1.0, kind=kind, step_reached=10, resumed_step=8, recovery_seconds=3.0)
        assert observation("run-1", "slurm", interruption).metadata["event"].value == label
