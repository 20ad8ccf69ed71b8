"""`tp`: the platform's command line, a client of the platform server (Dagster's GraphQL API).

`tp train`, `tp sweep`, `tp retrain`, `tp reproduce` and `tp resume` validate locally (a bad spec or an
exhausted budget exits 2 with nothing submitted), submit to the server's queue and follow the run
until it ends; nothing trains in this process, and Ctrl-C only stops following. The server of the
platform home is started in the background when it is not running (`tp server`).

Every command that takes `--json` ends its output with one JSON object on the last line.
Errors a user can act on print one line and exit non-zero (2 for bad input), without a traceback.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from training_platform.cli import checkpoints as checkpoints_cli
from training_platform.cli import lifecycle as lifecycle_commands
from training_platform.cli import runs as runs_cli
from training_platform.cli.auth import admin_app, login, token
from training_platform.cli.common import JsonFlag, client, console, emit, fail, follow_run, home, say
from training_platform.cli.cost import cost_app
from training_platform.cli.server import server_app
from training_platform.cli.snapshots import snapshots_app
from training_platform.cli.terminal import readable_duration, readable_usd
from training_platform.client import SERVER_URL_ENV, PlatformClient
from training_platform.client.retrain import follow_retrain, launch_retrain
from training_platform.client.runs import submit_snapshot, submit_training, summary, wait_for
from training_platform.client.sweeps import follow_sweep, submit_sweep
from training_platform.cost import check_budget, check_run_budget, estimate_run
from training_platform.cost.budgets import sweep_estimate_usd
from training_platform.cost.run_windows import RunWindowQueue, run_window, waits_for_window
from training_platform.cost.windows import CostWindow
from training_platform.errors import PlatformError, SpecError
from training_platform.launch import RunRequest
from training_platform.launch.registry import launcher_for
from training_platform.paths import PlatformHome
from training_platform.policy.preflight import check_own_files, preflight
from training_platform.policy.rights import check_may_run
from training_platform.policy.team_policy import resolve_team
from training_platform.redaction import redact
from training_platform.runs.retraining import days_between
from training_platform.runs.specs import new_run_id, spec_tags
from training_platform.shipped import DAILY_SPEC, DEMO_SPEC
from training_platform.spec import BACKENDS, TrainSpec, load_spec, parse_spec
from training_platform.sweeps import load_sweep

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train, track and reproduce models.")
app.add_typer(admin_app, name="admin")
app.add_typer(cost_app, name="cost")
app.add_typer(server_app, name="server")
app.add_typer(snapshots_app, name="snapshots")
for command in (runs_cli.runs, runs_cli.logs, runs_cli.cancel, runs_cli.resume, runs_cli.reproduce):
    app.command()(command)
app.command("gc")(lifecycle_commands.gc)
app.command("checkpoints")(checkpoints_cli.checkpoints)


def keep_stop_signals_deliverable() -> None:
    """Undo SIGINT/SIGTERM being ignored, as a script's background job starts with SIGINT ignored.

    Every process `tp` starts inherits an ignored signal: the platform server's processes would then
    outlive `tp server stop`. (Dagster's in-process execution, as tests use it, also installs its
    SIGINT handler on SIGTERM, turning an ignored SIGINT into an ignored SIGTERM.)
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@app.callback()
def _startup() -> None:
    keep_stop_signals_deliverable()


def _validated(spec: TrainSpec, platform_home: PlatformHome, launcher: str | None) -> TrainSpec:
    if launcher is not None:
        if launcher not in BACKENDS:
            raise SpecError(f"--launcher: unknown backend {launcher!r}; use one of: {', '.join(BACKENDS)}")
        spec = parse_spec({**spec.model_dump(mode="json"), "backend": launcher}, source="--launcher")
    store_uri = spec.checkpoint.store_uri or str(platform_home.checkpoints)
    spec = preflight(spec, platform_home, store_uri)
    check_own_files(spec)
    backend = launcher_for(spec.backend)
    backend.check(backend.plan(RunRequest(spec=spec, run_id="preflight", run_dir=platform_home.runs / ".preflight")))
    return spec


