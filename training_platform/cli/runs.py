"""`tp runs`, `tp logs`, `tp cancel`, `tp resume`, `tp reproduce`: runs in the platform server, by run id.

A RUN argument is a platform run id (the `training_runs` partition, as `tp train` prints it) or the id
of one of its Dagster runs.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer
from rich.table import Column, Table

from training_platform.cli.common import JsonFlag, client, console, emit, fail, follow_run, home, say
from training_platform.client import DagsterRun, PlatformClient
from training_platform.client.graphql import IN_PROGRESS
from training_platform.client.runs import continuation, resubmit, summary
from training_platform.errors import PlatformError, SpecError
from training_platform.identifiers import check_run_id
from training_platform.policy.rights import check_may_act_on_run
from training_platform.spec.submission import (
    REPRODUCTION_TAG,
    RESUME_TAG,
    THEN_TRAIN_TAG,
    carried_tags,
    run_assets,
)

RunArg = Annotated[str, typer.Argument(help="run id (as `tp train` and `tp runs` print it)")]
CANCEL_WAIT_S = 30.0
STATES = {
    "queued": ("QUEUED", "NOT_STARTED", "STARTING"),
    "running": ("STARTED", "CANCELING"),
    "succeeded": ("SUCCESS",),
    "failed": ("FAILURE",),
    "canceled": ("CANCELED",),
}


def located(ref: str, acting: bool = False) -> tuple[PlatformClient, str, DagsterRun]:
    """The platform server's client, and REF's run id and newest Dagster run (`find`). REF is checked first: a
    mistyped id is told at once, before a server is started to look it up. To act on it (`acting`: cancel, resume,
    reproduce), the user must be a member of its team or an admin: refused here in one line, as the server would."""
    check_run_id(ref, "run", fix="list runs with `tp runs`")
    platform_home = home()
    platform = client(platform_home)
    run_id, current = find(platform, ref)
    if acting:
        check_may_act_on_run(platform.whoami(), run_id, current.tags.get("team"), platform_home.root)
    return platform, run_id, current


def find(platform: PlatformClient, ref: str) -> tuple[str, DagsterRun]:
    """The platform run id and its newest Dagster run (its snapshot run before training started)."""
    attempts = platform.attempts(ref) or platform.runs(tags={THEN_TRAIN_TAG: ref}, limit=5)
    if attempts:
        return ref, attempts[0]
    run = platform.run(ref) if len(ref) == 36 else None  # a Dagster run id (a UUID)
    if run is not None and (run.partition or run.tags.get(THEN_TRAIN_TAG)):
        run_id = run.tags.get(THEN_TRAIN_TAG) or run.partition
        return find(platform, run_id) if run_id != ref else (ref, run)
    raise SpecError(f"no run {ref!r} on the platform server at {platform.url}; list runs with `tp runs`")


def runs(
    team: Annotated[str | None, typer.Option("--team", help="only this team's runs")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="queued, running, succeeded, failed or canceled")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many runs")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Queued, running and finished runs: team, state, step of total, cost so far."""
    try:
        if status is not None and status.lower() not in STATES:
            raise SpecError(f"--status {status!r}: use one of {', '.join(STATES)}")
        platform = client(home())
        statuses = STATES[status.lower()] if status else None
        dagster_runs = platform.runs(tags={"team": team} if team else None, statuses=statuses, limit=limit * 4)
    except PlatformError as exc:
        fail(exc, as_json)
    rows = _rows(dagster_runs)[:limit]
    if as_json:
        print(json.dumps({"runs": rows}))
        return
    if not rows:
        say("no runs" + (f" of team {team}" if team else "") + (f" {status}" if status else ""))
        return
    table = Table("team", "state", "step", "cost $", "attempts", "created")
    table.columns.insert(0, Column("run", no_wrap=True))  # run ids are copied from here: never cut
    for row in rows:
        step = f"{row['step']}/{row['max_steps']}" if row["step"] is not None else "-"
        cost = f"{row['cost_usd']:.4f}" if row["cost_usd"] is not None else "-"
        created = time.strftime("%m-%d %H:%M", time.localtime(row["created"]))
        table.add_row(row["run_id"], row["team"], row["state"], step, cost, str(row["attempts"]), created)
    console.print(table)


def _rows(dagster_runs: list[DagsterRun]) -> list[dict]:
    """One row per platform run (newest Dagster run first), with its number of Dagster runs."""
    rows: dict[str, dict] = {}
    for run in dagster_runs:
        run_id = run.partition if run.trains else run.tags.get(THEN_TRAIN_TAG)
        if not run_id or "team" not in run.tags:
            continue
        if run_id in rows:
            rows[run_id]["attempts"] += run.trains
            continue
        state = {"STARTED": "RUNNING", "SUCCESS": "SUCCEEDED", "FAILURE": "FAILED"}.get(run.status, run.status)
        rows[run_id] = {
            "run_id": run_id,
            "team": run.team,
            "state": state if run.trains else f"SNAPSHOT {state}",
            "step": int(run.tags["tp/step"]) if "tp/step" in run.tags else None,
            "max_steps": run.tags.get("tp/max_steps"),
            "cost_usd": float(run.tags["tp/cost_usd"]) if "tp/cost_usd" in run.tags else None,
            "attempts": int(run.trains),
            "created": run.created,
            "dagster_run_id": run.id,
        }
    return list(rows.values())


