"""Fairness with the real Dagster daemon and the shipped queued run coordinator config.

Three teams each submit 10 short runs at once (team-a's first). The per-team limit must hold at
every moment, and no team may wait for all of another team's runs to finish.
"""

import pytest
import yaml

from tests.integration.sweeps.fairness_harness import SHIPPED_INSTANCE, run_fairness

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def team_limit() -> int:
    config = yaml.safe_load(SHIPPED_INSTANCE.read_text())["run_coordinator"]["config"]
    return next(rule["limit"] for rule in config["tag_concurrency_limits"] if rule["key"] == "team")


def test_three_teams_share_the_queue_fairly(tmp_path):
    limit = team_limit()
    result = run_fairness(tmp_path, seconds=1.0)
    assert result.statuses == {"SUCCESS": 30}
    assert sorted(result.intervals) == ["team-a", "team-b", "team-c"]
    for team, runs in result.intervals.items():
        assert len(runs) == 10
        # From the run records (start to end of each run): never more than the limit at once.
        assert result.max_overlap(team) <= limit, team
    # Sampled while the queue drained (STARTING or STARTED): never above the limit, and every team
    # reached it, so the limit is what held a team back, not a lack of submitted work.
    samples = result.sampled_in_progress
    assert samples and all(n <= limit for s in samples for n in s.values())
    assert {team: max(s.get(team, 0) for s in samples) for team in result.intervals} == dict.fromkeys(
        result.intervals, limit
    )
    # No team waits for all of another's runs: each team's first run starts before every other team's last ends.
    first_start = {t: min(s for s, _ in runs) for t, runs in result.intervals.items()}
    last_end = {t: max(e for _, e in runs) for t, runs in result.intervals.items()}
    for team in result.intervals:
        for other in result.intervals:
            if other != team:
                assert first_start[team] < last_end[other], (team, other)
    assert result.jain_index() >= 0.8