# ----- training runs -------------------------------------------------------------------------
def run_training(
    spec: TrainSpec, platform_home: PlatformHome, detach: bool, as_json: bool, now: bool = False
) -> dict[str, Any]:
    """Check the budget, submit the run to the server's queue (or to its cost window), follow it to its end
    (unless detached)."""
    check_run_budget(spec, platform_home.root)  # refused before anything is queued (the asset checks again)
    platform = client(platform_home)
    _check_rights(platform, spec, platform_home)
    window = run_window(spec)
    if not now and waits_for_window(window, datetime.now(UTC)):
        return wait_for_window(platform, platform_home, spec, window)
    submission = submit_training(platform, spec, new_run_id(spec))
    run_id = submission.run_id
    first = "its snapshot" if submission.snapshot_first else "it"
    say(f"run {run_id} queued ({first} first) on {platform.url}, team {spec.team}")
    if detach:
        say(f"  follow it: tp logs {run_id} -f   list runs: tp runs   cancel it: tp cancel {run_id}")
        return {"run_id": run_id, "status": "QUEUED", "dagster_run_id": submission.dagster_run_id}
    final = follow_run(platform, run_id, submission.dagster_run_id, as_json, spec.preemption.retry_failures)
    return summary(platform, run_id, final) | {"server_url": platform.url}


def _check_rights(platform: PlatformClient, spec: TrainSpec, platform_home: PlatformHome) -> None:
    """Refused here, in one line, what the server would refuse (training_platform_dagster/run_coordinator.py):
    nothing is created for it."""
    check_may_run(platform.whoami(), spec, platform_home.root)


def wait_for_window(platform, platform_home: PlatformHome, spec: TrainSpec, window: CostWindow) -> dict[str, Any]:
    run_id = new_run_id(spec)
    platform.add_partition(run_id)
    RunWindowQueue(platform_home.root).enqueue(run_id, spec, spec_tags(spec), window)
    say(
        f"run {run_id} waits for its cost window from {window.start:%Y-%m-%d %H:%M} UTC (cost.deadline "
        f"{spec.cost.deadline:%Y-%m-%d %H:%M}; saves ${window.saving:.2f} of ${window.cost_if_now:.2f} against now); "
        "the hourly run_window_schedule submits it. `tp train --now` starts it at once"
    )
    return {"run_id": run_id, "status": "QUEUED", "window": window.as_dict()}


def _finish(result: dict[str, Any], as_json: bool, hidden: tuple[str, ...] = ("checkpoints",)) -> None:
    emit(result, as_json, hidden)
    if result["status"] not in ("SUCCEEDED", "PRUNED", "QUEUED"):
        if not as_json:
            console.print(f"[red]error:[/red] {result.get('error')}", highlight=False)
        raise typer.Exit(1)


