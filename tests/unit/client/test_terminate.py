"""Terminating a run its launcher is still starting (seen as `tp server stop --force` failing on a busy machine):
Dagster refuses it until the run started, with the answer below; the client asks again until it can."""

from __future__ import annotations

from typing import Any

import pytest

from training_platform.client import graphql
from training_platform.client.graphql import ClientError, PlatformClient

RUN_ID = "88d37c15-9e6a-4f72-8a39-b20c392a681c"


def _refused(status: str) -> dict[str, Any]:
    message = f"Run {RUN_ID} could not be terminated due to having status {status}."
    return {"terminateRun": {"__typename": "TerminateRunFailure", "message": message}}


def _run(status: str) -> dict[str, Any]:
    return {"runOrError": {"__typename": "Run", "runId": RUN_ID, "jobName": "training_job", "status": status,
                           "tags": [], "creationTime": 0.0}}


class ScriptedServer(PlatformClient):
    """The server's answers to terminateRun and runOrError, in order, as Dagster gives them."""

    def __init__(self, statuses: list[str]):
        super().__init__("http://127.0.0.1:1")
        self.statuses, self.asked = statuses, 0

    def query(self, document: str, **variables: Any) -> dict[str, Any]:
        status = self.statuses[0]
        if "terminateRun" in document:
            self.asked += 1
            if status in ("STARTED", "QUEUED"):
                return {"terminateRun": {"__typename": "TerminateRunSuccess", "run": {"runId": RUN_ID}}}
            return _refused(status)
        if len(self.statuses) > 1:
            self.statuses.pop(0)  # the run moves on between two questions
        return _run(status)


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch):
    monkeypatch.setattr(graphql.time, "sleep", lambda _: None)


def test_a_run_being_started_is_terminated_once_it_started():
    server = ScriptedServer(["STARTING", "STARTING", "STARTED"])
    server.terminate(RUN_ID)
    assert server.asked == 3


@pytest.mark.parametrize("status", ["SUCCESS", "FAILURE", "CANCELED", "CANCELING"])
def test_a_run_that_ended_or_is_being_cancelled_meanwhile_needs_nothing(status):
    server = ScriptedServer(["STARTING", status])
    server.terminate(RUN_ID)
    assert server.asked == 2


def test_a_run_still_being_started_after_the_wait_is_an_error_naming_dagsters_reason():
    server = ScriptedServer(["STARTING"])
    with pytest.raises(ClientError, match=r"could not terminate run .*having status STARTING"):
        server.terminate(RUN_ID, wait_s=0)
