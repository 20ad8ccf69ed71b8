"""Submission benchmark: a run through the platform server against the in-process path, side by side, in one run.

Prints one ``name: value`` line per figure (targets: issue 31), then the measurements behind them as
``detail_*`` lines. Both sides alternate ``--repeats`` times and the figure is the median.

  submit_to_first_step_ratio      seconds from `tp train` to the run's first training step against a running
                                  platform server / the same through the in-process path the platform had before
                                  (`dg.materialize` of the day's snapshot and of the run inside the `tp` process).
                                  The server side is measured day to day: its home has the day's snapshot, which
                                  it reuses; the in-process path built the snapshot on every `tp train`.
                                  `detail_cold_*`: a fresh home on both sides (the server side builds the snapshot
                                  first too, through its queue and the retraining sensor).
  client_seconds                  wall time of `tp runs` against the running server with 50 training runs in its
                                  instance (median of 5; target <= 1.0): the server side's own runs, plus copies
                                  of the last one's record under other run ids. `detail_client_floor_seconds`:
                                  `tp --help`, what starting the command line alone costs.
  queue_overhead_seconds_per_run  100 short runs (a 0.5 s job each) of one team queued at once on the shipped queue
                                  (2 runs of a team at most) with the real daemon: for each run after the first two,
                                  seconds from the moment a slot of its team freed (the end of the team's run that
                                  let it in) to its STARTED event, median (target <= 0.5). The details split it into
                                  slot to dequeue (RUN_STARTING) and dequeue to STARTED (the run worker's start).

    python benchmarks/submit.py                # about 6 minutes on 2 cores
    python benchmarks/submit.py --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.fixtures.platform import free_port  # noqa: E402
from training_platform.runs.events import RunEvents  # noqa: E402

TP = str(Path(sys.executable).with_name("tp"))
CLIENT_RUNS = 50


def spec_file(directory: Path) -> Path:
    spec = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    spec["training"].update(max_steps=50, eval_every=50)
    path = directory / "bench-submit.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def first_step_at(home: Path, run_id: str) -> float:
    events = RunEvents(home / "runs" / run_id).read()
    return next(e["at"] for e in events if e["kind"] == "first_step")


def server_side(home: Path, env: dict, spec: Path) -> float:
    launched = time.time()
    done = subprocess.run([TP, "train", str(spec), "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"tp train failed:\n{done.stderr[-3000:]}")
    return first_step_at(home, json.loads(lines[-1])["run_id"]) - launched


def in_process_side(home: Path, env: dict, spec: Path) -> float:
    launched = time.time()
    done = subprocess.run([sys.executable, __file__, "--in-process", str(spec)], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process path failed:\n{done.stderr[-3000:]}")
    return first_step_at(home, done.stdout.strip().splitlines()[-1]) - launched


def in_process_pipeline(spec_path: str) -> None:
    """What `tp train` did before the platform server: the snapshot, then the run, materialized in this process."""
    import dagster as dg

    from assets import ALL_ASSETS, ALL_CHECKS
    from assets.datasets import today_partition
    from definitions import defs
    from training_platform.paths import PlatformHome
    from training_platform.policy.preflight import preflight
    from training_platform.runs.specs import register_run
    from training_platform.spec import load_spec
    from training_platform.spec.submission import RUN_ASSETS, snapshot_run_config

    home = PlatformHome.from_env().ensure()
    spec = load_spec(spec_path)
    preflight(spec, home, str(home.checkpoints))
    instance = dg.DagsterInstance.get()

    def materialize(selection, partition, run_config=None):
        result = dg.materialize([*ALL_ASSETS, *ALL_CHECKS], selection=selection, partition_key=partition,
                                instance=instance, resources=defs.resources, run_config=run_config or {},
                                raise_on_error=False)
        if not result.success:
            raise SystemExit(f"{selection} failed")

    materialize(["dataset_snapshot"], today_partition(), snapshot_run_config(spec.dataset.source))
    run_id = register_run(home, spec)
    instance.add_dynamic_partitions("training_runs", [run_id])
    materialize(list(RUN_ASSETS), run_id)
    print(run_id)


def home_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "TP_SERVER_URL")}
    return env | {"TP_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "PYTHONPATH": str(ROOT)} | extra


def submit_to_first_step(work: Path, repeats: int) -> None:
    spec = spec_file(work)
    server_home, inproc_home = work / "server", work / "in-process"
    server_env = home_env(server_home, TP_SERVER_PORT=str(free_port()))
    inproc_env = home_env(inproc_home)
    (inproc_home / "dagster").mkdir(parents=True)
    (inproc_home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    subprocess.run([TP, "server", "start"], env=server_env, check=True, capture_output=True)
    try:
        cold_server = server_side(server_home, server_env, spec)  # builds the day's snapshot first
        cold_inproc = in_process_side(inproc_home, inproc_env, spec)
        pairs = []
        for _ in range(repeats):
            inproc = in_process_side(inproc_home, inproc_env, spec)
            server = server_side(server_home, server_env, spec)
            pairs.append((server, inproc))
        listed, floor = client_seconds(server_home, server_env)
    finally:
        subprocess.run([TP, "server", "stop", "--force"], env=server_env, capture_output=True)
    ratio = statistics.median(s / i for s, i in pairs)
    print(f"submit_to_first_step_ratio: {ratio:.3f} (median of {len(pairs)}; target <= 1.2)")
    print("detail_submit_to_first_step_seconds: " + ", ".join(f"server {s:.1f} / in-process {i:.1f}" for s, i in pairs))
    print(f"detail_cold_submit_to_first_step_seconds: server {cold_server:.1f} / in-process {cold_inproc:.1f} "
          f"(ratio {cold_server / cold_inproc:.3f}; fresh homes, the snapshot built first on both sides)")
    print(f"client_seconds: {statistics.median(listed):.3f} (tp runs, {CLIENT_RUNS} runs, median of {len(listed)}; "
          "target <= 1.0)")
    print("detail_client_seconds: " + ", ".join(f"{t:.3f}" for t in listed))
    print(f"detail_client_floor_seconds: {statistics.median(floor):.3f} (tp --help, median of {len(floor)})")


def client_seconds(home: Path, env: dict, repeats: int = 5) -> tuple[list[float], list[float]]:
    """`tp runs` with CLIENT_RUNS training runs in the server's instance, timed; and `tp --help`, timed."""
    import uuid

    import dagster as dg

    from training_platform.spec.submission import PARTITION_TAG, TRAINING_JOB

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        trained = instance.get_runs(dg.RunsFilter(job_name=TRAINING_JOB))
        last = trained[0]
        for n in range(CLIENT_RUNS - len(trained)):
            partition = f"{last.tags[PARTITION_TAG]}-copy{n}"
            instance.add_run(last._replace(run_id=str(uuid.uuid4()), tags={**last.tags, PARTITION_TAG: partition}))

    def timed(*args: str) -> float:
        started = time.perf_counter()
        done = subprocess.run([TP, *args], env=env, capture_output=True, text=True, cwd=ROOT)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"tp {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        if args[0] == "runs" and len(json.loads(done.stdout.splitlines()[-1])["runs"]) != CLIENT_RUNS:
            raise RuntimeError(f"tp runs listed another number of runs than {CLIENT_RUNS}:\n{done.stdout[-3000:]}")
        return elapsed

    timed("runs", "--json")  # warm: the first query also warms the webserver's caches
    return [timed("runs", "--json") for _ in range(repeats)], [timed("--help") for _ in range(repeats)]


