"""Drive the real Dagster daemon with the shipped dagster.yaml and record every run's interval.

Used by benchmarks/sweeps.py (fairness_jain_index) and benchmarks/submit.py (queue_overhead_seconds_per_run).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.queue_location import TEAMS
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

    def queue_overheads(self, team_limit: int, total_limit: int) -> list[float]:
        """Per run, seconds it stayed queued after the slot limits would have let it leave.

        FIFO within a team: a run may leave once it was created, the team's run before it left, and
        a slot of its team and of the whole queue was free (held from dequeue to end by the others).
        """
        overheads = []
        previous: dict[str, float] = {}
        for run in sorted(self.runs, key=lambda r: r.created):
            others = [o for o in self.runs if o is not run]
            eligible = max(run.created, previous.get(run.team, 0.0))
            previous[run.team] = run.dequeued

            def blocked(t: float, run=run, others=others) -> bool:
                holding = [o for o in others if o.dequeued <= t < o.ended]
                return len(holding) >= total_limit or sum(o.team == run.team for o in holding) >= team_limit

            changes = sorted({eligible, *(o.ended for o in others if eligible < o.ended < run.dequeued),
                              *(o.dequeued for o in others if eligible < o.dequeued < run.dequeued)})
            free_since = None
            for t in changes:
                if blocked(t):
                    free_since = None
                elif free_since is None:
                    free_since = t
            overheads.append(max(0.0, run.dequeued - (free_since if free_since is not None else run.dequeued)))
        return overheads


def run_fairness(workdir: Path, seconds: float = 2.0, timeout: float = 420.0, runs_per_team: int = 10) -> FairnessRun:
    """Start the daemon on a fresh instance, pull the trigger, wait for all runs, return their intervals."""
    import dagster as dg

    trigger = workdir / "trigger"
    total = len(TEAMS) * runs_per_team
    env = {"FAIRNESS_TRIGGER": str(trigger), "FAIRNESS_RUNS_PER_TEAM": str(runs_per_team)}
    with running_daemon(workdir, LOCATION, env):
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
