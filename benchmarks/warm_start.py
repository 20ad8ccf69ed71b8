"""Warm starts benchmark: a `tp server`'s runs forked from its shared standby, against cold starts, in one run.

Two platform servers, one after the other, each on a fresh home: one with TP_WARM_STARTS=0 (every run's torchrun
agent and ranks import torch themselves), one as shipped (they are forks of the shared standby,
training_platform/launch/standby.py). Each side trains the example once (the day's snapshot, and on the warm side
the run that starts the standby, which the side then waits to be ready), then --repeats more runs of it, measured.
Prints one ``name: value`` line per figure, then the measurements behind them as ``detail_*`` lines.

  warm_training_run_ratio     the `training_run` step's duration (launch, training, the job's end), warm / cold,
                              medians of the measured runs
  warm_dagster_run_ratio      the whole Dagster run (the four assets and their checks), warm / cold
  detail_*_seconds            each figure per side; submit_to_started: from the job's submission to its main
                              rank's `started` event

    python benchmarks/warm_start.py               # about 4 minutes on 2 cores
    python benchmarks/warm_start.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.fixtures.platform import Platform, last_json, running_platform  # noqa: E402
from tests.fixtures.worker import wait_until  # noqa: E402
from training_platform.launch import standby  # noqa: E402
from training_platform.runs.events import RunEvents  # noqa: E402

EXAMPLE = ROOT / "examples" / "digits.yaml"


def train(platform: Platform, directory: Path, name: str) -> str:
    spec = yaml.safe_load(EXAMPLE.read_text()) | {"name": name}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = platform.tp("train", str(path), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc)["dagster_run_id"]


def measure(platform: Platform, dagster_run_id: str) -> dict[str, float]:
    with platform.instance() as instance:
        record = instance.get_run_record_by_id(dagster_run_id)
        started: dict[str, float] = {}
        figures = {"dagster_run": record.end_time - record.start_time}
        for entry in instance.all_logs(dagster_run_id):
            event = entry.dagster_event
            if event is None or event.step_key != "training_run":
                continue
            if event.event_type_value == "STEP_START":
                started["step"] = entry.timestamp
            elif event.event_type_value == "STEP_SUCCESS":
                figures["training_run"] = entry.timestamp - started["step"]
    run_id = record.dagster_run.tags["dagster/partition"]
    events = RunEvents(platform.home / "runs" / run_id).read()
    first = {kind: next(e["at"] for e in events if e["kind"] == kind) for kind in ("submitted", "started")}
    figures["submit_to_started"] = first["started"] - first["submitted"]
    return figures


def side(directory: Path, warm: bool, repeats: int) -> list[dict[str, float]]:
    home = directory / ("warm" if warm else "cold")
    with running_platform(home, **({} if warm else {"TP_WARM_STARTS": "0"})) as platform:
        train(platform, directory, f"{home.name}-first")
        log = home / standby.SHARED_LOG_FILE
        if warm:
            wait_until(lambda: log.is_file() and "ready in" in log.read_text(), 300, "the shared standby ready")
        else:
            assert not log.exists(), "TP_WARM_STARTS=0 started a shared standby"
        return [measure(platform, train(platform, directory, f"{home.name}-{n}")) for n in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cold = side(Path(tmp), warm=False, repeats=args.repeats)
        warm = side(Path(tmp), warm=True, repeats=args.repeats)

    def median(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    for key in ("training_run", "dagster_run"):
        print(f"warm_{key}_ratio: {median(warm, key) / median(cold, key):.3f}")
    for key in ("training_run", "dagster_run", "submit_to_started"):
        values = {name: [round(run[key], 2) for run in runs] for name, runs in (("cold", cold), ("warm", warm))}
        print(f"detail_{key}_seconds: cold median {median(cold, key):.2f} {values['cold']}, "
              f"warm median {median(warm, key):.2f} {values['warm']}")


if __name__ == "__main__":
    main()
