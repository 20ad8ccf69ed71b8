"""Who may run for a team (policy/rights.py), as the run coordinator holds each signed-in request to it, and how the
server knows who asks (server/auth.py's request user, from no other source)."""

from __future__ import annotations

import asyncio
import json

import dagster as dg
import pytest

from training_platform.errors import RightsError, SpecError
from training_platform.identifiers import PLATFORM_USER
from training_platform.paths import PlatformHome
from training_platform.policy.rights import check_may_act_on_run, check_may_run, check_may_run_job
from training_platform.runs.specs import register_run
from training_platform.server import auth
from training_platform.spec import parse_spec
from training_platform.spec.submission import USER_TAG, training_run_config
from training_platform_dagster.run_coordinator import queue_tags_of

TEAMS = """admins: [carol]
teams:
  team-a: {members: [alice]}
  team-b: {members: [bob]}
  team-empty: {}
"""


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    (tmp_path / "teams.yaml").write_text(TEAMS)
    monkeypatch.setenv("TP_TEAMS", str(tmp_path / "teams.yaml"))
    return PlatformHome(tmp_path / "home").ensure()


def _spec(team: str, owner: str):
    return parse_spec({"name": "digits", "team": team, "owner": owner})


def test_a_member_runs_for_their_own_team_as_themselves(home):
    assert check_may_run("alice", _spec("team-a", "alice"), home.root) == "alice"
    with pytest.raises(RightsError, match="alice is not a member of team 'team-b'.*ask carol to add alice") as refused:
        check_may_run("alice", _spec("team-b", "bob"), home.root)
    assert "teams.yaml" in str(refused.value) and "\n" not in str(refused.value)  # one line, naming the file
    with pytest.raises(RightsError, match=r"owner: 'bob' is not you \(alice\)"):
        check_may_run("alice", _spec("team-a", "bob"), home.root)
    with pytest.raises(RightsError, match="alice is not a member of team 'team-empty'"):  # no members: admins only
        check_may_run("alice", _spec("team-empty", "alice"), home.root)
    with pytest.raises(SpecError, match="team: 'nowhere' is not declared"):
        check_may_run("alice", _spec("nowhere", "alice"), home.root)


def test_a_member_continues_a_teammates_run_in_its_owners_name_and_acts_only_on_their_teams_runs(home):
    assert check_may_run("alice", _spec("team-a", "bob"), home.root, continues=True) == "bob"
    with pytest.raises(RightsError, match="alice is not a member of team 'team-b'"):
        check_may_run("alice", _spec("team-b", "bob"), home.root, continues=True)
    check_may_act_on_run("alice", "r1", "team-a", home.root)
    check_may_act_on_run("carol", "r1", "team-b", home.root)
    refused = "alice may not act on run r1: it is a run of team 'team-b'.*ask carol to add alice"
    with pytest.raises(RightsError, match=refused):
        check_may_act_on_run("alice", "r1", "team-b", home.root)
    with pytest.raises(RightsError, match="alice may not act on run r1: it is a run of no team"):
        check_may_act_on_run("alice", "r1", None, home.root)


def test_an_admin_and_the_platform_run_for_any_team_in_the_specs_owners_name(home):
    assert check_may_run("carol", _spec("team-b", "bob"), home.root) == "bob"
    assert check_may_run("carol", _spec("team-empty", "ada"), home.root) == "ada"
    assert check_may_run(PLATFORM_USER, _spec("team-a", "ada"), home.root) == "ada"
    check_may_run_job("carol", "checkpoint_lifecycle_job", home.root)
    with pytest.raises(RightsError, match="alice may not run checkpoint_lifecycle_job: only the platform's admins"):
        check_may_run_job("alice", "checkpoint_lifecycle_job", home.root)


def _training_run(team: str, owner: str, sent: dict[str, str] | None = None) -> dg.DagsterRun:
    """A run as the server gets it, with the tags the client SENT."""
    config = training_run_config(_spec(team, owner))
    tags = {"dagster/partition": "r1", **(sent or {})}
    return dg.DagsterRun(job_name="training_pipeline", run_config=config, tags=tags)


