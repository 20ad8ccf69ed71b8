"""Alert thresholds and delivery: the Dagster log always, a Slack incoming webhook when configured.

The webhook URL is a secret: the resource names the environment variable that holds it
(default TP_SLACK_WEBHOOK_URL), read at delivery time, so the URL never appears in the UI or logs.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from training_platform.telemetry.alerts import Alert, AlertThresholds

_DEFAULTS = AlertThresholds()


class AlertsResource(dg.ConfigurableResource):
    """When alerts fire (thresholds) and where they go (log, optional Slack webhook)."""

    utilization_min_pct: float = Field(_DEFAULTS.utilization_min_pct, description="utilization floor, %")
    utilization_window_s: float = Field(
        _DEFAULTS.utilization_window_s, description="seconds utilization must stay under the floor to alert"
    )
    data_wait_max_fraction: float = Field(_DEFAULTS.data_wait_max_fraction, description="max data wait share")
    queue_wait_max_s: float = Field(_DEFAULTS.queue_wait_max_s, description="max seconds a run may wait to start")
    failure_rate_max: float = Field(_DEFAULTS.failure_rate_max, description="max failure share of recent runs")
    failure_rate_window: int = Field(_DEFAULTS.failure_rate_window, description="recent finished runs considered")
    cost_max_ratio: float = Field(_DEFAULTS.cost_max_ratio, description="max cost as a multiple of the family median")
    cost_min_family_runs: int = Field(
        _DEFAULTS.cost_min_family_runs, description="finished runs a family needs before costs are compared"
    )
    checkpoint_overhead_max: float = Field(
        _DEFAULTS.checkpoint_overhead_max, description="max share of the loop spent checkpointing"
    )
    slack_webhook_env: str = Field(
        "TP_SLACK_WEBHOOK_URL", description="environment variable holding the Slack incoming webhook; unset: log only"
    )
    timeout_s: float = Field(5.0, gt=0, description="seconds to wait for the webhook")

    def thresholds(self) -> AlertThresholds:
        return AlertThresholds(**{name: getattr(self, name) for name in AlertThresholds.model_fields})

    def deliver(self, alerts: Sequence[Alert], log: logging.Logger | dg.DagsterLogManager | None = None) -> list[str]:
        """Log every alert and post it to Slack when configured; returns the delivery problems, if any."""
        log = log or logging.getLogger("training_platform.alerts")
        problems = []
        webhook = os.environ.get(self.slack_webhook_env)
        for alert in alerts:
            (log.error if alert.severity == "ERROR" else log.warning)(alert.text())
            if not webhook:
                continue
            try:
                post_slack(webhook, alert, self.timeout_s)
            except (urllib.error.URLError, OSError) as exc:
                # Never name the URL: it is a secret.
                problem = f"Slack delivery of {alert.rule} for run {alert.run_id} failed: {exc}; check the webhook"
                log.warning(problem)
                problems.append(problem)
        return problems


def post_slack(url: str, alert: Alert, timeout_s: float = 5.0) -> None:
    body = {
        "text": alert.text(),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{alert.rule}* on run `{alert.run_id}`"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{alert.what}\n*Look at:* {alert.look_at}"}},
        ],
    }
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if response.status >= 300:
            raise OSError(f"webhook answered HTTP {response.status}")
