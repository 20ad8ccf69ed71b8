"""What a submission to the platform server looks like: job names, tags and run config.

Shared by the client (`tp`, through GraphQL) and the code location (assets, sensors, schedules),
so both sides name a job, a tag or a config field the same way.
"""

from __future__ import annotations

from training_platform.spec import DatasetSpec, TrainSpec

LOCATION = "definitions"
"""The code location's name (the `definitions` module) and its repository's, as the server knows them."""
REPOSITORY = "__repository__"
TRAINING_RUNS = "training_runs"
"""The dynamic partitions of training runs: one per run, keyed by its run id."""
TRAINING_JOB = "training_pipeline"
SNAPSHOT_JOB = "dataset_snapshot_job"
SWEEP_JOB = "sweep_job"
SNAPSHOT_ASSET = "dataset_snapshot"
SNAPSHOT_CHECK = "dataset_snapshot_expectations"
"""The blocking Great Expectations check of every snapshot: its verdict decides whether a snapshot may train."""
RUN_ASSETS = ("training_run", "checkpoints", "evaluated_model", "registered_model")
OWN_CODE_ASSETS = ("training_run", "checkpoints")  # a user's script whose spec has no `evaluation`

PARTITION_TAG = "dagster/partition"
BACKFILL_TAG = "dagster/backfill"
THEN_TRAIN_TAG = "tp/then_train"
"""On a snapshot run: the training run (partition) to start once the snapshot passes its expectations."""
SERIAL_TAG = "tp/serial"
"""Runs that share a value run one at a time, in the order queued (deploy/dagster/dagster.yaml)."""
SWEEP_TAG = "sweep"
OWN_CODE_TAG = "tp/own_code"
"""On a run of a user's own script without an `evaluation` section: only training_run and checkpoints."""
RESUME_TAG = "tp/resume_of"
RETRY_TAG = "tp/retry_of"
FOLLOW_TAG = "tp/follow_of"
"""On a run that takes over the job of a Dagster run that went down (the tag names it): it follows the job to its
end, whatever that end is, and materializes the run if it succeeded (launch/following.py)."""
LEFT_JOB_TAG = "tp/left_job"
"""On a run that stopped following its job while the job went on (its process died, or it failed on an error of
its own), naming the job: a run tagged FOLLOW_TAG takes the job over, and `tp` follows into it."""
USER_TAG = "tp/user"
"""Who asked the server for the run (training_platform/server/auth.py): written by the run coordinator from the
signed-in request, over whatever the client sent; a run the platform starts itself (a resume, a retry, a schedule's)
keeps the one of the run it continues, or has none."""
REPRODUCTION_TAG = "tp/reproduction_of"
CARRIED_TAGS = ("team", "owner", "dagster/priority", SWEEP_TAG, OWN_CODE_TAG)
"""What a resume, a retry or a reproduction keeps of the run it continues."""


# Bad input fails the same way every time, and a run over its team's budget stays over it: retrying either
# only burns compute or fails again. So does a script's evaluation, which a retry would train again for.
NOT_RETRYABLE = ("SpecError", "SnapshotError", "BudgetError", "EvaluationError")


def retry_expected(error_class: str | None, retries_used: int, retries_allowed: int) -> bool:
    """Whether a failed training run is resubmitted (sensors/run_status.py decides; `tp` follows into it)."""
    return error_class not in NOT_RETRYABLE and retries_used < retries_allowed


def carried_tags(tags: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in tags.items() if key in CARRIED_TAGS}


def run_assets(tags: dict[str, str]) -> tuple[str, ...]:
    """The assets a run materializes: all of them, or a user's own script's two."""
    return OWN_CODE_ASSETS if tags.get(OWN_CODE_TAG) == "1" else RUN_ASSETS


def assets_for(spec: TrainSpec) -> tuple[str, ...]:
    """A template's run, or a script's whose spec says how to evaluate it: all four; else the script's two."""
    return OWN_CODE_ASSETS if spec.entrypoint is not None and spec.evaluation is None else RUN_ASSETS


def training_run_config(spec: TrainSpec | None = None, backend: str | None = None) -> dict:
    """Config of a training_pipeline run: a new run's spec (JSON), an override of its backend."""
    config = ({"spec": spec.model_dump_json()} if spec is not None else {}) | ({"backend": backend} if backend else {})
    return {"ops": {"training_run": {"config": config}}} if config else {}


def snapshot_run_config(
    source: str, landing_dir: str | None = None, then_train: TrainSpec | None = None, dataset: DatasetSpec | None = None
) -> dict:
    """Config of a dataset_snapshot run that builds `source`, then (tagged THEN_TRAIN_TAG) trains `then_train`;
    `dataset` says how to read a source of your own files (its columns and split)."""
    config: dict[str, str] = {"source": source}
    if landing_dir:
        config["landing_dir"] = landing_dir
    if then_train is not None:
        config["spec"] = then_train.model_dump_json()
    if dataset is not None and dataset.is_file_source:
        config["dataset"] = dataset.model_dump_json(include={"source", "columns", "split", "expectations"})
    return {"ops": {"dataset_snapshot": {"config": config}}}
