"""Alert thresholds and delivery: the Dagster log always, a webhook (Slack's incoming-webhook format) when set.

The webhook URL is a secret: definitions.py passes it as `dg.EnvVar(WEBHOOK_ENV)`, so the UI shows the
variable's name, never the URL, and no log or error names it.
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

from training_platform.redaction import Redactor
from training_platform.telemetry.alerts import Alert, AlertThresholds

_DEFAULTS = AlertThresholds()
WEBHOOK_ENV = "TP_SLACK_WEBHOOK_URL"


class AlertsResource(dg.ConfigurableResource):
    """When alerts fire (thresholds) and where they go (log, optional Slack webhook)."""

    utilization_min_pct: float = Field(_DEFAULTS.utilization_min_pct, description="utilization floor, %")
    utilization_window_s: float = Field(
        _DEFAULTS.utilization_window_s, description="seconds utilization must stay under the floor to alert"
    )
    data_wait_max_fraction: float = Field(_DEFAULTS.data_wait_max_fraction, description="max data wait share")
    queue_wait_max_s: float = Field(_DEFAULTS.queue_wait_max_s, description="max seconds a run may wait to start")
    failure_rate_max: float = Field(_DEFAULTS.failure_rate_max, description="max failure share of a team's runs")
    failure_rate_period_s: float = Field(
        _DEFAULTS.failure_rate_period_s, description="seconds of finished runs the failure share is taken over"
    )
    failure_rate_min_runs: int = Field(
        _DEFAULTS.failure_rate_min_runs, description="finished runs a team needs in the period to be judged"
    )
    spend_max_ratio: float = Field(
        _DEFAULTS.spend_max_ratio, description="max spend of a team's last hour, as a multiple of its hourly mean"
    )
    spend_trailing_hours: int = Field(_DEFAULTS.spend_trailing_hours, description="hours the hourly mean is taken over")
    spend_min_history_hours: int = Field(
        _DEFAULTS.spend_min_history_hours, description="hours with spend a team needs before it is judged"
    )
    cost_max_ratio: float = Field(_DEFAULTS.cost_max_ratio, description="max cost as a multiple of the family median")
    cost_min_family_runs: int = Field(
        _DEFAULTS.cost_min_family_runs, description="finished runs a family needs before costs are compared"
    )
    checkpoint_overhead_max: float = Field(
        _DEFAULTS.checkpoint_overhead_max, description="max share of the loop spent checkpointing"
    )
    webhook_url: str | None = Field(
        None, description=f"incoming webhook (Slack format), as dg.EnvVar({WEBHOOK_ENV!r}); unset: log only"
    )
    timeout_s: float = Field(5.0, gt=0, description="seconds to wait for the webhook")

    def thresholds(self) -> AlertThresholds:
        return AlertThresholds(**{name: getattr(self, name) for name in AlertThresholds.model_fields})

    def deliver(self, alerts: Sequence[Alert], log: logging.Logger | dg.DagsterLogManager | None = None) -> list[str]:
        """Log every alert and post it to Slack when configured; returns the delivery problems, if any."""
        log = log or logging.getLogger("training_platform.alerts")
        problems = []
        webhook = self.webhook_url
        for alert in alerts:
            (log.error if alert.severity == "ERROR" else log.warning)(alert.text())
            if not webhook:
                continue
            try:
                post_slack(webhook, alert, self.timeout_s)
            except ValueError:  # urllib names the malformed URL in its message: say which variable instead
                problem = (
                    f"webhook delivery of {alert.key} failed: ${WEBHOOK_ENV} is not a valid URL; set it to the "
                    "https:// incoming-webhook URL"
                )
            except (urllib.error.URLError, OSError) as exc:
                # Never name the URL: it is a secret, and an error may quote it.
                reason = Redactor([webhook]).text(str(getattr(exc, "reason", exc)))
                problem = f"webhook delivery of {alert.key} failed: {reason}; check the webhook"
            else:
                continue
            log.warning(problem)
            problems.append(problem)
        return problems


def post_slack(url: str, alert: Alert, timeout_s: float = 5.0) -> None:
    body = {
        "text": alert.text(),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{alert.rule}* on {_subject(alert)}"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{alert.what}\n*Look at:* {alert.look_at}"}},
        ],
    }
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if response.status >= 300:
            raise OSError(f"webhook answered HTTP {response.status}")


def _subject(alert: Alert) -> str:
    return f"team `{alert.team}`" if alert.period else f"run `{alert.run_id}`"


def webhook_from_environment() -> dg.EnvVar | None:
    """The webhook as an EnvVar when the server's environment sets it (an unset EnvVar would fail every run)."""
    return dg.EnvVar(WEBHOOK_ENV) if os.environ.get(WEBHOOK_ENV) else None
