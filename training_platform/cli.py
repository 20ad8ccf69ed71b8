"""`tp`: the platform's command line. It composes everything, so it alone may import Dagster.

Every command that takes `--json` ends its output with one JSON object on the last line.
Errors a user can act on print one line and exit non-zero (2 for bad input), without a traceback.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from training_platform.attempts import latest_record
from training_platform.cost import check_budget, estimate_run_usd
from training_platform.cost.commands import cost_app
from training_platform.errors import PlatformError, SpecError
from training_platform.launch import RunRequest
from training_platform.launch.local import LOG_FILE
from training_platform.launch.registry import launcher_for
from training_platform.paths import PlatformHome
from training_platform.preflight import check_snapshot, preflight
from training_platform.runs import register_run
from training_platform.spec import BACKENDS, TrainSpec, load_spec, parse_spec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_SPEC = PROJECT_ROOT / "examples" / "digits.yaml"

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train, track and reproduce models.")
console = Console(stderr=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="end with one JSON object on the last line")]
app.add_typer(cost_app, name="cost")


def keep_stop_signals_deliverable() -> None:
    """Undo SIGINT/SIGTERM being ignored, as a script's background job starts with SIGINT ignored.

    Dagster's in-process execution installs its SIGINT handler on SIGTERM too, so an ignored
    SIGINT becomes an ignored SIGTERM, which every process started afterwards inherits: the
    `tail`s Dagster mirrors compute logs with then outlive their run (Dagster stops them with
    SIGTERM) and hold this process's stdout open; a `tp sweep` under pytest was waited on for good.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@app.callback()
def _startup() -> None:
    keep_stop_signals_deliverable()


def _emit(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, default=str))
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in summary.items():
        if key != "checkpoints":
            table.add_row(key, str(value))
    console.print(table)


def _fail(exc: PlatformError, as_json: bool) -> None:
    message = str(exc).strip()
    if as_json:
        print(json.dumps({"status": "REFUSED" if exc.exit_code == 2 else "FAILED", "error": message}))
    for line in message.splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False)
    raise typer.Exit(exc.exit_code)


def _home() -> PlatformHome:
    home = PlatformHome.from_env().ensure()
    os.environ.setdefault("TP_HOME", str(home.root))
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster_home))
    instance_config = Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml"
    if not instance_config.exists():
        instance_config.parent.mkdir(parents=True, exist_ok=True)
        instance_config.write_text("telemetry:\n  enabled: false\n")
    return home


# ----- the pipeline through Dagster ----------------------------------------------------------
def _quiet_libraries() -> None:
    """Keep the CLI's output to what the user asked for; details stay in the Dagster and MLflow logs."""
    import dagster as dg
    import mlflow  # noqa: F401 - imported first: mlflow sets its own log levels on import

    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("mlflow.utils.requirements_utils").setLevel(logging.ERROR)
    logging.getLogger("torch._export").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _materialize(selection: list[str], partition_key: str | None = None, ops: dict | None = None):
    import dagster as dg

    _quiet_libraries()

    from assets import ALL_ASSETS, ALL_CHECKS
    from definitions import defs

    return dg.materialize(
        [*ALL_ASSETS, *ALL_CHECKS],
        selection=selection,
        partition_key=partition_key,
        instance=dg.DagsterInstance.get(),
        resources=defs.resources,
        raise_on_error=False,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}} | (ops or {}),
        tags={"team": "", "launched_by": "tp"},
    )


def _materialize_snapshot(source: str, day: str | None = None):
    """Build the `day` (default today, UTC) partition of dataset_snapshot from `source`; raise if it fails."""
    from assets.datasets import snapshot_run_config, today_partition

    day = day or today_partition()
    result = _run_with_progress(
        f"dataset snapshot {day} + expectations",
        lambda: _materialize(["dataset_snapshot"], partition_key=day, ops=snapshot_run_config(source)),
    )
    if not result.success:
        raise PlatformError(f"dataset snapshot {day} failed: {_failure_message(result)}")
    return result


def _failure_message(result) -> str:
    for event in result.all_events:
        if event.is_step_failure:
            error = event.step_failure_data.error
            cause = error.cause.message if error and error.cause else ""
            return f"{event.step_key}: {(error.message if error else 'failed').strip()} {cause.strip()}".strip()
    for check in result.get_asset_check_evaluations():
        if not check.passed:
            return f"check {check.check_name} failed: {check.description}"
    return "the Dagster run failed; open the UI (make ui) for its logs"