@app.command()
def train(
    spec_path: Annotated[Path, typer.Argument(help="YAML spec of the run (see examples/)")],
    launcher: Annotated[str | None, typer.Option("--launcher", help="local, slurm or k8s (overrides the spec)")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="print the run id and return; the run goes on")] = False,
    now: Annotated[bool, typer.Option("--now", help="start now though cost.deadline leaves a cheaper window")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit a training run to the platform's queue and follow it (Ctrl-C detaches; the run goes on).
    A spec with cost.deadline waits for its cheapest window before the deadline, unless --now."""
    try:
        platform_home = home()
        spec = _validated(load_spec(spec_path), platform_home, launcher)
        result = run_training(spec, platform_home, detach, as_json, now)
    except PlatformError as exc:
        fail(exc, as_json)
    _finish(result, as_json)


@app.command()
def demo(as_json: JsonFlag = False) -> None:
    """The whole pipeline on the embedded default: snapshot, train (2 processes), evaluate, register."""
    started = time.monotonic()
    try:
        platform_home = home()
        spec = load_spec(DEMO_SPEC)
        spec = parse_spec({**spec.model_dump(mode="json"), "owner": getpass.getuser()}, source=str(DEMO_SPEC))
        result = run_training(_validated(spec, platform_home, None), platform_home, False, as_json)
    except PlatformError as exc:
        fail(exc, as_json)
    result["demo_seconds"] = round(time.monotonic() - started, 1)
    if not as_json:
        experiment = f"{spec.team}/{spec.name}"
        say(
            "\n[bold]Where to look[/bold]\n"
            f"  Dagster UI    {result.get('server_url')} (Assets -> Global asset lineage; Runs)\n"
            "  MLflow UI     make ui (http://127.0.0.1:5000)\n"
            f"  MLflow run    {result.get('mlflow_run_id')} in experiment {experiment}\n"
            f"  Model         {result.get('model_name')} v{result.get('model_version')}\n"
            f"  Data          {platform_home.root}"
        )
    _finish(result, as_json)


# ----- sweeps --------------------------------------------------------------------------------
@app.command()
def sweep(
    sweep_path: Annotated[Path, typer.Argument(help="YAML sweep (see examples/*sweep*.yaml)")],
    now: Annotated[bool, typer.Option("--now", help="start now even when a deadline leaves a cheaper window")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="print the sweep's name and return; it goes on")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit a sweep (its trials are queued training runs), or queue it for its cost window, and follow it."""
    try:
        platform_home = home()
        spec = load_sweep(sweep_path)
        _validated(spec.base_spec, platform_home, None)
        check_budget(platform_home.root, spec.team, sweep_estimate_usd(spec, platform_home.root))  # nothing queued
        platform = client(platform_home)
        _check_rights(platform, spec.base_spec, platform_home)
        _await_snapshot(platform, spec.base_spec)
        dagster_run_id = submit_sweep(platform, spec, now)
        say(f"sweep {spec.name} submitted on {platform.url}, team {spec.team}")
        if detach:
            emit({"sweep": spec.name, "status": "SUBMITTED", "dagster_run_id": dagster_run_id}, as_json)
            return
        result = _follow_sweep(platform, spec.name, dagster_run_id)
    except PlatformError as exc:
        fail(exc, as_json)
    _finish(result, as_json, hidden=("trial_table", "best_spec"))


def _await_snapshot(platform, spec: TrainSpec) -> None:
    """Build the day's snapshot of the sweep's source first when there is none (every trial pins one)."""
    snapshot = submit_snapshot(platform, spec, tags=spec_tags(spec))
    if snapshot is None:
        return
    say(f"building the day's snapshot of {spec.dataset.source} first")
    run = wait_for(platform, snapshot)
    if run.status != "SUCCESS":
        raise PlatformError(f"the snapshot of {spec.dataset.source} failed: {platform.failure(snapshot).message}")


def _follow_sweep(platform, name: str, dagster_run_id: str) -> dict[str, Any]:
    shown = ""
    try:
        for progress in follow_sweep(platform, name, dagster_run_id):
            counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(progress.trials.items()))
            line = f"sweep {name}: {progress.state}" + (f"  trials: {counts}" if counts else "")
            if line != shown:
                say(line)
                shown = line
    except KeyboardInterrupt:
        say(f"detached: sweep {name} goes on in the platform server; `tp runs` lists its trials")
        raise typer.Exit(0) from None
    if progress.state == "FAILED":
        return {"sweep": name, "status": "FAILED", "error": progress.error, "dagster_run_id": dagster_run_id}
    if progress.state == "QUEUED":
        started = progress.summary or {}
        return {"sweep": name, "status": "QUEUED", "window_start": started.get("window_start"),
                "release": "the hourly sweep_window_schedule starts it in its window", "dagster_run_id": dagster_run_id}
    return (progress.summary or {}) | {"dagster_run_id": dagster_run_id}


# ----- retraining ----------------------------------------------------------------------------
@app.command()
def retrain(
    first: Annotated[str, typer.Option("--from", help="first day to rebuild (YYYY-MM-DD)")],
    last: Annotated[str, typer.Option("--to", help="last day to rebuild (YYYY-MM-DD), included")],
    spec_path: Annotated[Path, typer.Option("--spec", help="spec retrained each day")] = DAILY_SPEC,
    as_json: JsonFlag = False,
) -> None:
    """Backfill days: each day's dataset snapshot, then its run `<spec name>-<day>`; promotion only by the gate."""
    try:
        platform_home = home()
        days = days_between(_day_option(first, "--from"), _day_option(last, "--to"))
        if not days:
            raise SpecError(f"--to {last} is before --from {first}; give the first day, then the last")
        spec = _validated(load_spec(spec_path), platform_home, None)
        each = estimate_run(spec, platform_home.root)
        check_budget(platform_home.root, spec.team, each.usd * len(days), basis=f"{len(days)} day(s) x {each.basis}")
        _seed_empty_landing(spec, platform_home, days)
        platform = client(platform_home)
        _check_rights(platform, spec, platform_home)
        retraining = launch_retrain(platform, spec, days)
        if retraining.backfill_id:
            todo = len(days) - len(retraining.trained_before)
            say(f"backfill {retraining.backfill_id}: {todo} day(s) on {platform.url}")
        results = []
        for line in follow_retrain(platform, spec, retraining):
            results.append(line)
            say(_day_line(line))
    except PlatformError as exc:
        fail(exc, as_json)
    except KeyboardInterrupt:
        say("detached: the backfill goes on in the platform server; `tp runs` lists its days")
        raise typer.Exit(0) from None
    failed = [line["day"] for line in results if line["status"] == "FAILED"]
    if as_json:
        status = "FAILED" if failed else "SUCCEEDED"
        print(json.dumps({"status": status, "backfill_id": retraining.backfill_id, "days": results}, default=str))
    if failed:
        raise typer.Exit(1)


