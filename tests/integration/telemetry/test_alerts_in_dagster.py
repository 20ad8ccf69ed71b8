"""Alerts through Dagster: asset checks on a real slow training run, the alert sensor delivering to a
Slack webhook on loopback (and only once), while the run trains.

`tp status` and `tp metrics` read the platform server: tests/integration/server/test_run_lifecycle.py."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import dagster as dg
import pytest

from assets import ALL_ASSETS, ALL_CHECKS
from definitions import defs
from resources.alerts import AlertsResource, webhook_from_environment
from resources.launcher import LauncherResource
from resources.platform import PlatformResource
from sensors.alerts import alert_sensor
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ALERTS = {"utilization_window_s": 2.0, "failure_rate_min_runs": 3, "failure_rate_max": 0.5}


@pytest.fixture(scope="module")
def webhook():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/services/hook", received
    server.shutdown()


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tp-home")
    dagster_home = root / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {"root": root, "dagster_home": dagster_home}


def resources(root: Path) -> dict:
    return {
        "platform": PlatformResource(home=str(root)),
        "launcher": LauncherResource(poll_seconds=0.2),
        "alerts": AlertsResource(**ALERTS, webhook_url=webhook_from_environment()),
    }


def spec(snapshot_id: str, max_steps: int = 80):
    return parse_spec(
        {
            "name": "alerting",
            "team": "qa",
            "owner": "ci",
            "model": {"size": "tiny"},
            "dataset": {"snapshot_id": snapshot_id},
            "training": {"max_steps": max_steps, "batch_size": 32, "eval_every": 50, "log_every": 10},
            "resources": {"procs_per_node": 1},
            "checkpoint": {"every_steps": 1000},
        }
    )


@pytest.fixture(scope="module")
def pipeline(env):
    """A slow-data training run materialized through Dagster, watched by the alert sensor."""
    root = env["root"]
    home = PlatformHome(root).ensure()
    mp = pytest.MonkeyPatch()
    mp.setenv("TP_SLOW_DATA_SECONDS", "0.2")  # the worker inherits it: a loader that cannot keep up
    mp.setenv("TP_TELEMETRY_INTERVAL_S", "0.1")
    mp.setenv("DAGSTER_HOME", str(env["dagster_home"]))
    mp.setenv("TP_HOME", str(root))
    instance = dg.DagsterInstance.get()
    try:
        snapshot_id = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
        run_id = register_run(home, spec(snapshot_id), run_id="slow-run")
        instance.add_dynamic_partitions("training_runs", [run_id])
        box: dict = {}

        def materialize():
            box["result"] = dg.materialize(
                [*ALL_ASSETS, *ALL_CHECKS],
                selection=["training_run"],
                partition_key=run_id,
                instance=instance,
                resources=resources(root),
                raise_on_error=False,
            )

        worker = threading.Thread(target=materialize)
        worker.start()
        watched = watch_running(instance, home, run_id, worker)
        worker.join(timeout=300)
        assert "result" in box, "the training run did not finish in 300 s"
        # Two runs whose snapshot does not exist: refused at preflight, so they fail fast and for real.
        for name in ("broken-1", "broken-2"):
            register_run(home, spec("0" * 64), run_id=name)
            instance.add_dynamic_partitions("training_runs", [name])
            failed = dg.materialize(
                [*ALL_ASSETS, *ALL_CHECKS],
                selection=["training_run"],
                partition_key=name,
                instance=instance,
                resources=resources(root),
                raise_on_error=False,
            )
            assert not failed.success
        yield {"result": box["result"], "instance": instance, "run_id": run_id, "watched": watched}
    finally:
        mp.undo()


def watch_running(instance: dg.DagsterInstance, home: PlatformHome, run_id: str, worker: threading.Thread) -> dict:
    """While the run trains (past step 5): the alert sensor's first tick that delivers something."""
    telemetry = home.run_dir(run_id) / "telemetry.json"
    while worker.is_alive():
        if not telemetry.is_file() or json.loads(telemetry.read_text())["step"] < 5:
            time.sleep(0.2)
            continue
        tick = alert_sensor(dg.build_sensor_context(instance=instance, resources=resources(home.root)))
        if not tick.skip_message.startswith("0 new"):
            return {"alert": {"message": tick.skip_message, "still_training": worker.is_alive()}}
        time.sleep(0.2)
    return {}


