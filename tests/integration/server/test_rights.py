"""Who may run for a team, checked in the server whoever calls (issue 63, slice 2): a member runs only for their own
teams and as themselves, an admin for any team, and only an admin runs the platform's other jobs; a member cannot
terminate or delete another team's run, nor wipe assets or report a snapshot. `tp` refuses in
one line with nothing created; the same run sent straight over GraphQL with the member's token is failed by the
server before it is queued, and nothing of it trains. On the test worker's shared server (tests/fixtures/platform.py),
with two teams and three users of the module's own."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.fixtures.platform import last_json, server_logs
from training_platform.client.graphql import ClientError, DagsterRun, ForbiddenError, PlatformClient
from training_platform.client.runs import wait_for
from training_platform.datasets import build_snapshot
from training_platform.policy.teams import TEAMS_ENV
from training_platform.runs.specs import spec_tags
from training_platform.server.tokens import TokenStore
from training_platform.spec import parse_spec
from training_platform.spec.submission import PARTITION_TAG, TRAINING_JOB, USER_TAG, training_run_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TEAM_A, TEAM_B = "rights-a", "rights-b"  # alice's team and bob's; carol is an admin
LAUNCHED = {"spec.json", "pipes-messages.jsonl", "worker.log", "events.jsonl"}  # what a launch writes


@pytest.fixture(scope="module", autouse=True)
def two_teams(platform):
    """The module's teams and admin in the shared server's teams file (read at each submission), for the module."""
    teams_file = Path(platform.env[TEAMS_ENV])
    declared = teams_file.read_text()
    teams = yaml.safe_load(declared)
    teams["teams"] |= {TEAM_A: {"members": ["alice"]}, TEAM_B: {"members": ["bob"]}}
    teams["admins"] = ["carol"]
    teams_file.write_text(yaml.safe_dump(teams))
    yield
    teams_file.write_text(declared)


@pytest.fixture(scope="module")
def tokens(platform) -> dict[str, str]:
    store = TokenStore(platform.home)
    made = {user: store.create(user, label="test_rights") for user in ("alice", "carol")}
    yield made
    for user in made:
        store.revoke(user)


@pytest.fixture(scope="module")
def snapshot(platform) -> str:
    return build_snapshot("sklearn_digits", platform.home / "snapshots").snapshot_id


def _spec(name: str, team: str, owner: str, snapshot: str):
    return parse_spec({"name": name, "team": team, "owner": owner, "dataset": {"snapshot_id": snapshot},
                       "training": {"max_steps": 5, "log_every": 5}, "resources": {"procs_per_node": 1}})


def _submit(client: PlatformClient, spec, run_id: str, **tags: str) -> str:
    client.add_partition(run_id)
    return client.submit(TRAINING_JOB, tags=spec_tags(spec) | {PARTITION_TAG: run_id, **tags},
                         run_config=training_run_config(spec), assets=["training_run"])


def test_tp_refuses_a_run_for_another_team_in_one_line_and_creates_nothing(platform, tokens, snapshot, tmp_path):
    spec = _spec("alice-for-b", TEAM_B, "bob", snapshot).model_dump(mode="json")  # bob's team, in bob's name
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    before = len(platform.client().runs())
    proc = platform.tp("train", str(tmp_path / "spec.yaml"), "--json", TP_TOKEN=tokens["alice"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"alice is not a member of team '{TEAM_B}'" in errors[0], proc.stderr
    assert "ask carol to add alice" in errors[0]  # who can add them
    assert last_json(proc)["status"] == "REFUSED"
    assert len(platform.client().runs()) == before


def test_the_server_refuses_it_over_graphql_with_the_members_token_and_nothing_trains(platform, tokens, snapshot):
    alice = PlatformClient(platform.url, token=tokens["alice"])
    with pytest.raises(ClientError, match=f"alice is not a member of team '{TEAM_B}'"):
        _submit(alice, _spec("alice-for-b", TEAM_B, "alice", snapshot), "alice-for-b-1")
    refused = [run for run in platform.client().runs() if run.tags.get(PARTITION_TAG) == "alice-for-b-1"]
    assert [run.status for run in refused] == ["FAILURE"], refused  # failed before it was queued
    run_dir = platform.home / "runs" / "alice-for-b-1"
    assert not run_dir.exists() or not {p.name for p in run_dir.iterdir()} & LAUNCHED
    with pytest.raises(ClientError, match="owner: 'bob' is not you \\(alice\\)"):  # her team, in another's name
        _submit(alice, _spec("alice-as-bob", TEAM_A, "bob", snapshot), "alice-as-bob-1")


def test_a_members_run_is_tagged_with_who_asked_whatever_the_client_sent(platform, tokens, snapshot):
    alice = PlatformClient(platform.url, token=tokens["alice"])
    dagster_run_id = _submit(alice, _spec("alice-own", TEAM_A, "alice", snapshot), "alice-own-1", **{USER_TAG: "bob"})
    run = wait_for(platform.client(), dagster_run_id)
    assert run.status == "SUCCESS", server_logs(platform.home)
    assert (run.tags[USER_TAG], run.tags["owner"], run.tags["team"]) == ("alice", "alice", TEAM_A)


@pytest.fixture(scope="module")
def carols_run_for_b(platform, tokens, snapshot) -> DagsterRun:
    """A run of team-b, which carol (an admin) ran in bob's name."""
    carol = PlatformClient(platform.url, token=tokens["carol"])
    dagster_run_id = _submit(carol, _spec("carol-for-b", TEAM_B, "bob", snapshot), "carol-for-b-1")
    return wait_for(platform.client(), dagster_run_id)