def _day_line(line: dict[str, Any]) -> str:
    if line["status"] == "FAILED":
        return f"{line['day']}  {line['run_id']}  FAILED: {line['error']}"
    return (
        f"{line['day']}  {line['run_id']}  model v{line['model_version']}  "
        f"{'promoted' if line['promoted'] else 'not promoted'}  lineage {line['lineage_key']}  "
        f"snapshot {line['snapshot_id'][:12]}" + ("  (trained before)" if line["status"] == "EXISTS" else "")
    )


def _day_option(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise SpecError(f"{option} {value!r} is not a day; write it as YYYY-MM-DD") from None


def _seed_empty_landing(spec: TrainSpec, home: PlatformHome, days: list) -> None:
    """A fresh checkout has no drops: split the bundled digits into one drop per day asked for (this machine's
    own platform server reads the same landing directory; a team's server has its own)."""
    from training_platform.datasets.daily import default_landing, is_dated_source, list_drops, seed_landing

    if os.environ.get(SERVER_URL_ENV):
        return
    landing = default_landing(home.root)
    if is_dated_source(spec.dataset.source) and not list_drops(landing):
        seed_landing(landing, days[0], len(days))
        console.print(f"seeded {landing}: scikit-learn digits split into {len(days)} daily drop(s)", highlight=False)


@app.command()
def doctor(
    as_json: JsonFlag = False,
    bench: Annotated[bool, typer.Option("--bench", help="also measure checkpoint, all-reduce and data speed")] = False,
    spec_path: Annotated[Path, typer.Option("--spec", help="spec whose checkpoint size is benchmarked")] = DEMO_SPEC,
) -> None:
    """Check the environment: Python, torch and devices, MLflow store, Dagster home (--bench: speeds)."""
    import torch

    try:
        platform_home = home()
    except PlatformError as exc:
        fail(exc, as_json)
    checks: list[tuple[str, bool, str]] = [
        ("python", sys.version_info >= (3, 11), sys.version.split()[0]),
        ("torch", True, torch.__version__),
        (
            "devices",
            True,
            f"{torch.cuda.device_count()} CUDA GPU(s)"
            if torch.cuda.is_available()
            else f"CPU only, {os.cpu_count()} cores (gloo)",
        ),
        ("distributed", torch.distributed.is_available(), "gloo" + (", nccl" if torch.cuda.is_available() else "")),
    ]
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=platform_home.mlflow_tracking_uri).search_experiments(max_results=1)
        checks.append(("mlflow", True, redact(platform_home.mlflow_tracking_uri)))
    except Exception as exc:  # noqa: BLE001 - doctor reports any failure as a finding
        checks.append(("mlflow", False, redact(f"{platform_home.mlflow_tracking_uri}: {exc}")))
    dagster_home = platform_home.dagster_home
    checks.append(("dagster_home", os.access(dagster_home, os.W_OK), str(dagster_home)))
    ok = all(passed for _, passed, _ in checks)
    bench_results = _doctor_bench(spec_path, platform_home) if bench else None
    if as_json:
        report = {"ok": ok, "checks": {name: {"ok": p, "detail": d} for name, p, d in checks}}
        print(json.dumps(report | ({"bench": [b.to_dict() for b in bench_results]} if bench_results else {})))
    else:
        table = Table("check", "ok", "detail")
        for name, passed, detail in checks:
            table.add_row(name, "[green]yes[/green]" if passed else "[red]no[/red]", detail)
        console.print(table)
    if not ok:
        raise typer.Exit(1)