def queue_overhead(work: Path, runs: int = 100, seconds: float = 0.5) -> None:
    from benchmarks.queue_harness import SHIPPED_INSTANCE, run_fairness

    config = yaml.safe_load(SHIPPED_INSTANCE.read_text())["run_coordinator"]["config"]
    team_limit = next(rule["limit"] for rule in config["tag_concurrency_limits"] if rule["key"] == "team")
    result = run_fairness(work / "queue", seconds=seconds, timeout=1200, runs_per_team=runs, teams=("team-a",))
    waits = result.slot_to_start(team_limit)
    to_dequeue, to_started = [w[0] for w in waits], [w[1] for w in waits]
    print(f"queue_overhead_seconds_per_run: {statistics.median(to_started):.3f} "
          f"(median of {len(waits)} runs; target <= 0.5)")
    print(f"detail_queue_slot_to_dequeue_seconds: median {statistics.median(to_dequeue):.3f}, "
          f"p95 {statistics.quantiles(to_dequeue, n=20)[-1]:.3f}")
    print(f"detail_queue_dequeue_to_started_seconds: median "
          f"{statistics.median(b - a for a, b in waits):.3f} (the run worker's process start)")
    print(f"detail_queue_slot_to_started_seconds: p95 {statistics.quantiles(to_started, n=20)[-1]:.3f}, "
          f"max {max(to_started):.3f}; statuses {result.statuses}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queue-only", action="store_true", help="only queue_overhead_seconds_per_run")
    parser.add_argument("--in-process", metavar="SPEC", help=argparse.SUPPRESS)  # one side, in its own process
    args = parser.parse_args()
    if args.in_process:
        in_process_pipeline(args.in_process)
        return
    with tempfile.TemporaryDirectory(prefix="tp-bench-submit-", ignore_cleanup_errors=True) as tmp:
        if not args.queue_only:
            submit_to_first_step(Path(tmp), args.repeats)
        queue_overhead(Path(tmp))


if __name__ == "__main__":
    main()
