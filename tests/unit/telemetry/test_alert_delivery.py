"""Alert delivery: always the log; a Slack incoming webhook (a real HTTP server on loopback) when configured."""

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import dagster as dg
import pytest

from resources.alerts import AlertsResource, webhook_from_environment
from training_platform.telemetry.alerts import Alert, AlertThresholds

ALERT = Alert("data_wait", "run-7", "40% of the loop waited for data", "the data loader", 0.4, 0.1)


@pytest.fixture
def webhook():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def test_alerts_go_to_the_log_without_a_webhook(caplog):
    with caplog.at_level(logging.WARNING):
        assert AlertsResource().deliver([ALERT]) == []
    assert "[data_wait] run run-7: 40% of the loop waited for data. Look at: the data loader" in caplog.text


def test_alerts_are_posted_to_the_webhook_named_by_an_env_var(webhook, monkeypatch):
    url, received = webhook
    monkeypatch.setenv("TP_SLACK_WEBHOOK_URL", url)

    @dg.sensor()
    def deliver(context, alerts: AlertsResource):
        assert alerts.deliver([ALERT]) == []

    resource = AlertsResource(webhook_url=webhook_from_environment())
    deliver(dg.build_sensor_context(resources={"alerts": resource}))
    assert len(received) == 1
    assert url not in repr(resource)  # what the UI shows: the variable's name
    assert "run-7" in received[0]["text"] and "Look at" in received[0]["blocks"][1]["text"]["text"]


def test_a_dead_webhook_is_reported_without_leaking_its_url(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING):
        problems = AlertsResource(webhook_url="http://127.0.0.1:9/secret-token", timeout_s=2).deliver([ALERT])
    assert len(problems) == 1 and "webhook delivery of data_wait:run-7 failed" in problems[0]
    assert "secret-token" not in caplog.text and "secret-token" not in problems[0]


def test_resource_thresholds_mirror_the_rule_thresholds():
    resource = AlertsResource(utilization_window_s=5, failure_rate_min_runs=4)
    assert set(AlertThresholds.model_fields) <= set(AlertsResource.model_fields)
    assert resource.thresholds() == AlertThresholds(utilization_window_s=5, failure_rate_min_runs=4)
    assert AlertsResource().thresholds() == AlertThresholds()


MALFORMED = ["hooks.slack.com/services/T0/B0/secret-token", "http://[secret-token", "ftp//secret-token"]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_webhook_is_reported_without_raising_or_leaking_it(caplog, url):
    # urllib raises ValueError naming the URL; it escaped the alert sensor with the secret in it.
    with caplog.at_level(logging.WARNING):
        (problem,) = AlertsResource(webhook_url=url, timeout_s=2).deliver([ALERT])
    assert "$TP_SLACK_WEBHOOK_URL is not a valid URL" in problem
    assert "secret-token" not in caplog.text and "secret-token" not in problem
