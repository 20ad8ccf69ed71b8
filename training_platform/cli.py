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

from training_platform.errors import PlatformError, SpecError
from training_platform.launch import RunRequest
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.paths import PlatformHome
from training_platform.preflight import preflight
from training_platform.runs import register_run
from training_platform.spec import BACKENDS, TrainSpec, load_spec, parse_spec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_SPEC = PROJECT_ROOT / "examples" / "digits.yaml"

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train, track and reproduce models.")
console = Console(stderr=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="end with one JSON object on the last line")]


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


def _materialize(selection: list[str], partition_key: str | None = None):
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
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        tags={"team": "", "launched_by": "tp"},
    )


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
        result = _run_with_progress("dataset snapshot + expectations", lambda: _materialize(["dataset_snapshot"]))
        if not result.success:
            raise PlatformError(f"dataset snapshot failed: {_failure_message(result)}")
    run_id = register_run(home, spec)
    dg.DagsterInstance.get().add_dynamic_partitions("training_runs", [run_id])
    selection = ["training_run", "checkpoints", "evaluated_model", "registered_model"]
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
    evaluated = result.asset_value("evaluated_model")
    registered = result.asset_value("registered_model")
    return {
        "run_id": run_id,
        "status": trained["status"],
        "final_step": trained["final_step"],
        "final_weights_sha256": trained["final_weights_sha256"],
        "checkpoints": trained["checkpoints"],
        "mlflow_run_id": trained["mlflow_run_id"],
        "snapshot_id": trained["snapshot_id"],
        "test_accuracy": round(evaluated["test_accuracy"], 4),
        "model_name": registered["model_name"],
        "model_version": registered["model_version"],
        "promoted": registered["promoted"],
        "tracking_uri": registered["tracking_uri"],
        "dagster_run_id": result.run_id,
    }


def _validated(spec: TrainSpec, home: PlatformHome, launcher: str | None) -> TrainSpec:
    if launcher is not None:
        if launcher not in BACKENDS:
            raise SpecError(f"--launcher: unknown backend {launcher!r}; use one of: {', '.join(BACKENDS)}")
        spec = parse_spec({**spec.model_dump(mode="json"), "backend": launcher}, source="--launcher")
    store_uri = spec.checkpoint.store_uri or str(home.checkpoints)
    preflight(spec, home, store_uri)
    if spec.backend == "local":
        LocalLauncher().check(RunRequest(spec=spec, run_id="preflight", run_dir=home.runs))
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
def doctor(as_json: JsonFlag = False) -> None:
    """Check the environment: Python, torch and devices, MLflow store, Dagster home."""
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
    if as_json:
        print(json.dumps({"ok": ok, "checks": {name: {"ok": p, "detail": d} for name, p, d in checks}}))
    else:
        table = Table("check", "ok", "detail")
        for name, passed, detail in checks:
            table.add_row(name, "[green]yes[/green]" if passed else "[red]no[/red]", detail)
        console.print(table)
    if not ok:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":
    main()