def test_an_idle_run_is_alerted_while_it_trains(pipeline, env):
    """The alert sensor, ticking while the slow run trains, flags its utilization: as a failed asset check
    on its partition before the run ends, and as a run tag its later ticks keep (the run's own progress
    tags, written at the same moment, can write over it: tests/unit/telemetry/test_alert_tags.py)."""
    seen = pipeline["watched"].get("alert")
    assert seen is not None and seen["still_training"], f"no live alert while the run trained: {seen}"
    instance, run_id = pipeline["instance"], pipeline["run_id"]
    alert_sensor(dg.build_sensor_context(instance=instance, resources=resources(env["root"])))
    dagster_run = pipeline["result"].dagster_run
    tags = instance.get_run_by_id(dagster_run.run_id).tags
    assert tags["tp/alert/low_utilization"].startswith(f"[low_utilization] run {run_id}: CPU utilization averaged")
    check_key = dg.AssetCheckKey(dg.AssetKey("training_run"), "low_utilization")
    evaluations = instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.ASSET_CHECK_EVALUATION))
    live = [r.event_log_entry.dagster_event.event_specific_data for r in evaluations]
    assert any(e.asset_check_key == check_key and not e.passed and e.metadata.get("live") for e in live), live


def test_alert_checks_warn_on_the_slow_run(pipeline):
    result = pipeline["result"]
    assert result.success, "a failing alert check must warn, not fail the run"
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert {"low_utilization", "data_wait", "checkpoint_overhead", "cost_outlier", "queue_wait"} <= set(checks)
    assert not checks["data_wait"].passed and checks["data_wait"].severity == dg.AssetCheckSeverity.WARN
    assert "run slow-run" in checks["data_wait"].description and "Look at:" in checks["data_wait"].description
    assert not checks["low_utilization"].passed
    assert checks["checkpoint_overhead"].passed and checks["queue_wait"].passed and checks["cost_outlier"].passed


def test_training_run_materialization_shows_cost_utilization_and_plots(pipeline):
    event = pipeline["instance"].get_latest_materialization_event(dg.AssetKey("training_run"))
    metadata = event.asset_materialization.metadata
    assert metadata["cost_usd"].value > 0 and 0 <= metadata["utilization_pct"].value <= 100
    assert metadata["data_wait_fraction"].value > 0.1
    for plot in ("loss_curve", "utilization_plot", "cost_plot"):
        assert isinstance(metadata[plot], dg.MarkdownMetadataValue)
        assert "data:image/png;base64," in metadata[plot].value


def test_mlflow_has_system_metrics_run_figures_and_plots(pipeline, env):
    from mlflow.tracking import MlflowClient

    run_id = pipeline["result"].asset_value("training_run")["mlflow_run_id"]
    client = MlflowClient(tracking_uri=resources(env["root"])["platform"].mlflow_uri())
    assert len(client.get_metric_history(run_id, "system/utilization_pct")) >= 3
    metrics = client.get_run(run_id).data.metrics
    assert metrics["run/data_wait_fraction"] > 0.1 and metrics["run/cost_usd"] > 0
    plots = {artifact.path for artifact in client.list_artifacts(run_id, "plots")}
    assert {"plots/loss_curve.png", "plots/utilization.png", "plots/cost.png"} <= plots


def test_alert_sensor_delivers_each_alert_once(pipeline, env, webhook, monkeypatch):
    url, received = webhook
    monkeypatch.setenv("TP_SLACK_WEBHOOK_URL", url)
    instance = pipeline["instance"]
    context = dg.build_sensor_context(instance=instance, resources=resources(env["root"]))
    first = alert_sensor(context)
    assert isinstance(first, dg.SkipReason)
    texts = [m["text"] for m in received]
    assert any(t.startswith("[failure_rate] team qa: 2 of its 3 runs of the last 24 h failed") for t in texts), texts
    assert any(t.startswith("[data_wait] run slow-run:") for t in texts), texts
    assert any(t.startswith("[low_utilization] run slow-run:") for t in texts), texts
    assert not any("checkpoint_overhead" in t for t in texts), texts
    again = alert_sensor(
        dg.build_sensor_context(instance=instance, resources=resources(env["root"]), cursor=context.cursor)
    )
    assert again.skip_message.startswith("0 new alert(s)") and len(received) == len(texts)


def test_definitions_register_alert_checks_sensor_and_resource():
    dg.Definitions.validate_loadable(defs)
    checks = {key.name for key in defs.resolve_asset_graph().asset_check_keys if key.asset_key.path == ["training_run"]}
    assert {"low_utilization", "data_wait", "checkpoint_overhead", "cost_outlier", "queue_wait"} <= checks
    assert defs.resolve_sensor_def("alert_sensor") is not None
    assert "alerts" in defs.resources
