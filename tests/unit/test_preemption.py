"""Preemption accounting from a run's event log, and the recovery policy."""

from training_platform.launch import JobState, JobStatus
from training_platform.preemption import Recovery, decide, summarize
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
