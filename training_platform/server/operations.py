"""What a signed-in person may ask of the server, beyond who they are (auth.py): an ASGI middleware behind it.

Dagster's open-source webserver checks no rights, so the platform does, in the server, whoever calls (`tp`, the UI,
a script). The platform's admins (and the server's own identity) may do everything. Anyone else may change only
this, and every other GraphQL mutation or REST call (schedules, sensors, backfills, wipes, code-location reloads,
reported asset events, concurrency limits...) is refused with 403, naming it:

- launch runs: the run coordinator holds each to the user's teams (policy/rights.py);
- terminate or delete a run of one of their teams (the run's `team` tag, which the coordinator set from its spec);
- add a partition key (a new run's name), and the UI's own bookkeeping (telemetry, the onboarding flag).

Reading is not narrowed here yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import Any

from training_platform.server.auth import (
    SAFE_METHODS,
    SIGNOUT_PATH,
    USER_SCOPE_KEY,
    ASGIApp,
    Receive,
    Scope,
    Send,
    refuse,
)

LAUNCHES = frozenset({
    "launchPipelineExecution", "launchRun", "launchMultipleRuns", "launchPipelineReexecution", "launchRunReexecution",
})
# A mutation on runs: the arguments that name them.
ON_RUNS = {
    "terminatePipelineExecution": "runId", "terminateRun": "runId", "terminateRuns": "runIds",
    "deletePipelineRun": "runId", "deleteRun": "runId",
}
MEMBERS_MAY = LAUNCHES | set(ON_RUNS) | {"addDynamicPartition", "logTelemetry", "setNuxSeen"}
MAX_BODY = 1 << 20  # a GraphQL request of the UI or `tp` is a few kilobytes


class Authorize:
    """Serve APP a person's change only when they may make it. `is_admin(user)`; `may_act_on_run(user, run_id)`."""

    def __init__(self, app: ASGIApp, is_admin: Callable[[str], bool], may_act_on_run: Callable[[str, str], bool]):
        self.app = app
        self.is_admin = is_admin
        self.may_act_on_run = may_act_on_run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get(USER_SCOPE_KEY)
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or user is None or self.is_admin(user):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if not path.endswith("/graphql"):
            if path != SIGNOUT_PATH:
                await refuse(scope, send, 403, f"{user} may not {scope['method']} {path}: only the platform's admins")
                return
            await self.app(scope, receive, send)
            return
        body, whole = await _body(receive)
        problem = "the request is too large" if not whole else self._problem(user, body)
        if problem is not None:
            await refuse(scope, send, 403, problem)
            return
        await self.app(scope, _replay(body, receive), send)

    def _problem(self, user: str, body: bytes) -> str | None:
        """Why USER may not make the GraphQL request BODY; None when they may."""
        try:
            request = json.loads(body)
            document, variables = _parse(request["query"]), request.get("variables") or {}
        except (ValueError, KeyError, TypeError):
            return "send one GraphQL request as a JSON object with a `query`"
        for name, arguments in _mutations(document, variables):
            if name not in MEMBERS_MAY:
                return f"{user} may not {name}: only the platform's admins may"
            if name in ON_RUNS:
                named = arguments.get(ON_RUNS[name])
                run_ids = named if isinstance(named, list) else [named]
                for run_id in run_ids:
                    if not isinstance(run_id, str) or not self.may_act_on_run(user, run_id):
                        return f"{user} may not {name} run {run_id}: it is not a run of their teams"
        return None


def _parse(query: object) -> Any:
    from graphql import GraphQLError, parse

    if not isinstance(query, str):
        raise TypeError("query")
    try:
        return parse(query)
    except GraphQLError as exc:  # a syntax error: refused here rather than guessed at
        raise ValueError(str(exc)) from None


def _mutations(document: Any, variables: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each top-level field of each mutation in DOCUMENT (whichever operation the request names: all are checked),
    with its arguments' values. A mutation whose top level is a fragment is reported as one no member may make."""
    from graphql import FieldNode, OperationDefinitionNode, OperationType
    from graphql.utilities import value_from_ast_untyped

    found = []
    for definition in document.definitions:
        if not isinstance(definition, OperationDefinitionNode) or definition.operation == OperationType.QUERY:
            continue
        for selection in definition.selection_set.selections:
            if not isinstance(selection, FieldNode):
                found.append(("send a mutation as a fragment", {}))
                continue
            arguments = {arg.name.value: value_from_ast_untyped(arg.value, variables) for arg in selection.arguments}
            found.append((selection.name.value, arguments))
    return found


async def _body(receive: Receive) -> tuple[bytes, bool]:
    """The request's body, and whether it was read whole (at most MAX_BODY)."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            return b"", False
        if not message.get("more_body"):
            return body, True


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read here, given to the app as it would have received it; then what RECEIVE gets (a disconnect)."""
    sent = False

    async def replayed() -> MutableMapping[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
