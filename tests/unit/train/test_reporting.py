"""The worker's MLflow metrics: buffered between flushes, all written by close, at the steps and times taken."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from training_platform.train import reporting
from training_platform.train.reporting import Reporter


@pytest.fixture
def mlflow_run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("reporting")).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.delenv(reporting.PIPES_CONTEXT_ENV_VAR, raising=False)
    return client, run_id


def test_metrics_are_written_in_batches_and_all_by_close(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 3600.0)
    reporter = Reporter(enabled=True)
    for step in (10, 20, 30):
        reporter.metrics(step, {"train_loss": 1.0 / step})
    assert client.get_metric_history(run_id, "train_loss") == []  # buffered, not yet written
    reporter.close()
    history = client.get_metric_history(run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(10, 0.1), (20, 0.05), (30, 1.0 / 30)]
    assert all(m.timestamp > 0 for m in history)


def test_a_due_flush_writes_at_once(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 0.0)
    reporter = Reporter(enabled=True)
    reporter.metrics(1, {"train_loss": 2.0})
    assert [m.value for m in client.get_metric_history(run_id, "train_loss")] == [2.0]
    reporter.close()


def test_a_failing_run_still_writes_its_metrics(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 3600.0)
    reporter = Reporter(enabled=True)
    reporter.metrics(5, {"train_loss": 3.0})
    reporter.fail(RuntimeError("user code failed"))
    assert [m.value for m in client.get_metric_history(run_id, "train_loss")] == [3.0]


def test_points_mlflow_refuses_are_kept_and_written_later(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 0.0)
    reporter = Reporter(enabled=True)
    real_log_batch = reporter._mlflow.log_batch

    def outage(*args, **kwargs):
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(reporter._mlflow, "log_batch", outage)
    reporter.metrics(1, {"train_loss": 2.0})  # training goes on through the outage
    monkeypatch.setattr(reporter._mlflow, "log_batch", real_log_batch)
    reporter.metrics(2, {"train_loss": 1.0})
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(1, 2.0), (2, 1.0)]
    reporter.close()
