"""`tp` as a client of the platform server: submit runs, read them, cancel them, over Dagster's GraphQL API.

Every request is one GraphQL document POSTed to the webserver's /graphql with the standard library:
submitting and terminating send the mutations dagster-graphql's `DagsterGraphQLClient` sends, the rest
(adding a partition, listing runs, reading materializations, check results and captured logs, launching
a backfill) one documented query each. Importing dagster-graphql would import dagster (over a second),
which `tp runs` must not pay. Nothing here executes a pipeline: every run goes through the server's queue.

A platform run (a `training_runs` partition, named like `digits-classifier-20261123-...`) may have
several Dagster runs: the first attempt, resumes after preemptions, retries, reproductions. The
newest one is the run's current state.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from training_platform.errors import PlatformError
from training_platform.spec.submission import LOCATION, PARTITION_TAG, REPOSITORY, TRAINING_JOB, TRAINING_RUNS

IN_PROGRESS = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
_BEING_STARTED = ("NOT_STARTED", "STARTING")  # dequeued, its process not yet up: Dagster cannot terminate it yet
TERMINATE_WAIT_S = 120.0
"""How long `terminate` asks again while a run is being started (a run process takes seconds to start, more on a
busy machine)."""
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")


class ClientError(PlatformError):
    """The platform server refused a request or could not be reached; the message says why."""


class ForbiddenError(ClientError):
    """The platform server refused a request the user may not make (403); nothing was changed."""

    exit_code = 2


@dataclass(frozen=True)
class DagsterRun:
    """One Dagster run as the server reports it."""

    id: str
    job: str
    status: str
    tags: dict[str, str]
    created: float
    started: float | None = None
    ended: float | None = None
    assets: tuple[str, ...] = ()  # what it materializes, when it was launched for assets

    @property
    def partition(self) -> str | None:
        return self.tags.get(PARTITION_TAG)

    @property
    def trains(self) -> bool:
        """A run of the training_run asset (from `tp`, a sensor, or the UI's Materialize), not a snapshot or sweep."""
        return self.job == TRAINING_JOB or "training_run" in self.assets

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def team(self) -> str:
        return self.tags.get("team", "")


@dataclass(frozen=True)
class Failure:
    message: str
    error_class: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    asset: str
    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


_METADATA = """fragment md on MetadataEntry { __typename label
  ... on IntMetadataEntry { intRepr } ... on FloatMetadataEntry { floatRepr } ... on TextMetadataEntry { text }
  ... on JsonMetadataEntry { jsonString } ... on BoolMetadataEntry { boolValue } ... on MarkdownMetadataEntry { mdStr }
  ... on PathMetadataEntry { path } ... on UrlMetadataEntry { url } ... on TableMetadataEntry { table { records } }
  ... on TimestampMetadataEntry { timestamp } ... on TableSchemaMetadataEntry { schema { columns { name type } } } }"""

_RUN_FIELDS = "runId jobName status creationTime startTime endTime tags { key value } assetSelection { path }"

_RUN = f"""query($id: ID!) {{ runOrError(runId: $id) {{ __typename ... on Run {{ {_RUN_FIELDS} }}
  ... on PythonError {{ message }} }} }}"""

_RUNS = f"""query($filter: RunsFilter, $limit: Int) {{ runsOrError(filter: $filter, limit: $limit) {{ __typename
  ... on Runs {{ results {{ {_RUN_FIELDS} }} }} ... on PythonError {{ message }}
  ... on InvalidPipelineRunsFilterError {{ message }} }} }}"""

_ADD_PARTITION = """mutation($key: String!, $partitions: String!, $repo: RepositorySelector!) {
  addDynamicPartition(partitionKey: $key, partitionsDefName: $partitions, repositorySelector: $repo) {
    __typename ... on PythonError { message } ... on UnauthorizedError { message } } }"""

_MATERIALIZATIONS = (
    """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run {
  assetMaterializations { assetKey { path } partition metadataEntries { ...md } } } } }"""
    + _METADATA
)

_EVENTS = (
    """query($id: ID!, $after: String) { logsForRun(runId: $id, afterCursor: $after) { __typename
  ... on EventConnection { cursor hasMore events { __typename
    ... on MessageEvent { message }
    ... on ExecutionStepFailureEvent { stepKey error { message className cause { message className } }
        failureMetadata { metadataEntries { ...md } } }
    ... on RunFailureEvent { error { message } }
    ... on AssetCheckEvaluationEvent { evaluation { checkName success description assetKey { path }
        metadataEntries { ...md } } }
    ... on LogsCapturedEvent { fileKey } } }
  ... on PythonError { message } ... on RunNotFoundError { message } } }"""
    + _METADATA
)

_ASSET_MATERIALIZATIONS = (
    """query($asset: [String!]!, $partitions: [String!], $limit: Int) { assetOrError(assetKey: {path: $asset}) {
  __typename ... on Asset { assetMaterializations(partitions: $partitions, limit: $limit) {
    timestamp metadataEntries { ...md } } } } }"""
    + _METADATA
)

_CHECK_EVALUATIONS = (
    """query($asset: [String!]!, $check: String!, $limit: Int!) {
  assetCheckExecutions(assetKey: {path: $asset}, checkName: $check, limit: $limit) {
    evaluation { success description timestamp metadataEntries { ...md } } } }"""
    + _METADATA
)

_DAEMONS = """{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"""

_CAPTURED_LOGS = """query($key: [String!]!, $cursor: String) {
  capturedLogs(logKey: $key, cursor: $cursor) { stdout cursor } }"""

# The mutations dagster-graphql's client sends (dagster_graphql/client/client_queries.py).
_SUBMIT = """mutation GraphQLClientSubmitRun($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) { __typename
    ... on InvalidStepError { invalidStepKey } ... on InvalidOutputError { stepKey invalidOutputName }
    ... on LaunchPipelineRunSuccess { run { runId } } ... on ConflictingExecutionParamsError { message }
    ... on PresetNotFoundError { message } ... on PipelineRunConflict { message }
    ... on PipelineConfigValidationInvalid { errors { __typename message path reason } }
    ... on PipelineNotFoundError { message } ... on PythonError { message } ... on UnauthorizedError { message } } }"""
_TERMINATE = """mutation GraphQLClientTerminateRun($runId: String!) { terminateRun(runId: $runId) { __typename
    ... on TerminateRunSuccess { run { runId } } ... on TerminateRunFailure { message }
    ... on RunNotFoundError { runId } ... on PythonError { message stack } } }"""
_BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
  ... on PartitionKeysNotFoundError { message } ... on UnauthorizedError { message }
  ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }"""


class PlatformClient:
    """The platform server at `url` (the webserver's address, e.g. http://127.0.0.1:3000), as the user whose
    `token` it sends (client/credentials.py)."""

    def __init__(self, url: str, timeout_s: int = 60, token: str | None = None):
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"{url!r} is not a platform server's address; write it as http://host:port")
        self.timeout_s = timeout_s
        self.token = token

    # ----- transport --------------------------------------------------------------------------
    def query(self, document: str, **variables: Any) -> dict[str, Any]:
        """The `data` of one GraphQL request; a server that cannot be reached, or GraphQL errors, raise ClientError."""
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": document, "variables": variables}).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"} | self._auth_headers(),
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # GraphQL errors come with 400 and a JSON body
            raw = exc.read()
            if exc.code in (401, 403):
                raise self._refused(exc.code, raw) from None
            body = _json_or_none(raw)
            if body is None:
                raise self._unreachable(f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise self._unreachable(_reason(getattr(exc, "reason", None) or exc)) from None
        if body.get("errors"):
            messages = "; ".join(str(error.get("message", error)) for error in body["errors"])
            raise ClientError(f"the platform server at {self.url} refused a request: {messages[:400]}")
        return body["data"]

    def whoami(self) -> str:
        """The user the server takes this client's token for (server/auth.py)."""
        request = urllib.request.Request(f"{self.url}/whoami", headers=self._auth_headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return str(json.loads(response.read())["user"])
        except urllib.error.HTTPError as exc:
            raise self._refused(exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise self._unreachable(_reason(getattr(exc, "reason", None) or exc)) from None

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _refused(self, status: int, raw: bytes) -> ClientError:
        """The server's authentication (server/auth.py) refused the request; its JSON says why."""
        try:
            said = str(json.loads(raw).get("error", ""))
        except (ValueError, AttributeError):
            said = raw[:200].decode("utf-8", "replace")
        if status == 401:
            who = "the token you sent" if self.token else "no token: you sent none"
            return ClientError(
                f"the platform server at {self.url} does not know you ({who}; it said: {said}); keep a token with "
                "`tp login` (an admin makes one: `tp admin token create USER`) or set TP_TOKEN"
            )
        return ForbiddenError(f"the platform server at {self.url} refused: {said}")

    def _unreachable(self, reason: str) -> ClientError:
        return ClientError(
            f"the platform server at {self.url} did not answer ({reason}); check it with `tp server status` "
            "(or TP_SERVER_URL)"
        )

    # ----- submitting -------------------------------------------------------------------------
    def add_partition(self, key: str, partitions: str = TRAINING_RUNS) -> None:
        """Add a partition (a run's, by default) to a dynamic partitions definition; nothing to do when it exists."""
        repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        result = self.query(_ADD_PARTITION, key=key, partitions=partitions, repo=repo)["addDynamicPartition"]
        if result["__typename"] in ("PythonError", "UnauthorizedError"):
            raise ClientError(f"the server refused partition {key!r} of {partitions}: {result['message'].strip()}")

    def submit(
        self, job: str, tags: dict[str, str], run_config: dict[str, Any] | None = None, assets: Iterable[str] = ()
    ) -> str:
        """Queue a run of `job` (of only `assets` of it, when given) with `tags`; its Dagster run id."""
        selector: dict[str, Any] = {
            "repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": job
        }
        if assets:
            selector["assetSelection"] = [{"path": [asset]} for asset in assets]
        params = {
            "selector": selector,
            "runConfigData": run_config or {},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        result = self.query(_SUBMIT, executionParams=params)["launchPipelineExecution"]
        if result["__typename"] in ("LaunchRunSuccess", "LaunchPipelineRunSuccess"):
            return result["run"]["runId"]
        raise ClientError(f"the server refused the {job} run: {result['__typename']}: {_result_text(result)}")

    def launch_backfill(self, asset: str, partitions: list[str], tags: dict[str, str], run_config: dict) -> str:
        params = {
            "assetSelection": [{"path": [asset]}],
            "partitionNames": partitions,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
            "runConfigData": run_config,
            "title": f"{asset} {partitions[0]}..{partitions[-1]}",
        }
        result = self.query(_BACKFILL, params=params)["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            message = result.get("message") or "; ".join(e["message"] for e in result.get("errors", []))
            raise ClientError(f"the server refused the backfill: {result['__typename']}: {message}")
        return result["backfillId"]

    def terminate(self, dagster_run_id: str, wait_s: float = TERMINATE_WAIT_S) -> None:
        """Terminate a run. Dagster terminates only a queued or started run: one its launcher is still starting is
        asked again until it started (up to WAIT_S); one that ended or is being cancelled meanwhile needs nothing."""
        deadline = time.monotonic() + wait_s
        while True:
            result = self.query(_TERMINATE, runId=dagster_run_id)["terminateRun"]
            if result["__typename"] == "TerminateRunSuccess":
                return
            run = self.run(dagster_run_id)
            if run is not None and (run.finished or run.status == "CANCELING"):
                return
            if run is None or run.status not in _BEING_STARTED or time.monotonic() > deadline:
                raise ClientError(
                    f"the server could not terminate run {dagster_run_id}: {result['__typename']}: "
                    f"{_result_text(result)}"
                )
            time.sleep(0.5)

    # ----- reading ----------------------------------------------------------------------------
    def run(self, dagster_run_id: str) -> DagsterRun | None:
        result = self.query(_RUN, id=dagster_run_id)["runOrError"]
        return _run(result) if result["__typename"] == "Run" else None

    def runs(
        self, tags: dict[str, str] | None = None, statuses: Iterable[str] | None = None, limit: int = 200
    ) -> list[DagsterRun]:
        """Runs matching every tag and any status, newest first."""
        run_filter: dict[str, Any] = {}
        if tags:
            run_filter["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        if statuses:
            run_filter["statuses"] = list(statuses)
        result = self.query(_RUNS, filter=run_filter, limit=limit)["runsOrError"]
        if result["__typename"] != "Runs":
            raise ClientError(f"the server could not list runs: {result.get('message', result['__typename'])}")
        return [_run(r) for r in result["results"]]

    def attempts(self, run_id: str) -> list[DagsterRun]:
        """The training runs of one platform run (its partition), newest first."""
        return [r for r in self.runs(tags={PARTITION_TAG: run_id}) if r.trains]

    def materializations(self, dagster_run_id: str) -> dict[str, dict[str, Any]]:
        """Asset name -> metadata of what the run materialized (the last one of each asset)."""
        result = self.query(_MATERIALIZATIONS, id=dagster_run_id)["runOrError"]
        if result["__typename"] != "Run":
            return {}
        return {
            "/".join(m["assetKey"]["path"]): metadata_values(m["metadataEntries"])
            for m in result["assetMaterializations"]
        }

    def events(self, dagster_run_id: str) -> list[dict[str, Any]]:
        """Every event of the run (the GraphQL objects), in order."""
        events: list[dict[str, Any]] = []
        cursor = None
        while True:
            result = self.query(_EVENTS, id=dagster_run_id, after=cursor)["logsForRun"]
            if result["__typename"] != "EventConnection":
                return events
            events += result["events"]
            cursor = result["cursor"]
            if not result["hasMore"]:
                return events

    def failure(self, dagster_run_id: str) -> Failure:
        """Why the run failed: its first step failure (error, cause, metadata), else the run failure message."""
        events = self.events(dagster_run_id)
        for event in events:
            if event["__typename"] == "ExecutionStepFailureEvent" and event.get("error"):
                entries = (event.get("failureMetadata") or {}).get("metadataEntries") or []
                error = _users_error(event["error"])
                return Failure(_error_text(error), error.get("className"), metadata_values(entries))
        for event in events:
            if event["__typename"] == "RunFailureEvent":
                return Failure((event.get("error") or {}).get("message") or event["message"])
        return Failure("the Dagster run failed; open it in the UI for its logs")

    def check_results(self, dagster_run_id: str) -> list[CheckResult]:
        results = []
        for event in self.events(dagster_run_id):
            if event["__typename"] == "AssetCheckEvaluationEvent":
                evaluation = event["evaluation"]
                results.append(
                    CheckResult(
                        "/".join(evaluation["assetKey"]["path"]),
                        evaluation["checkName"],
                        evaluation["success"],
                        evaluation.get("description") or "",
                        metadata_values(evaluation["metadataEntries"]),
                    )
                )
        return results

    def asset_materializations(
        self, asset: str, partition: str | None, limit: int = 50
    ) -> list[tuple[dict[str, Any], float]]:
        """(metadata, time) of a partition's materializations (every partition's with None), newest first."""
        partitions = [partition] if partition is not None else None
        result = self.query(_ASSET_MATERIALIZATIONS, asset=[asset], partitions=partitions, limit=limit)["assetOrError"]
        if result["__typename"] != "Asset":
            return []
        return [
            (metadata_values(m["metadataEntries"]), float(m["timestamp"]) / 1000)
            for m in result["assetMaterializations"]
        ]

    def check_evaluations(self, asset: str, check: str, limit: int = 100) -> list[CheckResult]:
        """The evaluations of an asset check, every partition's, newest first (executions still running have none)."""
        executions = self.query(_CHECK_EVALUATIONS, asset=[asset], check=check, limit=limit)["assetCheckExecutions"]
        return [
            CheckResult(asset, check, e["success"], e.get("description") or "", metadata_values(e["metadataEntries"]))
            for e in (execution["evaluation"] for execution in executions)
            if e is not None
        ]

    def daemons_down(self) -> list[str]:
        """The daemons the server needs that do not run (the run queue, sensors, schedules, backfills)."""
        statuses = self.query(_DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
        return sorted(d["daemonType"] for d in statuses if d["required"] and not d["healthy"])

    def log_key(self, dagster_run_id: str) -> str | None:
        """The key of the run's captured stdout and stderr (None before its process started)."""
        keys = [e["fileKey"] for e in self.events(dagster_run_id) if e["__typename"] == "LogsCapturedEvent"]
        return keys[0] if keys else None

    def stdout(self, dagster_run_id: str, log_key: str, cursor: str | None = None) -> tuple[str, str | None]:
        """What the run's process wrote to stdout after `cursor` (the worker's log, echoed by the run), and
        the cursor to read on from."""
        logs = self.query(_CAPTURED_LOGS, key=[dagster_run_id, "compute_logs", log_key], cursor=cursor)
        captured = logs["capturedLogs"]
        return captured.get("stdout") or "", captured.get("cursor") or cursor


def _run(raw: dict[str, Any]) -> DagsterRun:
    return DagsterRun(
        id=raw["runId"],
        job=raw["jobName"],
        status=raw["status"],
        tags={t["key"]: t["value"] for t in raw["tags"]},
        created=raw["creationTime"],
        started=raw.get("startTime"),
        ended=raw.get("endTime"),
        assets=tuple("/".join(key["path"]) for key in raw.get("assetSelection") or ()),
    )


def metadata_values(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """GraphQL metadata entries as plain Python values (tables as lists of dicts)."""
    values: dict[str, Any] = {}
    for entry in entries:
        kind = entry["__typename"]
        if kind == "IntMetadataEntry":
            value: Any = int(entry["intRepr"])
        elif kind == "FloatMetadataEntry":
            value = float(entry["floatRepr"])
        elif kind == "JsonMetadataEntry":
            value = json.loads(entry["jsonString"])
        elif kind == "TableMetadataEntry":
            value = [json.loads(record) for record in entry["table"]["records"]]
        elif kind == "TableSchemaMetadataEntry":
            value = {column["name"]: column["type"] for column in entry["schema"]["columns"]}
        else:
            fields = ("text", "boolValue", "mdStr", "path", "url", "timestamp")
            value = next((entry[f] for f in fields if f in entry), None)
        values[entry["label"]] = value
    return values


def _users_error(error: dict[str, Any]) -> dict[str, Any]:
    """The exception the platform's code raised, inside Dagster's step wrapper."""
    cause = error.get("cause")
    if cause and cause.get("message") and (error.get("className") or "").startswith("Dagster"):
        return cause
    return error


def _error_text(error: dict[str, Any]) -> str:
    """`SpecError`s and Failures by their message alone; other exceptions with their type."""
    text = error["message"].strip()
    if error.get("className") in _MESSAGE_ONLY:
        text = text.split(": ", 1)[-1]
    return text


# Errors whose message says everything (see training_platform/errors.py, dg.Failure); others keep their type.
_MESSAGE_ONLY = {"PlatformError", "SpecError", "SnapshotError", "CheckpointError", "LaunchError", "CostError",
                 "BudgetError", "ServerError", "Failure"}


def _result_text(result: dict[str, Any]) -> str:
    """What a mutation's error result says (a message, a step key, or config errors)."""
    if result.get("errors"):
        return "; ".join(error["message"] for error in result["errors"])
    return str(result.get("message") or result.get("invalidStepKey") or result.get("runId") or "").strip()


def _json_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) and ("errors" in body or "data" in body) else None


def _reason(exc: object) -> str:
    """The first line or two of what went wrong."""
    parts = [str(a) for a in getattr(exc, "args", ()) if isinstance(a, str)] or [str(exc)]
    lines = [line for part in parts for line in part.strip().splitlines() if line.strip()]
    return ": ".join(lines[:2])[:400] if lines else type(exc).__name__
