"""The worker's reporting: MLflow metrics buffered between flushes and all written by close, at the steps and
times taken; repeated progress lines to Dagster Pipes at most once per interval, none lost at the end."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from dagster_pipes import DAGSTER_PIPES_MESSAGES_ENV_VAR, PipesContext, encode_env_var
from mlflow.tracking import MlflowClient

from tests.fixtures.worker import wait_until
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
    wait_until(lambda: [m.value for m in client.get_metric_history(run_id, "train_loss")] == [2.0], 30, "the flush")
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
    refused = threading.Event()

    def outage(*args, **kwargs):
        refused.set()
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(reporter._mlflow, "log_batch", outage)
    reporter.metrics(1, {"train_loss": 2.0})  # training goes on through the outage
    assert refused.wait(30)
    monkeypatch.setattr(reporter._mlflow, "log_batch", real_log_batch)
    reporter.metrics(2, {"train_loss": 1.0})
    history = lambda: [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")]  # noqa: E731
    wait_until(lambda: history() == [(1, 2.0), (2, 1.0)], 30, "both points in MLflow")
    reporter.close()


def test_a_hanging_tracking_server_does_not_hold_the_training_loop(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 0.0)
    reporter = Reporter(enabled=True)
    real_log_batch = reporter._mlflow.log_batch
    writing, server_back = threading.Event(), threading.Event()

    def hanging(*args, **kwargs):  # MLflow's client retrying against a server that is down
        writing.set()
        assert server_back.wait(60)
        return real_log_batch(*args, **kwargs)

    monkeypatch.setattr(reporter._mlflow, "log_batch", hanging)
    reporter.metrics(1, {"train_loss": 3.0})
    assert writing.wait(30)
    for step in range(2, 200):  # returns while the write hangs: the loop goes on
        reporter.metrics(step, {"train_loss": 1.0 / step})
    server_back.set()
    reporter.close()
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == list(range(1, 200))


def test_the_end_of_a_run_waits_for_a_tracking_server_that_comes_back(mlflow_run, monkeypatch):
    client, run_id = mlflow_run
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(reporting, "MLFLOW_RETRY_SECONDS", 0.0)
    reporter = Reporter(enabled=True)
    real_log_batch = reporter._mlflow.log_batch
    attempts = []

    def down_twice(*args, **kwargs):
        attempts.append(1)
        if len(attempts) <= 2:
            raise ConnectionError("tracking server unreachable")
        return real_log_batch(*args, **kwargs)

    monkeypatch.setattr(reporter._mlflow, "log_batch", down_twice)
    reporter.metrics(7, {"train_loss": 0.5})
    reporter.close()
    assert len(attempts) == 3
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(7, 0.5)]


def test_the_end_of_a_run_gives_up_on_a_tracking_server_that_stays_down(mlflow_run, monkeypatch, caplog):
    monkeypatch.setattr(reporting, "MLFLOW_FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(reporting, "MLFLOW_RETRY_SECONDS", 0.0)
    monkeypatch.setattr(reporting, "MLFLOW_CLOSE_SECONDS", 0.2)
    reporter = Reporter(enabled=True)

    def outage(*args, **kwargs):
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(reporter._mlflow, "log_batch", outage)
    reporter.metrics(7, {"train_loss": 0.5, "lr": 0.1})
    with caplog.at_level(logging.WARNING, logger="training_platform.worker"):
        reporter.close()
    assert "last 2 metric points" in caplog.text


@pytest.fixture
def pipes_messages(tmp_path, monkeypatch):
    """A real Dagster Pipes channel into a file, as the launcher sets one up (context in the environment)."""
    messages = tmp_path / "pipes-messages.jsonl"
    context = {
        "asset_keys": ["training_run"],
        "code_version_by_asset_key": None,
        "provenance_by_asset_key": None,
        "partition_key": None,
        "partition_key_range": None,
        "partition_time_window": None,
        "run_id": "dagster-run",
        "job_name": None,
        "retry_number": 0,
        "extras": {},
    }
    monkeypatch.setenv(reporting.PIPES_CONTEXT_ENV_VAR, encode_env_var({"data": context}))
    monkeypatch.setenv(DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_env_var({"path": str(messages)}))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setattr(PipesContext, "_instance", None)  # the process-wide context: one per worker process

    def logged() -> list[str]:
        lines = [json.loads(line) for line in messages.read_text().splitlines()]
        return [line["params"]["message"] for line in lines if line["method"] == "log"]

    return logged


def test_repeated_lines_reach_dagster_once_per_interval_in_order_and_the_newest_is_kept(
    pipes_messages, monkeypatch, caplog
):
    monkeypatch.setattr(reporting, "PIPES_PROGRESS_SECONDS", 3600.0)
    reporter = Reporter(enabled=True)
    with caplog.at_level(logging.INFO, logger="training_platform.worker"):
        for step in (10, 20, 30):
            reporter.metrics(step, {"train_loss": 1.0 / step})
        reporter.progress("checkpoint", "checkpoint step 20")
        reporter.progress("checkpoint", "checkpoint step 30")
        reporter.info("finished at step 30")
        reporter.close()
    assert pipes_messages() == [
        "step 10: train_loss=0.1",  # the first line of each kind goes at once
        "step 30: train_loss=0.03333",  # held back (step 20 was replaced), sent before the next line
        "checkpoint step 20",
        "checkpoint step 30",  # held back, sent before the line that followed it
        "finished at step 30",
    ]
    worker_log = [r.getMessage() for r in caplog.records]  # the worker's own log keeps every line
    assert "step 20: train_loss=0.05" in worker_log and "checkpoint step 30" in worker_log


def test_a_held_line_is_sent_at_close(pipes_messages, monkeypatch):
    monkeypatch.setattr(reporting, "PIPES_PROGRESS_SECONDS", 3600.0)
    reporter = Reporter(enabled=True)
    reporter.progress("checkpoint", "checkpoint step 50")
    reporter.progress("checkpoint", "checkpoint step 100")
    reporter.close()
    assert pipes_messages() == ["checkpoint step 50", "checkpoint step 100"]


def test_every_line_goes_once_the_interval_passed(pipes_messages, monkeypatch):
    monkeypatch.setattr(reporting, "PIPES_PROGRESS_SECONDS", 0.0)
    reporter = Reporter(enabled=True)
    for step in (1, 2, 3):
        reporter.metrics(step, {"train_loss": float(step)})
    reporter.close()
    assert pipes_messages() == ["step 1: train_loss=1", "step 2: train_loss=2", "step 3: train_loss=3"]