def test_the_coordinator_tags_who_asked_over_what_the_client_sent_and_refuses_what_they_may_not(home):
    tags = queue_tags_of(_training_run("team-a", "alice", {USER_TAG: "bob", "owner": "bob"}), home, "alice")
    assert (tags[USER_TAG], tags["owner"], tags["team"]) == ("alice", "alice", "team-a")
    tags = queue_tags_of(_training_run("team-b", "bob"), home, "carol")
    assert (tags[USER_TAG], tags["owner"]) == ("carol", "bob")
    with pytest.raises(RightsError, match="alice is not a member of team 'team-b'"):
        queue_tags_of(_training_run("team-b", "bob"), home, "alice")
    with pytest.raises(RightsError, match="alice may not run someone_elses_job"):
        queue_tags_of(dg.DagsterRun(job_name="someone_elses_job", tags={"team": "team-a"}), home, "alice")
    # An admin's run of another job queues as the platform's, whatever team and priority the client tagged.
    lifecycle = dg.DagsterRun(job_name="someone_elses_job", tags={"team": "team-b", "dagster/priority": "10"})
    assert queue_tags_of(lifecycle, home, "carol") == {"team": "platform", "dagster/priority": "0", USER_TAG: "carol"}
    # A run that continues a registered one (its spec from the registry, none in the request): its owner stays.
    register_run(home, _spec("team-a", "bob"), "bobs-run")
    resumed = dg.DagsterRun(job_name="training_pipeline", tags={"dagster/partition": "bobs-run"})
    assert queue_tags_of(resumed, home, "alice")["owner"] == "bob"
    with pytest.raises(RightsError, match="owner: 'bob' is not you"):  # a new run in bob's name is not that
        queue_tags_of(_training_run("team-a", "bob"), home, "alice")
    # What the platform starts itself (the daemon: no request) keeps its tags as before, with no user of its own.
    assert USER_TAG not in queue_tags_of(_training_run("team-b", "bob"), home)


async def _app(scope, receive, send):
    body = json.dumps({"user": auth.request_user()}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _get(path: str, token: str) -> tuple[int, dict]:
    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "scheme": "http",
             "headers": [(b"host", b"127.0.0.1:3000"), (b"authorization", f"Bearer {token}".encode())]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(auth.Authenticate(_app, {"tp_alice": "alice"}.get)(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_the_server_knows_who_asks_only_while_it_serves_their_request(monkeypatch):
    assert _get("/graphql", "tp_alice") == (200, {"user": "alice"})  # what the coordinator reads in the request
    assert _get(auth.WHOAMI_PATH, "tp_alice") == (200, {"user": "alice"})
    assert auth.request_user() is None  # outside a request: the platform (the daemon, a run's process)
    monkeypatch.setattr(auth, "_serves_requests", True)  # in the webserver, no request is no one, not the platform
    with pytest.raises(RightsError, match="cannot tell who asked"):
        auth.request_user()


def _post(path: str, user: str, document: str, **variables) -> tuple[int, bytes]:
    """POST a GraphQL request as USER (already signed in: Authenticate's scope) through Authorize; the status and
    what the stand-in app received."""
    from training_platform.server.operations import Authorize

    body = json.dumps({"query": document, "variables": variables}).encode()
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "scheme": "http",
             "headers": [(b"content-type", b"application/json")], auth.USER_SCOPE_KEY: user}
    sent, received = [], []

    async def receive():
        return {"type": "http.request", "body": body[:10], "more_body": True} if not received else \
            {"type": "http.request", "body": body[10:], "more_body": False}

    async def counting_receive():
        message = await receive()
        received.append(message)
        return message

    async def app(scope, receive, send):
        message = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": message["body"]})

    async def send(message):
        sent.append(message)

    teams = {"run-of-a": "team-a", "run-of-b": "team-b"}
    rights = Authorize(app, lambda u: u == "carol", lambda u, run_id: teams.get(run_id) == "team-a" and u == "alice")
    asyncio.run(rights(scope, counting_receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_member_changes_only_their_teams_runs_and_an_admin_anything():
    launch = "mutation { launchRun(executionParams: {}) { __typename } }"
    status, seen = _post("/graphql", "alice", launch)
    assert status == 200 and json.loads(seen)["query"] == launch  # the app gets the body whole, as it was sent
    assert _post("/graphql", "alice", "{ runsOrError { __typename } }")[0] == 200  # reading
    terminate = "mutation($id: String!) { terminateRun(runId: $id) { __typename } }"
    assert _post("/graphql", "alice", terminate, id="run-of-a")[0] == 200
    status, said = _post("/graphql", "alice", terminate, id="run-of-b")
    assert status == 403 and b"alice may not terminateRun run run-of-b" in said
    many = "mutation { terminateRuns(runIds: [\"run-of-a\", \"run-of-b\"]) { __typename } }"
    assert _post("/graphql", "alice", many)[0] == 403  # one run of another team among them is enough
    for admins_only in ("mutation { wipeAssets(assetPartitionRanges: []) { __typename } }",
                        "mutation { stopSensor(id: \"x\") { __typename } }",
                        "query Q { __typename } mutation M { reloadWorkspace { __typename } }",  # any operation in it
                        "mutation { ...F } fragment F on Mutation { reloadWorkspace { __typename } }"):
        status, said = _post("/graphql", "alice", admins_only)
        assert status == 403 and b"only the platform's admins" in said, said
        assert _post("/graphql", "carol", admins_only)[0] == 200
    assert _post("/graphql", "alice", "mutation {")[0] == 403  # what does not parse is not guessed at
    assert _post("/report_asset_materialization/dataset_snapshot", "alice", "")[0] == 403
    assert _post("/report_asset_materialization/dataset_snapshot", "carol", "")[0] == 200