def test_an_admin_runs_for_any_team_in_its_members_name_and_only_admins_run_other_jobs(platform, tokens,
                                                                                       carols_run_for_b):
    run = carols_run_for_b
    assert run.status == "SUCCESS", server_logs(platform.home)
    assert (run.tags[USER_TAG], run.tags["owner"], run.tags["team"]) == ("carol", "bob", TEAM_B)
    alice = PlatformClient(platform.url, token=tokens["alice"])
    with pytest.raises(ClientError, match="alice may not run checkpoint_lifecycle_job: only the platform's admins"):
        alice.submit("checkpoint_lifecycle_job", tags={"team": TEAM_A})


def test_a_member_cannot_touch_another_teams_run_nor_the_platforms_own_switches(platform, tokens, carols_run_for_b):
    alice = PlatformClient(platform.url, token=tokens["alice"])
    with pytest.raises(ForbiddenError, match=f"alice may not terminateRun run {carols_run_for_b.id}: it is not a run"):
        alice.terminate(carols_run_for_b.id)
    with pytest.raises(ForbiddenError, match=f"alice may not deleteRun run {carols_run_for_b.id}: it is not a run"):
        alice.query("mutation($id: String!) { deleteRun(runId: $id) { __typename } }", id=carols_run_for_b.id)
    assert platform.client().run(carols_run_for_b.id) is not None  # still there
    for command in ("cancel", "resume", "reproduce"):  # `tp` says so in one line, before anything else
        proc = platform.tp(command, "carol-for-b-1", TP_TOKEN=tokens["alice"])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
        assert f"alice may not act on run carol-for-b-1: it is a run of team '{TEAM_B}'" in errors[0], errors
    with pytest.raises(ForbiddenError, match="alice may not wipeAssets: only the platform's admins"):
        alice.query("mutation { wipeAssets(assetPartitionRanges: []) { __typename } }")
    # A reported materialization could make a run train on a snapshot of anyone's choosing: admins only.
    request = urllib.request.Request(
        f"{platform.url}/report_asset_materialization/dataset_snapshot", method="POST",
        data=json.dumps({"metadata": {"expectations_passed": True}}).encode(),
        headers={"Authorization": f"Bearer {tokens['alice']}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403 and b"only the platform's admins" in refused.value.read()
