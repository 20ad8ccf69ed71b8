"""Drive the real Dagster daemon with the shipped dagster.yaml and record every run's interval.

Used by the fairness integration test and by benchmarks/sweeps.py (fairness_jain_index).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.dagster_daemon import SHIPPED_INSTANCE, daemon_log_tail, running_daemon

__all__ = ["SHIPPED_INSTANCE", "run_fairness"]

LOCATION = Path(__file__).with_name("fairness_location.py")


@dataclass
class FairnessRun:
    intervals: dict[str, list[tuple[float, float]]]  # team -> (start, end) of each run
    sampled_in_progress: list[dict[str, int]] = field(default_factory=list)  # team -> runs in progress, per poll
    statuses: dict[str, int] = field(default_factory=dict)

    def max_overlap(self, team: str) -> int:
        events = sorted([(s, 1) for s, _ in self.intervals[team]] + [(e, -1) for _, e in self.intervals[team]])
        level = peak = 0
        for _, delta in events:  # ends sort before starts at the same instant (-1 < 1)
            level += delta
            peak = max(peak, level)
        return peak

    def jain_index(self) -> float:
        """Jain's index of per-team throughput (runs finished per second) while every team had work queued."""
        start = max(min(s for s, _ in runs) for runs in self.intervals.values())
        end = min(max(e for _, e in runs) for runs in self.intervals.values())
        rates = [sum(1 for _, e in runs if start <= e <= end) / (end - start) for runs in self.intervals.values()]
        return sum(rates) ** 2 / (len(rates) * sum(r * r for r in rates))


def run_fairness(workdir: Path, seconds: float = 2.0, timeout: float = 420.0) -> FairnessRun:
    """Start the daemon on a fresh instance, pull the trigger, wait for all runs, return their intervals."""
    import dagster as dg

    trigger = workdir / "trigger"
    with running_daemon(workdir, LOCATION, {"FAIRNESS_TRIGGER": str(trigger)}):
        trigger.write_text(str(seconds))
        result = FairnessRun(intervals=defaultdict(list))
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
                if len(records) == 30 and len(finished) == 30:
                    break
                time.sleep(0.3)
            else:
                tail = daemon_log_tail(workdir)
                raise TimeoutError(f"runs did not all finish in {timeout} s; daemon log tail:\n{tail}")
            for r in records:
                result.statuses[r.dagster_run.status.value] = result.statuses.get(r.dagster_run.status.value, 0) + 1
                result.intervals[r.dagster_run.tags["team"]].append((r.start_time, r.end_time))
        result.intervals = dict(result.intervals)
        return result