def _run_with_progress(label: str, work, progress_source: Path | None = None, total: int | None = None):
    """Run `work()` in a thread; show a progress bar fed by the worker's log (rich on a terminal)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    if not console.is_terminal:
        console.print(f"{label} ...", highlight=False)
        thread.join()
        console.print(f"{label}: done in {time.monotonic() - started:.1f} s", highlight=False)
        return _unbox(box)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(label, total=total)
        while thread.is_alive():
            thread.join(0.5)
            if progress_source is not None and progress_source.is_file():
                steps = re.findall(r"^step (\d+):", progress_source.read_text(errors="replace"), re.M)
                if steps:
                    progress.update(task, completed=int(steps[-1]))
        progress.update(task, completed=total or 1, total=total or 1)
    return _unbox(box)


def _unbox(box: dict[str, Any]):
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_pipeline(spec: TrainSpec, home: PlatformHome) -> dict[str, Any]:
    """Snapshot (if the spec builds from a source), then train, checkpoint, evaluate and register."""
    import dagster as dg

    if spec.dataset.snapshot_id is None:
        _materialize_snapshot(spec.dataset.source, spec.dataset.as_of and spec.dataset.as_of.isoformat())
    run_id = register_run(home, spec)
    dg.DagsterInstance.get().add_dynamic_partitions("training_runs", [run_id])
    # A user's own script trains its own model: the template-based evaluation and registry do not apply.
    evaluates = spec.entrypoint is None
    selection = ["training_run", "checkpoints"] + (["evaluated_model", "registered_model"] if evaluates else [])
    result = _run_with_progress(
        f"training {run_id}",
        lambda: _materialize(selection, partition_key=run_id),
        progress_source=home.run_dir(run_id) / LOG_FILE,
        total=spec.training.max_steps,
    )
    if not result.success:
        return {
            "run_id": run_id,
            "status": "FAILED",
            "error": _failure_message(result),
            "dagster_run_id": result.run_id,
        }
    trained = result.asset_value("training_run")
    summary = {
        "run_id": run_id,
        "status": trained["status"],
        "final_step": trained["final_step"],
        "final_weights_sha256": trained["final_weights_sha256"],
        "checkpoints": trained["checkpoints"],
        "mlflow_run_id": trained["mlflow_run_id"],
        "snapshot_id": trained["snapshot_id"],
        "tracking_uri": trained["tracking_uri"],
        "dagster_run_id": result.run_id,
    }
    if evaluates:
        evaluated = result.asset_value("evaluated_model")
        registered = result.asset_value("registered_model")
        summary |= {
            "test_accuracy": round(evaluated["test_accuracy"], 4),
            "model_name": registered["model_name"],
            "model_version": registered["model_version"],
            "promoted": registered["promoted"],
        }
    return summary


def _validated(spec: TrainSpec, home: PlatformHome, launcher: str | None) -> TrainSpec:
    if launcher is not None:
        if launcher not in BACKENDS:
            raise SpecError(f"--launcher: unknown backend {launcher!r}; use one of: {', '.join(BACKENDS)}")
        spec = parse_spec({**spec.model_dump(mode="json"), "backend": launcher}, source="--launcher")
    store_uri = spec.checkpoint.store_uri or str(home.checkpoints)
    preflight(spec, home, store_uri)
    launcher = launcher_for(spec.backend)
    launcher.check(launcher.plan(RunRequest(spec=spec, run_id="preflight", run_dir=home.runs / ".preflight")))
    return spec


# ----- commands ------------------------------------------------------------------------------
@app.command()
def train(
    spec_path: Annotated[Path, typer.Argument(help="YAML spec of the run (see examples/)")],
    launcher: Annotated[str | None, typer.Option("--launcher", help="local, slurm or k8s (overrides the spec)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run one training run through Dagster (lineage recorded) and wait for it."""
    try:
        home = _home()
        spec = _validated(load_spec(spec_path), home, launcher)
        check_budget(home.root, spec.team, estimate_run_usd(spec))  # refused before anything is queued
        summary = run_pipeline(spec, home)
    except PlatformError as exc:
        _fail(exc, as_json)
    _emit(summary, as_json)
    if summary["status"] != "SUCCEEDED":
        console.print(f"[red]error:[/red] {summary.get('error')}", highlight=False)
        raise typer.Exit(1)


