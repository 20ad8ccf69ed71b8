"""The Prometheus endpoint serves queue depth, running jobs, utilization and cost per team over real HTTP."""

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from training_platform.telemetry.prometheus import METRICS, serve
from training_platform.telemetry.records import RunRecord

ROOT = Path(__file__).resolve().parents[3]

RECORDS = [
    RunRecord("v1", team="vision", status="QUEUED"),
    RunRecord("v2", team="vision", status="QUEUED"),
    RunRecord(
        "v3",
        team="vision",
        status="RUNNING",
        utilization=((1.0, 40.0), (2.0, 80.0)),
        step=50,
        max_steps=200,
        cost_usd=0.5,
        device="gpu",
    ),
    RunRecord("n1", team="nlp", status="RUNNING", utilization=((1.0, 60.0),), cost_usd=1.0),
    RunRecord("n0", team="nlp", status="SUCCEEDED", cost_usd=2.0),
    RunRecord("n0", team="nlp", status="FAILED", cost_usd=9.0),  # an older attempt of n0: not counted twice
]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_endpoint_serves_the_platform_metrics():
    calls = []

    def records():
        calls.append(1)
        return RECORDS

    server, thread = serve(records, port=0)
    try:
        metrics = scrape(server.server_port)
    finally:
        server.shutdown()
    assert calls, "records are read at scrape time"
    assert metrics[("tp_queue_depth", (("team", "vision"),))] == 2
    assert metrics[("tp_queue_depth", (("team", "nlp"),))] == 0
    assert metrics[("tp_running_jobs", (("team", "vision"),))] == 1
    assert metrics[("tp_running_jobs", (("team", "nlp"),))] == 1
    assert metrics[("tp_team_utilization_percent", (("team", "vision"),))] == 80.0
    assert metrics[("tp_run_utilization_percent", (("device", "gpu"), ("run_id", "v3"), ("team", "vision")))] == 80.0
    assert metrics[("tp_run_progress_ratio", (("run_id", "v3"), ("team", "vision")))] == 0.25
    assert metrics[("tp_cost_usd_total", (("team", "nlp"),))] == 3.0
    assert metrics[("tp_cost_usd_total", (("team", "vision"),))] == 0.5


def test_grafana_dashboard_queries_only_metrics_we_export():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 5
    used = {name for expr in exprs for name in re.findall(r"\btp_[a-z_]+", expr)}
    exported = set(METRICS) | {"tp_cost_usd_total"}
    assert used <= exported, used - exported
    assert {"tp_queue_depth", "tp_running_jobs", "tp_team_utilization_percent", "tp_cost_usd_total"} <= used
    assert any(v.get("name") == "team" for v in dashboard["templating"]["list"])
