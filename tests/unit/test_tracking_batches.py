"""A run's figures and tags go to MLflow in one write each (log_batch), and arrive whole."""

from mlflow.tracking import MlflowClient

from training_platform.registry.tracking import ensure_experiment, log_metrics, set_tags


def test_metrics_and_tags_arrive_whole_in_one_request_each(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(ensure_experiment(uri, "qa/batches", tmp_path)).info.run_id
    batches = []
    original = MlflowClient.log_batch
    monkeypatch.setattr(MlflowClient, "log_batch", lambda self, *a, **k: batches.append(k) or original(self, *a, **k))

    log_metrics(uri, run_id, {"test_accuracy": 0.97, "test_loss": 0.1, "epochs": 3})
    set_tags(uri, run_id, {"promoted": "true", "champion_version": 2})

    assert len(batches) == 2
    data = client.get_run(run_id).data
    assert data.metrics == {"test_accuracy": 0.97, "test_loss": 0.1, "epochs": 3.0}
    assert {k: data.tags[k] for k in ("promoted", "champion_version")} == {"promoted": "true", "champion_version": "2"}
