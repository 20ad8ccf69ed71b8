"""Team stack benchmark: the platform on a team's stack against the embedded default, side by side in one run.

The stack is deploy/team/local-stack.sh (PostgreSQL for Dagster, an MLflow tracking server on PostgreSQL with its
artifacts in S3, checkpoints in S3); the embedded default is a platform home on SQLite and local disk. Each side
has its platform server running. Prints one ``name: value`` line per figure (targets: issue 20), then the
measurements behind them as ``detail_*`` lines.

  stack_overhead_ratio        wall time of `tp train examples/digits.yaml` (the example pipeline: training run,
                              checkpoints, evaluation and registration, on the day's snapshot each side built
                              first) on the stack / on the embedded default; the sides alternate --repeats times,
                              median of the pairs' ratios (target <= 1.15).
  queue_to_start_p95_seconds  --submissions `tp train --detach` of a short run (50 steps), all at once, spread over
                              four teams, under the shipped queue (2 runs per team, 6 in all); for each run, seconds
                              from its creation (queued) to its STARTED; the 95th percentile, per side, and
                              `stack_queue_to_start_p95_ratio`, the stack's over the embedded default's.

    python benchmarks/team_stack.py               # about 12 minutes on 2 cores
    python benchmarks/team_stack.py --repeats 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.fixtures.platform import Platform, last_json, running_platform  # noqa: E402
from tests.fixtures.team_stack import running_stack  # noqa: E402
from training_platform.client.graphql import FINISHED  # noqa: E402

EXAMPLE = ROOT / "examples" / "digits.yaml"
TEAMS = ("team-a", "team-b", "team-c", "team-d")


def teams_file(directory: Path) -> Path:
    path = directory / "teams.yaml"
    path.write_text(yaml.safe_dump({"teams": {team: {} for team in ("ml-platform", *TEAMS)}}))
    return path


def short_specs(directory: Path, count: int) -> list[Path]:
    """`count` short runs of the example, named apart (each its own model), round-robin over TEAMS."""
    paths = []
    for n in range(count):
        spec = yaml.safe_load(EXAMPLE.read_text())
        spec["name"] = f"burst-{n}"
        spec["team"] = TEAMS[n % len(TEAMS)]
        spec["training"].update(max_steps=50, eval_every=50)
        path = directory / f"burst-{n}.yaml"
        path.write_text(yaml.safe_dump(spec))
        paths.append(path)
    return paths


def pipeline_seconds(platform: Platform) -> float:
    started = time.perf_counter()
    done = platform.tp("train", str(EXAMPLE), "--json", timeout=1800)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"tp train failed on {platform.home}:\n{done.stderr[-3000:]}")
    return elapsed


def queue_to_start(platform: Platform, specs: list[Path]) -> list[float]:
    """Submit every spec at once; when all finished, each run's seconds from creation to STARTED."""

    def submit(spec: Path) -> str:
        done = platform.tp("train", str(spec), "--detach", "--json", timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"tp train --detach failed on {platform.home}:\n{done.stderr[-3000:]}")
        return last_json(done)["dagster_run_id"]

    with ThreadPoolExecutor(len(specs)) as pool:
        run_ids = list(pool.map(submit, specs))
    client = platform.client()
    deadline = time.monotonic() + 1800
    while True:
        runs = [client.run(run_id) for run_id in run_ids]
        if all(run is not None and run.status in FINISHED for run in runs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs still in progress after 30 minutes: {[r and r.status for r in runs]}")
        time.sleep(1.0)
    failed = [run.id for run in runs if run.status != "SUCCESS"]
    if failed:
        raise RuntimeError(f"runs did not succeed on {platform.home}: {failed}")
    return [run.started - run.created for run in runs]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def alternate(repeats: int, stack: Callable[[], float], embedded: Callable[[], float]) -> list[tuple[float, float]]:
    """(stack, embedded) seconds, `repeats` pairs, the side that goes first swapping each time."""
    pairs = []
    for n in range(repeats):
        if n % 2:
            e, s = embedded(), stack()
        else:
            s, e = stack(), embedded()
        pairs.append((s, e))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--submissions", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tp-bench-stack-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        os.environ["TP_TEAMS"] = str(teams_file(work))  # both servers, and every `tp`, read it
        (work / "stack-specs").mkdir()
        (work / "embedded-specs").mkdir()
        with running_stack() as stack_parts, running_platform(work / "embedded") as embedded:
            stack = stack_parts.platform
            cold = (pipeline_seconds(stack), pipeline_seconds(embedded))  # each builds the day's snapshot first
            pairs = alternate(args.repeats, lambda: pipeline_seconds(stack), lambda: pipeline_seconds(embedded))
            stack_waits = queue_to_start(stack, short_specs(work / "stack-specs", args.submissions))
            embedded_waits = queue_to_start(embedded, short_specs(work / "embedded-specs", args.submissions))
    ratio = statistics.median(s / e for s, e in pairs)
    print(f"stack_overhead_ratio: {ratio:.3f} (median of {len(pairs)}; target <= 1.15)")
    print("detail_pipeline_seconds: " + ", ".join(f"stack {s:.1f} / embedded {e:.1f}" for s, e in pairs))
    print(f"detail_cold_pipeline_seconds: stack {cold[0]:.1f} / embedded {cold[1]:.1f} (the snapshot built first)")
    for side, waits in (("stack", stack_waits), ("embedded", embedded_waits)):
        print(
            f"queue_to_start_p95_seconds_{side}: {p95(waits):.2f} ({len(waits)} submissions at once; median "
            f"{statistics.median(waits):.2f}, max {max(waits):.2f})"
        )
    print(f"stack_queue_to_start_p95_ratio: {p95(stack_waits) / p95(embedded_waits):.3f}")


if __name__ == "__main__":
    main()
