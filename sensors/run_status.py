"""Failures that are not preemptions: report them, and retry only what the spec's policy allows.

The rule (`will_retry`) is shared with the sweep sensor, which waits for a retry instead of telling
Optuna that a trial failed, and with `tp`, which follows a run into its retry (client/runs.py).
"""

import dagster as dg

from assets.jobs import run_asset_keys, training_pipeline
from resources.platform import PlatformResource
from training_platform.errors import PlatformError
from training_platform.launch import JobState
from training_platform.launch.following import newest_job
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import load_run_spec
from training_platform.spec import TrainSpec
from training_platform.spec.submission import PARTITION_TAG, RETRY_TAG, retry_expected


def users_error(instance: dg.DagsterInstance, dagster_run_id: str):
    """The exception the platform's code raised in the run's first failed step (under Dagster's wrappers)."""
    for record in instance.all_logs(dagster_run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        error = record.dagster_event.step_failure_data.error
        while error is not None and error.cause is not None and error.cls_name.startswith("Dagster"):
            error = error.cause
        if error is not None:
            return error
    return None


def will_retry(instance: dg.DagsterInstance, failed: dg.DagsterRun, spec: TrainSpec) -> bool:
    """Whether the failure sensor resubmits this failed run: within the spec's retries, and not for bad input."""
    retries = sum(
        RETRY_TAG in r.tags for r in instance.get_runs(dg.RunsFilter(tags={PARTITION_TAG: failed.tags[PARTITION_TAG]}))
    )
    error = users_error(instance, failed.run_id)
    return retry_expected(error.cls_name if error else None, retries, spec.preemption.retry_failures)


@dg.run_failure_sensor(
    name="training_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    request_job=training_pipeline,
    description="Reports failed training runs; resubmits only as many times as preemption.retry_failures allows.",
)
def training_failure_sensor(context: dg.RunFailureSensorContext, platform: PlatformResource):
    failed = context.dagster_run
    run_id = failed.tags.get(PARTITION_TAG)
    if not run_id:
        return
    home = platform.paths()
    job = newest_job(run_id, RunEvents(home.run_dir(run_id)).read())
    if job is not None and job.ended == JobState.PREEMPTED.value:
        return  # the preemption sensor owns preempted runs
    if job is not None and job.left_behind:
        return  # the run went down while its job went on: the preemption sensor has a new run take the job over
    try:
        spec = load_run_spec(home, run_id)
    except PlatformError:
        return  # not a training run of ours
    error = users_error(context.instance, failed.run_id)
    reason = (error.message if error else context.failure_event.message or "failed").strip().splitlines()[0][:300]
    if not will_retry(context.instance, failed, spec):
        context.log.warning(
            f"training run {run_id} failed and is not retried (bad input, or preemption.retry_failures="
            f"{spec.preemption.retry_failures} used): {reason}"
        )
        return
    yield dg.RunRequest(
        run_key=f"{run_id}:retry:{failed.run_id}",
        partition_key=run_id,
        tags={RETRY_TAG: failed.run_id, "tp/reason": reason[:200]},
        asset_selection=run_asset_keys(spec),
    )
