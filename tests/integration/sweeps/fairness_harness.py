"""Drive the real Dagster daemon with the shipped dagster.yaml and record every run's interval.

Used by the fairness integration test and by benchmarks/sweeps.py (fairness_jain_index).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHIPPED_INSTANCE = ROOT / "deploy" / "dagster" / "dagster.yaml"
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

    home = workdir / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED_INSTANCE, home / "dagster.yaml")
    (workdir / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {ROOT}\n"
    )
    trigger = workdir / "trigger"
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    # Create the instance's storage before the daemon starts: two processes creating it at once race.
    dg.DagsterInstance.get().dispose()
    env = {**os.environ, "DAGSTER_HOME": str(home), "FAIRNESS_TRIGGER": str(trigger)}
    daemon = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", str(workdir / "workspace.yaml")],
        cwd=workdir, env=env, stdout=open(workdir / "daemon.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )
    try:
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
                log = (workdir / "daemon.log").read_text(errors="replace")[-3000:]
                raise TimeoutError(f"runs did not all finish in {timeout} s; daemon log tail:\n{log}")
            for r in records:
                result.statuses[r.dagster_run.status.value] = result.statuses.get(r.dagster_run.status.value, 0) + 1
                result.intervals[r.dagster_run.tags["team"]].append((r.start_time, r.end_time))
        result.intervals = dict(result.intervals)
        return result
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