@app.command()
def demo(as_json: JsonFlag = False) -> None:
    """Run the whole pipeline on the embedded default: snapshot, train (2 processes), evaluate, register."""
    started = time.monotonic()
    try:
        home = _home()
        spec = load_spec(DEMO_SPEC)
        spec = parse_spec({**spec.model_dump(mode="json"), "owner": getpass.getuser()}, source=str(DEMO_SPEC))
        summary = run_pipeline(_validated(spec, home, None), home)
    except PlatformError as exc:
        _fail(exc, as_json)
    summary["demo_seconds"] = round(time.monotonic() - started, 1)
    _emit(summary, as_json)
    if not as_json:
        experiment = f"{spec.team}/{spec.name}"
        console.print(
            "\n[bold]Where to look[/bold]\n"
            "  make ui       starts the Dagster UI (http://127.0.0.1:3000: Assets -> Global asset lineage)\n"
            "                and the MLflow UI (http://127.0.0.1:5000)\n"
            f"  MLflow run    {summary.get('mlflow_run_id')} in experiment {experiment}\n"
            f"  Model         {summary.get('model_name')} v{summary.get('model_version')}\n"
            f"  Data          {home.root}",
            highlight=False,
        )
    if summary["status"] != "SUCCEEDED":
        raise typer.Exit(1)


@app.command()
def doctor(
    as_json: JsonFlag = False,
    bench: Annotated[bool, typer.Option("--bench", help="also measure checkpoint, all-reduce and data speed")] = False,
    spec_path: Annotated[Path, typer.Option("--spec", help="spec whose checkpoint size is benchmarked")] = DEMO_SPEC,
) -> None:
    """Check the environment: Python, torch and devices, MLflow store, Dagster home (--bench: speeds)."""
    import torch

    home = _home()
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

        MlflowClient(tracking_uri=home.mlflow_tracking_uri).search_experiments(max_results=1)
        checks.append(("mlflow", True, home.mlflow_tracking_uri))
    except Exception as exc:  # noqa: BLE001 - doctor reports any failure as a finding
        checks.append(("mlflow", False, f"{home.mlflow_tracking_uri}: {exc}"))
    dagster_home = home.dagster_home
    checks.append(("dagster_home", os.access(dagster_home, os.W_OK), str(dagster_home)))
    ok = all(passed for _, passed, _ in checks)
    bench_results = _doctor_bench(spec_path, home) if bench else None
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


