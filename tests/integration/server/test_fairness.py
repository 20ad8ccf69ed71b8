"""Three teams share one platform server: the shipped queue's per-team limit and fairness, with real training.

Each team submits three runs (1 process, 100 steps), all at once and team after team (team-a's three first: the
order in which a plain FIFO queue would let team-a take more than its limit), against one server with
deploy/dagster/dagster.yaml (at most 2 runs in progress per team, 6 in all): the test worker's shared server
(tests/fixtures/platform.py), whose other modules' runs have ended when this one starts; only the three teams' runs
are counted. Each run trains a user's script whose steps take wall time, not CPU (tests/fixtures/paced_train.py, 20
ms a step): what the queue shares is slots over time, and a run that holds its slot for its steps leaves the two
cores to the server under test. A script's run has no evaluation or registry step (the pipeline's tests have those).
"""

from __future__ import annotations

import time
from collections import defaultdict

import dagster as dg
import pytest
import yaml

from tests.fixtures.platform import server_logs
from tests.integration.server.runs import PACED_SCRIPT, write_spec
from training_platform.client.runs import submit_training
from training_platform.datasets import build_snapshot
from training_platform.runs.specs import new_run_id
from training_platform.server.local import SHIPPED_INSTANCE
from training_platform.spec import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]
TEAMS = ("team-a", "team-b", "team-c")
RUNS_PER_TEAM = 3  # one more than a team's limit: each team has a run waiting while two of its own run
IN_PROGRESS = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
THE_TEAMS_RUNS = dg.RunsFilter(job_name="training_pipeline", tags={"team": list(TEAMS)})


def team_limit() -> int:
    config = yaml.safe_load(SHIPPED_INSTANCE.read_text())["run_coordinator"]["config"]
    return next(rule["limit"] for rule in config["tag_concurrency_limits"] if rule["key"] == "team")


def test_three_teams_of_real_runs_share_the_queue_fairly(platform, tmp_path):
    snapshot = build_snapshot("sklearn_digits", platform.home / "snapshots").snapshot_id
    specs = {
        team: load_spec(write_spec(tmp_path, f"fair-{team}", team=team, dataset={"snapshot_id": snapshot},
                                   training={"max_steps": 100, "log_every": 50}, resources={"procs_per_node": 1},
                                   checkpoint={"every_steps": 50, "keep_last": 1},
                                   entrypoint={"script": str(PACED_SCRIPT), "args": ["--step-seconds", "0.02"]}))
        for team in TEAMS
    }
    limit = team_limit()
    client = platform.client()
    for team in TEAMS:
        for _ in range(RUNS_PER_TEAM):
            submit_training(client, specs[team], new_run_id(specs[team]))
    samples = _sample_until_done(platform, len(TEAMS) * RUNS_PER_TEAM)
    with platform.instance() as instance:
        records = instance.get_run_records(THE_TEAMS_RUNS)
        statuses = [r.dagster_run.status.value for r in records]
        assert statuses == ["SUCCESS"] * len(TEAMS) * RUNS_PER_TEAM, server_logs(platform.home)
        intervals = defaultdict(list)
        for r in records:
            intervals[r.dagster_run.tags["team"]].append((r.start_time, r.end_time))

    for team in TEAMS:
        assert len(intervals[team]) == RUNS_PER_TEAM
        assert _max_overlap(intervals[team]) <= limit, team  # from the runs' own start and end times
    # Sampled while the queue drained: never above the limit, and every team reached it.
    assert all(running.get(team, 0) <= limit for _, running, _ in samples for team in TEAMS)
    assert {team: max(running.get(team, 0) for _, running, _ in samples) for team in TEAMS} == dict.fromkeys(
        TEAMS, limit
    )
    # Jain's index of the teams' shares of running slots, averaged over the time all three had work waiting or running.
    contended = [running for _, running, pending in samples if all(pending.get(team, 0) for team in TEAMS)]
    assert len(contended) >= 10, samples
    shares = [sum(s.get(team, 0) for s in contended) / len(contended) for team in TEAMS]
    jain = sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares))
    print(f"fairness: shares of running slots {dict(zip(TEAMS, shares, strict=True))}, Jain's index {jain:.3f}")
    assert jain >= 0.9, shares


def _sample_until_done(platform, total: int, timeout: float = 1000) -> list[tuple[float, dict, dict]]:
    """(time, team -> runs in progress, team -> runs not finished) about every 0.3 s until every run ended."""
    samples = []
    deadline = time.monotonic() + timeout
    with platform.instance() as instance:
        while time.monotonic() < deadline:
            runs = instance.get_runs(THE_TEAMS_RUNS)
            running, pending = defaultdict(int), defaultdict(int)
            for run in runs:
                pending[run.tags["team"]] += not run.is_finished
                running[run.tags["team"]] += run.status in IN_PROGRESS
            samples.append((time.monotonic(), dict(running), dict(pending)))
            if len(runs) == total and not any(pending.values()):
                return samples
            time.sleep(0.3)
    pytest.fail(f"the runs did not all finish in {timeout:.0f} s:\n{server_logs(platform.home)}")


def _max_overlap(runs: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])
    level = peak = 0
    for _, delta in events:  # ends sort before starts at the same instant (-1 < 1)
        level += delta
        peak = max(peak, level)
    return peak
