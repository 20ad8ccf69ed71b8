"""Drive the real Dagster daemon with the shipped dagster.yaml and record every run's interval.

Used by benchmarks/sweeps.py (fairness_jain_index) and benchmarks/submit.py (queue_overhead_seconds_per_run).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.queue_location import DEFAULT_TEAMS
from tests.fixtures.dagster_daemon import SHIPPED_INSTANCE, daemon_log_tail, running_daemon

__all__ = ["SHIPPED_INSTANCE", "run_fairness"]

LOCATION = Path(__file__).with_name("queue_location.py")


@dataclass(frozen=True)
class QueuedRun:
    team: str
    created: float
    dequeued: float  # left the queue (RUN_STARTING): from then on it holds a slot
    started: float
    ended: float


@dataclass
class FairnessRun:
    runs: list[QueuedRun]
    sampled_in_progress: list[dict[str, int]] = field(default_factory=list)  # team -> runs in progress, per poll
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def intervals(self) -> dict[str, list[tuple[float, float]]]:
        """team -> (start, end) of each of its runs."""
        out: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for run in self.runs:
            out[run.team].append((run.started, run.ended))
        return dict(out)

    def jain_index(self) -> float:
        """Jain's index of per-team throughput (runs finished per second) while every team had work queued."""
        intervals = self.intervals.values()
        start = max(min(s for s, _ in runs) for runs in intervals)
        end = min(max(e for _, e in runs) for runs in intervals)
        rates = [sum(1 for _, e in runs if start <= e <= end) / (end - start) for runs in intervals]
        return sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates))

    def slot_to_start(self, team_limit: int) -> list[tuple[float, float]]:
        """For one team's runs, each after its first `team_limit`: (seconds from the moment a slot of the team
        freed, i.e. the team's run whose end let it in ended, to its dequeue; and to its STARTED event).

        All runs are queued at once, so the i-th run to leave the queue (FIFO, 0-based) took the slot freed by
        the (i - limit)-th end among the runs that left before it.
        """
        assert len({run.team for run in self.runs}) == 1, "one team's runs"
        ordered = sorted(self.runs, key=lambda r: r.dequeued)
        waits = []
        for i, run in enumerate(ordered[team_limit:], start=team_limit):
            freed = sorted(r.ended for r in ordered[:i])[i - team_limit]
            freed = max(freed, run.created)
            waits.append((run.dequeued - freed, run.started - freed))
        return waits


def run_fairness(
    workdir: Path, seconds: float = 2.0, timeout: float = 420.0, runs_per_team: int = 10,
    teams: tuple[str, ...] = DEFAULT_TEAMS,
) -> FairnessRun:
    """Start the daemon on a fresh instance, pull the trigger, wait for all runs, return their intervals."""
    import dagster as dg

    trigger = workdir / "trigger"
    total = len(teams) * runs_per_team
    env = {"FAIRNESS_TRIGGER": str(trigger), "FAIRNESS_RUNS_PER_TEAM": str(runs_per_team),
           "FAIRNESS_TEAMS": ",".join(teams)}
    # The platform's code server, as `tp server` runs it: the overhead measured is the platform's.
    with running_daemon(workdir, LOCATION, env, platform_code_server=True):
        trigger.write_text(str(seconds))
        result = FairnessRun(runs=[])
        deadline = time.monotonic() + timeout
        with dg.DagsterInstance.get() as instance:
            while time.monotonic() < deadline:
                records = instance.get_run_records(dg.RunsFilter(tags={"fairness": "1"}))
                counts: dict[str, int] = defaultdict(int)
                for r in records:
                    if r.dagster_run.status in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED):
                        counts[r.dagster_run.tags["team"]] += 1
                result.sampled_in_progress.append(dict(counts))
                finished = [r for r in records if r.dagster_run.is_finished]
                if len(records) == total and len(finished) == total:
                    break
                time.sleep(0.3)
            else:
                tail = daemon_log_tail(workdir)
                raise TimeoutError(f"runs did not all finish in {timeout} s; daemon log tail:\n{tail}")
            for r in records:
                result.statuses[r.dagster_run.status.value] = result.statuses.get(r.dagster_run.status.value, 0) + 1
                starting = instance.get_records_for_run(r.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_STARTING)
                dequeued = starting.records[0].event_log_entry.timestamp
                team = r.dagster_run.tags["team"]
                result.runs.append(QueuedRun(team, r.create_timestamp.timestamp(), dequeued, r.start_time, r.end_time))
        return result
