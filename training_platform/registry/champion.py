"""The champion measured again, on the candidate's test split, so the gate compares like with like.

A registered version's metric tags were measured on the test split of its own run's snapshot. A daily
retrain's candidate is measured on a newer snapshot: comparing the two numbers compares two different
test sets. The gate therefore re-evaluates the champion's checkpoint (pinned while its version exists) on
the candidate's split, from the champion run's finished record: a template's model in this process, a
user's script in a process of its own (script_evaluation.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from training_platform.errors import CheckpointError, PlatformError
from training_platform.paths import PlatformHome
from training_platform.registry.evaluate import evaluate_checkpoint, find_checkpoint
from training_platform.runs.attempts import latest_record
from training_platform.spec import parse_spec


class ChampionNotMeasured(PlatformError):
    """The champion cannot be measured on the candidate's split (its run's record is gone, its model does not
    take the new snapshot's columns, ...)."""


def measured_on(tags: Mapping[str, str]) -> str | None:
    """The snapshot whose test split a version's metrics come from (older versions: their lineage's snapshot)."""
    return tags.get("test_split_of") or tags.get("snapshot_id")


def remeasure(home: PlatformHome, tags: Mapping[str, str], snapshot_id: str) -> dict[str, float]:
    """The test metrics of the version tagged TAGS on the test split of SNAPSHOT_ID."""
    run_id = tags.get("training_run")
    record = latest_record(home.run_dir(run_id)) if run_id else None
    if record is None:
        raise ChampionNotMeasured(f"its training run {run_id}'s record is not in {home.runs}")
    spec = parse_spec(record["spec"], source=f"run {run_id}'s record")
    final = next((c for c in record["checkpoints"] if c["step"] == record["final_step"]), None)
    if final is None:
        raise ChampionNotMeasured(f"its run {run_id} recorded no checkpoint at its final step {record['final_step']}")
    store_uri = record["store_uri"]
    try:
        manifest = find_checkpoint(store_uri, record["checkpoint_key"], final["step"], final["sha256"])
    except CheckpointError as exc:
        raise ChampionNotMeasured(str(exc)) from None
    if spec.entrypoint is not None:
        from training_platform.registry.script_evaluation import EvaluationError, evaluate_script

        try:
            script = evaluate_script(home, spec, run_id, manifest, store_uri, snapshot_id=snapshot_id)
        except EvaluationError as exc:  # e.g. its model does not take the new snapshot's columns
            raise ChampionNotMeasured(f"its script's evaluation failed: {str(exc).splitlines()[0]}") from None
        weights, metrics = script.weights_sha256, script.metrics
    else:
        try:
            evaluation, _ = evaluate_checkpoint(spec.with_snapshot(snapshot_id), home.snapshots, store_uri, manifest)
        except RuntimeError as exc:  # load_state_dict: the new snapshot has other features or classes
            first = str(exc).strip().splitlines()[-1].strip()
            raise ChampionNotMeasured(f"its model does not take snapshot {snapshot_id[:12]}'s data ({first})") from None
        weights, metrics = evaluation.weights_sha256, evaluation.metrics
    if tags.get("weights_sha256") and weights != tags["weights_sha256"]:
        raise ChampionNotMeasured(f"checkpoint {manifest.uri} does not hold the registered weights")
    return metrics