@app.command()
def sweep(
    sweep_path: Annotated[Path, typer.Argument(help="YAML sweep (see examples/*sweep*.yaml)")],
    now: Annotated[bool, typer.Option("--now", help="start now even when a deadline leaves a cheaper window")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run a sweep through Dagster (trials are training_run partitions), or queue it for its cost window."""
    from datetime import UTC, datetime

    from training_platform.sweeps import SweepQueue, load_sweep
    from training_platform.sweeps.queue import sweep_window, waits_for_window

    try:
        home = _home()
        spec = load_sweep(sweep_path)
        _validated(spec.base_spec, home, None)
        check_budget(home.root, spec.team, spec.limits.max_usd or 0.0)  # refused before anything is queued
        window = sweep_window(spec)
        queued = SweepQueue(home.root).enqueue(spec, window)
        summary = {"sweep": spec.name, "window": window.as_dict()}
        if not now and waits_for_window(spec, window, datetime.now(UTC)):
            _sweep_partition(spec.name)
            summary |= {"status": "QUEUED", "release": "the hourly sweep_window_schedule starts it in the window"}
        else:
            base = spec.base_spec.dataset
            summary |= _run_sweep_now(queued.sweep.name, base.source if base.snapshot_id is None else None)
    except PlatformError as exc:
        _fail(exc, as_json)
    if not as_json:
        summary.pop("trial_table", None)
    _emit(summary, as_json)
    if summary["status"] not in ("SUCCEEDED", "QUEUED"):
        raise typer.Exit(1)


def _sweep_partition(name: str):
    import dagster as dg

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("sweeps", [name])
    return instance


def _run_sweep_now(name: str, snapshot_source: str | None) -> dict[str, Any]:
    """Materialize the sweep asset in-process: it runs every trial as a training_run partition."""
    import dagster as dg

    _quiet_libraries()
    from assets import SWEEP_ASSETS
    from definitions import defs

    if snapshot_source:
        _materialize_snapshot(snapshot_source)
    instance = _sweep_partition(name)
    result = _run_with_progress(
        f"sweep {name}",
        lambda: dg.materialize(
            SWEEP_ASSETS,
            partition_key=name,
            instance=instance,
            resources=defs.resources,
            raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        ),
    )
    if not result.success:
        return {"status": "FAILED", "error": _failure_message(result), "dagster_run_id": result.run_id}
    return {**result.asset_value("sweep"), "dagster_run_id": result.run_id}


def _doctor_bench(spec_path: Path, home: PlatformHome) -> list:
    from training_platform.telemetry.commands import bench

    try:
        spec = load_spec(spec_path)
    except PlatformError as exc:
        _fail(exc, False)
    return bench(spec, spec.checkpoint.store_uri or str(home.checkpoints), home.snapshots, console)


def _run_records():
    """Run records from the Dagster instance merged with each run's telemetry (for status and metrics)."""
    import dagster as dg

    from sensors.alerts import dagster_run_records

    home = _home()
    return lambda: dagster_run_records(dg.DagsterInstance.get(), home)


@app.command()
def status(
    team: Annotated[str | None, typer.Option("--team", help="only this team's runs")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Queued and running runs: estimated wait, progress, utilization, cost so far."""
    from training_platform.telemetry.commands import show_status

    show_status(_run_records(), team, as_json, console)


@app.command()
def metrics(
    port: Annotated[int, typer.Option("--port", help="port of the /metrics endpoint")] = 9108,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics: queue depth, running jobs, utilization and cost per team."""
    from training_platform.telemetry.commands import serve_metrics

    serve_metrics(_run_records(), port, host, console)


@app.command()
def plan(
    spec_path: Annotated[Path, typer.Argument(help="YAML spec of the run (see examples/)")],
    as_json: JsonFlag = False,
) -> None:
    """Estimate memory per GPU for a spec and recommend a GPU type and count."""
    from training_platform.datasets import load_manifest
    from training_platform.plan import GIB, model_shape, plan_spec

    try:
        spec = load_spec(spec_path)
        features = classes = None
        if spec.dataset.snapshot_id is not None:
            snapshot = load_manifest(PlatformHome.from_env().snapshots, spec.dataset.snapshot_id)
            features, classes = snapshot.num_features, snapshot.num_classes
        result = plan_spec(spec, model_shape(spec, features, classes))
    except PlatformError as exc:
        _fail(exc, as_json)
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
    table = Table("gpu", "count", "GiB/GPU", "hours", "usd")
    for option in result["options"]:
        usd = "-" if option["usd"] is None else f"{option['usd']:.4g}"
        hours = f"{option['hours']:.3g}"
        table.add_row(option["gpu_type"], str(option["count"]), str(option["per_gpu_gib"]), hours, usd)
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
        run_id = f"{spec.name}-render"
        plan = launcher_for(spec.backend).plan(RunRequest(spec=spec, run_id=run_id, run_dir=home.run_dir(run_id)))
    except PlatformError as exc:
        _fail(exc, as_json)
    if as_json:
        print(
            json.dumps(
                {"backend": plan.backend, "command": plan.command, "resources": plan.resources, "files": plan.files},
                default=str,
            )
        )
    else:
        print(plan.render())


@app.command()
def reproduce(
    run_id: Annotated[str, typer.Argument(help="the run (training_runs partition) to build again")],
    as_json: JsonFlag = False,
) -> None:
    """Re-run a finished run from its lineage key and report "reproduced exactly" or what differs."""
    try:
        home = _home()
        summary = reproduce_run(run_id, home)
    except PlatformError as exc:
        _fail(exc, as_json)
    _emit(summary, as_json)
    if not as_json:
        colour = "green" if summary["passed"] else "red"
        console.print(f"[{colour}]{summary['summary']}[/{colour}]", highlight=False)
    if not summary["passed"]:
        raise typer.Exit(1)


def reproduce_run(run_id: str, home: PlatformHome) -> dict[str, Any]:
    record = latest_record(home.run_dir(run_id))
    if record is None:
        raise SpecError(
            f"run {run_id!r} has no finished attempt to reproduce; list runs under {home.runs} "
            "(materializing an unfinished run continues it instead)"
        )
    original = parse_spec(record["spec"], source=f"run {run_id}")
    try:
        check_snapshot(original, home)
    except SpecError as exc:
        raise SpecError(f"cannot reproduce {run_id}: the original's {exc}") from None
    result = _run_with_progress(
        f"reproducing {run_id}",
        lambda: _materialize(["training_run"], partition_key=run_id),
        progress_source=home.run_dir(run_id) / LOG_FILE,
        total=original.training.max_steps,
    )
    if not result.success:
        raise PlatformError(f"reproduction of {run_id} failed: {_failure_message(result)}")
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "reproducibility"]
    figures = {key: value.value for key, value in check.metadata.items()}
    return {
        "run_id": run_id,
        "passed": check.passed,
        "reproduced_exactly": figures["exact"],
        "weights_equal": figures["weights_equal"],
        "differences": figures["differences"],
        "reasons_not_exact": figures["reasons_not_exact"],
        "summary": check.description,
        "dagster_run_id": result.run_id,
    }


RETRAIN_SPEC = PROJECT_ROOT / "examples" / "digits-daily.yaml"


@app.command()
def retrain(
    first: Annotated[str, typer.Option("--from", help="first day to rebuild (YYYY-MM-DD)")],
    last: Annotated[str, typer.Option("--to", help="last day to rebuild (YYYY-MM-DD), included")],
    spec_path: Annotated[Path, typer.Option("--spec", help="spec retrained each day")] = RETRAIN_SPEC,
    as_json: JsonFlag = False,
) -> None:
    """Backfill days: each day's dataset snapshot, then its run `<spec name>-<day>`; promotion only by the gate."""
    from training_platform.retraining import days_between

    try:
        home = _home()
        days = days_between(_day_option(first, "--from"), _day_option(last, "--to"))
        if not days:
            raise SpecError(f"--to {last} is before --from {first}; give the first day, then the last")
        spec = _validated(load_spec(spec_path), home, None)
        _seed_empty_landing(spec, home, days)
    except PlatformError as exc:
        _fail(exc, as_json)
    results = []
    for day in days:
        results.append(_retrain_day(spec, home, day))
        line = results[-1]
        console.print(
            f"{line['day']}  {line['run_id']}  "
            + (
                f"model v{line['model_version']}  {'promoted' if line['promoted'] else 'not promoted'}  "
                f"lineage {line['lineage_key']}  snapshot {line['snapshot_id'][:12]}"
                + ("  (trained before)" if line["status"] == "EXISTS" else "")
                if line["status"] != "FAILED"
                else f"FAILED: {line['error']}"
            ),
            highlight=False,
            soft_wrap=True,  # one line per day, however narrow the terminal
        )
    failed = [line["day"] for line in results if line["status"] == "FAILED"]
    if as_json:
        print(json.dumps({"status": "FAILED" if failed else "SUCCEEDED", "days": results}, default=str))
    if failed:
        raise typer.Exit(1)


def _day_option(value: str, option: str):
    from datetime import date

    try:
        return date.fromisoformat(value)
    except ValueError:
        raise SpecError(f"{option} {value!r} is not a day; write it as YYYY-MM-DD") from None


def _seed_empty_landing(spec: TrainSpec, home: PlatformHome, days: list) -> None:
    """A fresh checkout has no drops: split the bundled digits into one drop per day asked for."""
    from training_platform.datasets.daily import default_landing, is_dated_source, list_drops, seed_landing

    landing = default_landing(home.root)
    if is_dated_source(spec.dataset.source) and not list_drops(landing):
        seed_landing(landing, days[0], len(days))
        console.print(f"seeded {landing}: scikit-learn digits split into {len(days)} daily drop(s)", highlight=False)


def _retrain_day(spec: TrainSpec, home: PlatformHome, day) -> dict[str, Any]:
    """One day of a backfill: snapshot as of the day, then the day's run unless it was trained before."""
    import dagster as dg

    from training_platform.retraining import register_day_run

    run_id = register_day_run(home, spec, day)
    line: dict[str, Any] = {"day": day.isoformat(), "run_id": run_id}
    try:
        _materialize_snapshot(spec.dataset.source, day.isoformat())
    except PlatformError as exc:
        return line | {"status": "FAILED", "error": str(exc)}
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("training_runs", [run_id])
    trained_before = run_id in instance.get_materialized_partitions(dg.AssetKey("training_run"))
    if not trained_before:
        result = _run_with_progress(
            f"training {run_id}",
            lambda: _materialize(["training_run", "checkpoints", "evaluated_model", "registered_model"], run_id),
            progress_source=home.run_dir(run_id) / LOG_FILE,
            total=spec.training.max_steps,
        )
        if not result.success:
            return line | {"status": "FAILED", "error": _failure_message(result), "dagster_run_id": result.run_id}
    return line | {"status": "EXISTS" if trained_before else "SUCCEEDED"} | _day_models(instance, run_id)


def _day_models(instance, run_id: str) -> dict[str, Any]:
    """The run's model version, gate outcome and lineage key, read back from its materializations."""
    import dagster as dg

    from training_platform.retraining import lineage_digest

    def metadata(asset: str) -> dict[str, Any]:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[run_id]), limit=1
        ).records
        return {k: v.value for k, v in records[0].asset_materialization.metadata.items()} if records else {}

    trained, registered = metadata("training_run"), metadata("registered_model")
    lineage = trained.get("lineage") or {}
    return {
        "model_name": registered.get("model_name"),
        "model_version": registered.get("model_version"),
        "promoted": registered.get("promoted"),
        "snapshot_id": lineage.get("snapshot_id", ""),
        "lineage_key": lineage_digest(lineage),
        "lineage": lineage,
    }


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":
    main()
