"""`tp status` rows: running runs with progress, utilization and cost; queued runs with an estimated wait."""

from training_platform.cli.telemetry import human_seconds
from training_platform.telemetry.records import RunRecord
from training_platform.telemetry.status import median_duration, status_rows

NOW = 10_000.0
HISTORY = [
    RunRecord(f"done-{i}", team="vision", status="SUCCEEDED", started_at=0.0, ended_at=600.0 + 60 * i) for i in range(3)
]  # median duration: 660 s


def test_running_and_queued_runs_with_estimates():
    running = RunRecord(
        "r1",
        team="vision",
        status="RUNNING",
        queued_at=NOW - 400,
        started_at=NOW - 300,
        step=50,
        max_steps=100,
        utilization=((NOW - 1, 87.0),),
        cost_usd=0.25,
    )
    first = RunRecord("q1", team="nlp", status="QUEUED", queued_at=NOW - 120)
    second = RunRecord("q2", team="vision", status="QUEUED", queued_at=NOW - 60)
    rows = status_rows([*HISTORY, second, first, running], NOW)
    assert [r.run_id for r in rows] == ["r1", "q1", "q2"]
    r1, q1, q2 = rows
    assert (r1.progress, r1.utilization_pct, r1.cost_usd, r1.waited_s) == (0.5, 87.0, 0.25, 100.0)
    # r1 is half done after 300 s: 300 s left. One slot busy: q1 starts then, q2 one typical run later.
    assert q1.estimated_wait_s == 300.0 and q2.estimated_wait_s == 300.0 + 660.0
    assert q1.waited_s == 120.0


def test_team_filter_and_unknown_estimates():
    queued = RunRecord("q", team="nlp", status="QUEUED", queued_at=NOW - 5)
    rows = status_rows([queued], NOW)
    assert rows[0].estimated_wait_s is None  # no finished run yet: no honest estimate
    assert status_rows([queued], NOW, team="vision") == []
    assert median_duration(HISTORY) == 660.0


def test_finished_runs_are_not_listed():
    assert status_rows(HISTORY, NOW) == []


def test_human_seconds():
    assert [human_seconds(s) for s in (None, 30, 600, 7200)] == ["-", "30 s", "10 min", "2.0 h"]
