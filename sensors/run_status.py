"""Failures that are not preemptions: report them, and retry only what the spec's policy allows."""

import dagster as dg

from assets.jobs import training_pipeline
from resources.platform import PlatformResource
from training_platform.errors import PlatformError
from training_platform.launch import JobState
from training_platform.runlog import RunEvents
from training_platform.runs import load_run_spec

PARTITION_TAG = "dagster/partition"
# Bad input fails the same way every time: retrying it only burns compute.
NOT_RETRYABLE = {"SpecError", "SnapshotError"}


def _first_step_error(context: dg.RunFailureSensorContext):
    for event in context.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None and error.cause is not None and error.cls_name.startswith("Dagster"):
            error = error.cause  # unwrap Dagster's execution wrappers down to the user's exception
        if error is not None:
            return error
    return None


@dg.run_failure_sensor(
    name="training_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    request_job=training_pipeline,
    description="Reports failed training runs; resubmits only as many times as preemption.retry_failures allows.",
)
def training_failure_sensor(context: dg.RunFailureSensorContext, platform: PlatformResource):
    run_id = context.dagster_run.tags.get(PARTITION_TAG)
    if not run_id:
        return
    home = platform.paths()
    events = RunEvents(home.run_dir(run_id))
    history = events.read()
    ended = [e for e in history if e["kind"] == "job_ended"]
    if ended and ended[-1]["state"] == JobState.PREEMPTED.value:
        return  # the preemption sensor owns preempted runs
    try:
        spec = load_run_spec(home, run_id)
    except PlatformError:
        return  # not a training run of ours
    retries = sum(1 for e in history if e["kind"] == "retry_requested")
    error = _first_step_error(context)
    reason = (error.message if error else context.failure_event.message or "failed").strip().splitlines()[0][:300]
    if error is not None and error.cls_name in NOT_RETRYABLE:
        context.log.warning(f"training run {run_id} failed on bad input and is not retried: {reason}")
        return
    if retries >= spec.preemption.retry_failures:
        context.log.warning(
            f"training run {run_id} failed and is not retried ({retries} of preemption.retry_failures="
            f"{spec.preemption.retry_failures} used): {reason}"
        )
        return
    events.append("retry_requested", dagster_run_id=context.dagster_run.run_id, reason=reason)
    yield dg.RunRequest(
        run_key=f"{run_id}:retry:{retries + 1}",
        partition_key=run_id,
        tags={"tp/retry_of": context.dagster_run.run_id, "tp/reason": reason[:200]},
    )