def _doctor_bench(spec_path: Path, home: PlatformHome) -> list:
    from training_platform.cli.telemetry import bench

    try:
        spec = load_spec(spec_path)
    except PlatformError as exc:
        fail(exc, False)
    return bench(spec, spec.checkpoint.store_uri or str(home.checkpoints), home.snapshots, console)


def _run_records(as_json: bool):
    """What lists the platform server's runs merged with each run's telemetry (for status and metrics)."""
    from training_platform.client.records import server_run_records

    platform_home = home()
    try:
        platform = client(platform_home)
    except PlatformError as exc:
        fail(exc, as_json)
    return lambda: server_run_records(platform, platform_home)


@app.command()
def status(
    team: Annotated[str | None, typer.Option("--team", help="only this team's runs")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Queued and running runs: estimated wait, progress, utilization, cost so far."""
    from training_platform.cli.telemetry import show_status

    show_status(_run_records(as_json), team, as_json, console)


@app.command()
def metrics(
    port: Annotated[int, typer.Option("--port", help="port of the /metrics endpoint")] = 9108,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics: queue depth, running jobs, utilization and cost per team."""
    from training_platform.cli.telemetry import serve_metrics

    serve_metrics(_run_records(False), port, host, console)


@app.command()
def plan(
    spec_path: Annotated[Path, typer.Argument(help="YAML spec of the run (see examples/)")],
    as_json: JsonFlag = False,
) -> None:
    """Estimate memory per GPU for a spec and recommend a GPU type and count."""
    from training_platform.cost.plan import GIB, model_shape, plan_spec
    from training_platform.datasets import load_manifest

    try:
        spec = load_spec(spec_path)
        features = classes = None
        if spec.dataset.snapshot_id is not None:
            snapshot = load_manifest(PlatformHome.from_env().snapshots, spec.dataset.snapshot_id)
            features, classes = snapshot.num_features, snapshot.num_classes
        result = plan_spec(spec, model_shape(spec, features, classes))
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps(result))
        return
    memory = result["per_gpu_bytes"]
    console.print(
        f"{result['params']:,} parameters, {result['strategy']} on {result['data_parallel_size']} process(es): "
        f"{result['per_gpu_gib']:.2f} GiB per GPU (weights {memory['weights'] / GIB:.2f}, gradients "
        f"{memory['gradients'] / GIB:.2f}, optimizer {memory['optimizer'] / GIB:.2f}, activations "
        f"{memory['activations'] / GIB:.2f})",
        highlight=False,
    )
    table = Table("gpu", "count", "GiB/GPU", "time", "usd")
    for option in result["options"]:
        usd = "-" if option["usd"] is None else readable_usd(option["usd"])
        took = readable_duration(option["hours"] * 3600)
        table.add_row(option["gpu_type"], str(option["count"]), str(option["per_gpu_gib"]), took, usd)
    console.print(table)
    best = result["recommendation"]
    console.print(f"recommended: {best['count']} x {best['gpu_type']}" if best else "no GPU in the table fits")


@app.command()
def render(
    spec_path: Annotated[Path, typer.Argument(help="YAML spec of the run (see examples/)")],
    launcher: Annotated[str | None, typer.Option("--launcher", help="local, slurm or k8s (overrides the spec)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the launch plan (command, resources, sbatch script or Kubernetes manifests) without submitting."""
    try:
        spec = load_spec(spec_path)
        if launcher is not None:
            spec = parse_spec({**spec.model_dump(mode="json"), "backend": launcher}, source="--launcher")
        home = PlatformHome.from_env()
        spec = resolve_team(spec, home.root)  # render what would run: the team's, or nothing
        run_id = f"{spec.name}-render"
        plan = launcher_for(spec.backend).plan(RunRequest(spec=spec, run_id=run_id, run_dir=home.run_dir(run_id)))
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        shown = {"backend": plan.backend, "command": plan.command, "resources": plan.resources, "files": plan.files}
        print(redact(json.dumps(shown, default=str)))
    else:
        print(plan.render())  # redacted


app.command()(login)  # listed after the commands that run things
app.command()(token)


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":
    main()
