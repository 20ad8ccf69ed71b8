"""Runs of one model that finish together: the champion alias ends on the best of them, and none fails.

Without the model's lock, two processes setting the alias at once on MLflow's SQLite store collided
(`UNIQUE constraint failed: registered_model_aliases`), and a worse candidate could end champion.
"""

import multiprocessing
from pathlib import Path

from training_platform.registry.tracking import CHAMPION_ALIAS, promote, promotion_gate
from training_platform.spec import GateSpec
from training_platform.state.backends import shared_lock

ACCURACIES = [0.90, 0.95, 0.93, 0.91]


def _promote(uri: str, run_id: str, version: str, accuracy: float, home: str, barrier) -> None:
    barrier.wait()  # every candidate reaches the gate together
    lock = shared_lock(Path(home), "registry", "race-model")
    promote(uri, run_id, "race-model", version, {"accuracy": accuracy}, GateSpec(), lock)


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


def test_the_gate_compares_the_specs_metric_in_its_direction_by_its_margin(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_registered_model("gated")
    champion = client.create_model_version(
        "gated", source=str(tmp_path / "v1"), tags={"test_loss": "0.500000", "test_accuracy": "0.900000"}
    ).version
    client.set_registered_model_alias("gated", CHAMPION_ALIAS, champion)

    def decide(candidate: dict[str, float], **gate) -> tuple[bool, str]:
        decision = promotion_gate(uri, "gated", candidate, GateSpec(**gate))
        return decision.promote, decision.reason

    assert decide({"accuracy": 0.9}) == (False, "test accuracy 0.9000 does not beat champion v1 (0.9000)")
    assert decide({"accuracy": 0.91})[0] is True
    assert decide({"accuracy": 0.91}, min_improvement=0.02) == (
        False, "test accuracy 0.9100 does not beat champion v1 (0.9000) by at least 0.02"
    )
    assert decide({"loss": 0.4}, metric="loss", direction="minimize") == (
        True, "test loss 0.4000 beats champion v1 (0.5000)"
    )
    assert decide({"loss": 0.6}, metric="loss", direction="minimize")[0] is False
    promoted, reason = decide({"f1": 0.99}, metric="f1")
    assert not promoted and reason.startswith("champion v1 has no test f1 to compare with")


def test_a_champion_measured_on_another_split_is_measured_again_on_the_candidates(tmp_path):
    from mlflow.tracking import MlflowClient

    from training_platform.registry.champion import ChampionNotMeasured

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_registered_model("daily")
    tags = {"test_accuracy": "0.900000", "test_split_of": "a" * 64, "training_run": "daily-1"}
    champion = client.create_model_version("daily", source=str(tmp_path / "v1"), tags=tags).version
    client.set_registered_model_alias("daily", CHAMPION_ALIAS, champion)
    asked: list[str] = []

    def on_new_split(champion_tags) -> dict[str, float]:
        asked.append(champion_tags["training_run"])
        return {"accuracy": 0.95, "loss": 0.2}

    decision = promotion_gate(uri, "daily", {"accuracy": 0.93}, GateSpec(), "b" * 64, on_new_split)
    assert asked == ["daily-1"] and not decision.promote and decision.champion_value == 0.95
    assert decision.reason == (
        f"test accuracy 0.9300 does not beat champion v1 (0.9500), both on the test split of snapshot {'b' * 12} "
        "(champion v1 measured again on it)"
    )

    def gone(champion_tags) -> dict[str, float]:
        raise ChampionNotMeasured("its training run daily-1's record is not in /runs")

    decision = promotion_gate(uri, "daily", {"accuracy": 0.93}, GateSpec(), "b" * 64, gone)
    assert decision.promote and decision.champion_value == 0.9  # as recorded, and the reason says so
    assert decision.reason.endswith(
        f"the champion as recorded on snapshot {'a' * 12}'s test split, the candidate on {'b' * 12}'s: the champion "
        "could not be measured again (its training run daily-1's record is not in /runs)"
    )

    def never(champion_tags) -> dict[str, float]:
        raise AssertionError("measured again on its own split")

    same = promotion_gate(uri, "daily", {"accuracy": 0.91}, GateSpec(), "a" * 64, never)
    assert same.promote and same.reason.endswith(f"both on the test split of snapshot {'a' * 12}")
