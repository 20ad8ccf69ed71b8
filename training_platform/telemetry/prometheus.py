"""A Prometheus endpoint: queue depth, running jobs, utilization and cost, per team.

The collector reads run records at scrape time (no background state to go stale); the caller
passes the function that lists them, e.g. the Dagster instance merged with run telemetry
(`tp metrics`). Metric names are what `deploy/grafana/dashboard.json` queries.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from training_platform.telemetry.records import RunRecord, latest_per_run

METRICS = {
    "tp_queue_depth": "training runs waiting to start",
    "tp_running_jobs": "training runs running now",
    "tp_team_utilization_percent": "mean device utilization of the team's running runs (last sample of each)",
    "tp_run_utilization_percent": "device utilization of a running run (last sample)",
    "tp_run_progress_ratio": "steps done / max steps of a running run",
    "tp_cost_usd": "dollars spent by the team's training runs (finished and so far)",
}


class PlatformCollector(Collector):
    def __init__(self, list_records: Callable[[], list[RunRecord]]):
        self.list_records = list_records

    def collect(self) -> Iterator:
        runs = latest_per_run(self.list_records())
        queued: dict[str, int] = defaultdict(int)
        running: dict[str, int] = defaultdict(int)
        cost: dict[str, float] = defaultdict(float)
        team_util: dict[str, list[float]] = defaultdict(list)
        run_util = GaugeMetricFamily(
            "tp_run_utilization_percent", METRICS["tp_run_utilization_percent"], labels=["team", "run_id", "device"]
        )
        progress = GaugeMetricFamily(
            "tp_run_progress_ratio", METRICS["tp_run_progress_ratio"], labels=["team", "run_id"]
        )
        for run in runs:
            team = run.team or "unknown"
            cost[team] += run.cost_usd or 0.0
            if run.status == "QUEUED":
                queued[team] += 1
            elif run.status == "RUNNING":
                running[team] += 1
                if run.utilization:
                    last = run.utilization[-1][1]
                    team_util[team].append(last)
                    run_util.add_metric([team, run.run_id, run.device], last)
                if run.progress is not None:
                    progress.add_metric([team, run.run_id], run.progress)
        teams = sorted(set(queued) | set(running) | set(cost))
        for name, values in (("tp_queue_depth", queued), ("tp_running_jobs", running)):
            family = GaugeMetricFamily(name, METRICS[name], labels=["team"])
            for team in teams:
                family.add_metric([team], values.get(team, 0))
            yield family
        utilization = GaugeMetricFamily(
            "tp_team_utilization_percent", METRICS["tp_team_utilization_percent"], labels=["team"]
        )
        for team, values in sorted(team_util.items()):
            utilization.add_metric([team], sum(values) / len(values))
        yield utilization
        yield run_util
        yield progress
        spent = CounterMetricFamily("tp_cost_usd", METRICS["tp_cost_usd"], labels=["team"])
        for team in teams:
            spent.add_metric([team], cost[team])
        yield spent


def registry_for(list_records: Callable[[], list[RunRecord]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector(list_records))
    return registry


def serve(
    list_records: Callable[[], list[RunRecord]], port: int = 9108, addr: str = "127.0.0.1"
) -> tuple[object, threading.Thread]:
    """Serve /metrics on addr:port in a daemon thread; returns (server, thread): call server.shutdown() to stop."""
    return start_http_server(port, addr=addr, registry=registry_for(list_records))
