"""Runs of one model that finish together: the champion alias ends on the best of them, and none fails.

Without the model's lock, two processes setting the alias at once on MLflow's SQLite store collided
(`UNIQUE constraint failed: registered_model_aliases`), and a worse candidate could end champion.
"""

import multiprocessing
from pathlib import Path

from training_platform.documents import shared_lock
from training_platform.tracking import CHAMPION_ALIAS, promote

ACCURACIES = [0.90, 0.95, 0.93, 0.91]


def _promote(uri: str, run_id: str, version: str, accuracy: float, home: str, barrier) -> None:
    barrier.wait()  # every candidate reaches the gate together
    promote(uri, run_id, "race-model", version, accuracy, shared_lock(Path(home), "registry", "race-model"))


def test_candidates_finishing_together_leave_the_best_as_champion(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("race", artifact_location=str(tmp_path / "artifacts"))
    client.create_registered_model("race-model")
    candidates = []
    for accuracy in ACCURACIES:
        run = client.create_run(experiment).info.run_id
        version = client.create_model_version(
            "race-model", source=str(tmp_path / run), run_id=run, tags={"test_accuracy": f"{accuracy:.6f}"}
        ).version
        candidates.append((run, str(version), accuracy))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(candidates))
    workers = [
        context.Process(target=_promote, args=(uri, run, version, accuracy, str(tmp_path / "home"), barrier))
        for run, version, accuracy in candidates
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * len(workers)
    best_run, best_version, _ = max(candidates, key=lambda c: c[2])
    assert str(client.get_model_version_by_alias("race-model", CHAMPION_ALIAS).version) == best_version
    assert client.get_run(best_run).data.tags["candidate_status"] == "champion"
    # Each candidate recorded a decision: champion (then, at least) or rejected.
    decisions = [client.get_run(run).data.tags["candidate_status"] for run, _, _ in candidates]
    assert set(decisions) <= {"champion", "rejected"}