def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing while the run is live")] = False,
) -> None:
    """Print the run's worker log (rank 0, and any rank's error); with -f, follow it while the run is live."""
    try:
        platform, run_id, current = located(run)
        key = cursor = None
        while True:
            key = key or platform.log_key(current.id)
            if key:
                text, cursor = platform.stdout(current.id, key, cursor)
                sys.stdout.write(text)
                sys.stdout.flush()
            if not follow:
                break
            if current.finished:  # on to the run that continues it (a resume, the training after its snapshot)
                current, key, cursor = continuation(platform, run_id, current), None, None
                if current is None:
                    break
            else:
                time.sleep(1.0)
                current = platform.run(current.id) or current
    except PlatformError as exc:
        fail(exc, False)
    except KeyboardInterrupt:
        pass


def cancel(run: RunArg, as_json: JsonFlag = False) -> None:
    """Cancel a queued or running run, and the job it launched on its backend; its checkpoints stay."""
    try:
        platform, run_id, current = located(run, acting=True)
        if current.status not in IN_PROGRESS:
            # Between two of its Dagster runs (its snapshot passed; a preemption, before the resume): the
            # next one is cancelled as soon as the server starts it, before it trains.
            current = continuation(platform, run_id, current) or current
        if current.status not in IN_PROGRESS:
            raise PlatformError(f"run {run_id} is not queued or running ({current.status}); nothing to cancel")
        platform.terminate(current.id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not current.finished and time.monotonic() < deadline:
            time.sleep(0.5)
            current = platform.run(current.id) or current
    except PlatformError as exc:
        fail(exc, as_json)
    outcome = {"run_id": run_id, "status": current.status, "dagster_run_id": current.id}
    if as_json:
        print(json.dumps(outcome))
    else:
        say(f"run {run_id}: {current.status}" + ("; resume it with `tp resume " + run_id + "`"
                                                  if current.status == "CANCELED" else ""))
    if current.status != "CANCELED":
        raise typer.Exit(1)


def resume(
    run: RunArg,
    detach: Annotated[bool, typer.Option("--detach", help="print the run id and return; the run goes on")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Continue a cancelled or failed run from its newest checkpoint."""
    try:
        platform, run_id, current = located(run, acting=True)
        if not current.trains:
            raise PlatformError(f"run {run_id} never started training ({current.status}); submit it again")
        if current.status in IN_PROGRESS:
            raise PlatformError(f"run {run_id} is {current.status}; follow it with `tp logs {run_id} -f`")
        if current.status == "SUCCESS":
            raise PlatformError(f"run {run_id} finished; `tp reproduce {run_id}` trains it again from scratch")
        tags = carried_tags(current.tags) | {RESUME_TAG: current.id}
        dagster_run_id = resubmit(platform, run_id, tags, run_assets(current.tags))
    except PlatformError as exc:
        fail(exc, as_json)
    say(f"resuming {run_id} from its newest checkpoint")
    _finish(platform, run_id, dagster_run_id, detach, as_json)


def _finish(platform: PlatformClient, run_id: str, dagster_run_id: str, detach: bool, as_json: bool) -> None:
    if detach:
        emit({"run_id": run_id, "status": "QUEUED", "dagster_run_id": dagster_run_id}, as_json)
        return
    final = follow_run(platform, run_id, dagster_run_id, as_json)
    result = summary(platform, run_id, final)
    emit(result, as_json)
    if result["status"] not in ("SUCCEEDED", "PRUNED"):
        if not as_json:
            console.print(f"[red]error:[/red] {result.get('error')}", highlight=False)
        raise typer.Exit(1)


def reproduce(run: RunArg, as_json: JsonFlag = False) -> None:
    """Re-run a finished run from its lineage key and report "reproduced exactly" or what differs."""
    try:
        platform, run_id, current = located(run, acting=True)
        finished = [r for r in platform.attempts(run_id) if r.status == "SUCCESS"]
        if not finished:
            raise SpecError(
                f"run {run_id!r} has no finished attempt to reproduce ({current.status}); "
                f"`tp resume {run_id}` continues an unfinished one"
            )
        tags = carried_tags(current.tags) | {REPRODUCTION_TAG: finished[0].id}
        dagster_run_id = resubmit(platform, run_id, tags, ("training_run",))
        final = follow_run(platform, run_id, dagster_run_id, as_json)
        if final.phase != "SUCCEEDED":
            bad_input = final.error_class in ("SpecError", "SnapshotError")  # e.g. the original's snapshot is gone
            raise (SpecError if bad_input else PlatformError)(f"cannot reproduce {run_id}: {final.error}")
        check = next((c for c in platform.check_results(dagster_run_id) if c.name == "reproducibility"), None)
        if check is None:
            raise PlatformError(f"reproduction of {run_id}: no reproducibility check recorded; see the run in the UI")
    except PlatformError as exc:
        fail(exc, as_json)
    figures = check.metadata
    result = {
        "run_id": run_id,
        "passed": check.passed,
        "reproduced_exactly": figures.get("exact"),
        "weights_equal": figures.get("weights_equal"),
        "differences": figures.get("differences"),
        "reasons_not_exact": figures.get("reasons_not_exact"),
        "summary": check.description,
        "dagster_run_id": dagster_run_id,
    }
    emit(result, as_json)
    if not as_json:
        colour = "green" if check.passed else "red"
        console.print(f"[{colour}]{check.description}[/{colour}]", highlight=False)
    if not check.passed:
        raise typer.Exit(1)

