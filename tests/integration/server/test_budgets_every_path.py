"""Over budget, every path is refused with the figures: a run submitted straight to the server (as the UI's
Launchpad does, with no `tp` check before it), its resume, and a retrain. The training asset refuses before
it launches anything; nothing trains. On the test worker's shared server (tests/fixtures/platform.py), where a team
of the module's own has spent $1.50 of its $1 budget this month: the module costs two short Dagster runs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tests.fixtures.platform import ROOT, last_json, server_logs
from training_platform.client.runs import wait_for
from training_platform.cost.backends import open_ledger
from training_platform.datasets import build_snapshot
from training_platform.policy.teams import TEAMS_ENV
from training_platform.runs.specs import spec_tags
from training_platform.spec import parse_spec
from training_platform.spec.submission import PARTITION_TAG, RESUME_TAG, TRAINING_JOB, training_run_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TEAM = "spent-team"  # the module's own team on the shared server
SPENT = {"key": "spent-earlier#1", "kind": "attempt", "run_id": "spent-earlier", "team": TEAM, "sweep": None,
         "total_usd": 1.5, "compute_usd": 1.5}
FIGURES = (f"team '{TEAM}' is over its monthly budget: spent $1.50 of $1.00", "this submission is estimated at $",
           f"Raise teams.{TEAM}.monthly_usd in")
LAUNCHED = {"spec.json", "pipes-messages.jsonl", "worker.log", "events.jsonl"}  # what a launch writes


@pytest.fixture(scope="module", autouse=True)
def spent_team(platform):
    """The module's team, declared in the shared server's teams file for the module with a $1 budget, and $1.50 spent
    this month in its ledger (the server reads both at each submission)."""
    teams_file = Path(platform.env[TEAMS_ENV])
    declared = teams_file.read_text()
    teams = yaml.safe_load(declared)
    teams["teams"][TEAM] = {"monthly_usd": 1}
    teams_file.write_text(yaml.safe_dump(teams))
    open_ledger(platform.home).record_once([SPENT | {"at": datetime.now(UTC).isoformat()}])
    yield TEAM
    teams_file.write_text(declared)


@pytest.fixture(scope="module")
def ui_launch(platform):
    """A run submitted to the server directly (no `tp train` before it) and how it ended."""
    snapshot = build_snapshot("sklearn_digits", platform.home / "snapshots").snapshot_id
    spec = parse_spec({"name": "from-ui", "team": TEAM, "owner": "ci", "dataset": {"snapshot_id": snapshot}})
    client = platform.client()
    client.add_partition("from-ui-1")
    dagster_run_id = client.submit(TRAINING_JOB, tags=spec_tags(spec) | {PARTITION_TAG: "from-ui-1"},
                                   run_config=training_run_config(spec), assets=["training_run"])
    return client, wait_for(client, dagster_run_id)


def _refused_before_launch(platform, message: str) -> None:
    for figure in (*FIGURES, "nothing was launched"):
        assert figure in message, message
    launched = {p.name for p in (platform.home / "runs" / "from-ui-1").iterdir()}
    assert not launched & LAUNCHED, launched


def test_a_run_launched_from_the_ui_over_budget_fails_with_the_figures_and_launches_nothing(platform, ui_launch):
    client, run = ui_launch
    assert run.status == "FAILURE", server_logs(platform.home)
    failure = client.failure(run.id)
    assert failure.error_class == "BudgetError"
    _refused_before_launch(platform, failure.message)


def test_its_resume_is_refused_the_same_way_and_not_retried(platform, ui_launch):
    client, _ = ui_launch
    proc = platform.tp("resume", "from-ui-1", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    outcome = last_json(proc)
    assert outcome["status"] == "FAILED"
    _refused_before_launch(platform, outcome["error"])
    attempts = client.attempts("from-ui-1")
    assert len(attempts) == 2 and RESUME_TAG in max(attempts, key=lambda r: r.created).tags  # no retry queued


def test_a_retrain_over_budget_is_refused_before_anything_is_queued(platform, tmp_path):
    spec = yaml.safe_load((ROOT / "examples" / "digits-daily.yaml").read_text()) | {"team": TEAM}
    (tmp_path / "daily.yaml").write_text(yaml.safe_dump(spec))
    client = platform.client()
    before = len(client.runs())
    proc = platform.tp("retrain", "--from", "2026-01-01", "--to", "2026-01-03", "--spec", str(tmp_path / "daily.yaml"),
                       "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    refusal = last_json(proc)
    assert refusal["status"] == "REFUSED"
    for figure in (*FIGURES, "3 day(s) x 300 steps", "nothing was queued"):
        assert figure in refusal["error"], refusal["error"]
    assert len(client.runs()) == before
