"""Over budget, every path is refused with the figures: a run submitted straight to the server (as the UI's
Launchpad does, with no `tp` check before it), its resume, and a retrain. The training asset refuses before
it launches anything; nothing trains, so the module costs one server start and two short Dagster runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.fixtures.platform import last_json, running_platform, server_logs
from training_platform.client import PlatformClient
from training_platform.client.runs import wait_for
from training_platform.datasets import build_snapshot
from training_platform.runs import spec_tags
from training_platform.spec import parse_spec
from training_platform.submission import PARTITION_TAG, RESUME_TAG, TRAINING_JOB, training_run_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SPENT = {"key": "earlier#1", "kind": "attempt", "run_id": "earlier", "team": "ml-platform", "sweep": None,
         "total_usd": 1.5, "compute_usd": 1.5}
FIGURES = ("team 'ml-platform' is over its monthly budget: spent $1.50 of $1.00", "this submission is estimated at $",
           "Raise teams.ml-platform.monthly_usd in")
LAUNCHED = {"spec.json", "pipes-messages.jsonl", "worker.log", "events.jsonl"}  # what a launch writes


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """A server whose team has spent $1.50 of its $1 budget this month."""
    home = tmp_path_factory.mktemp("tp-home")
    (home / "teams.yaml").write_text("teams:\n  ml-platform: {monthly_usd: 1}\n")
    (home / "cost").mkdir()
    (home / "cost" / "ledger.jsonl").write_text(json.dumps(SPENT | {"at": datetime.now(UTC).isoformat()}) + "\n")
    with running_platform(home, TP_TEAMS=str(home / "teams.yaml")) as running:
        yield running


@pytest.fixture(scope="module")
def ui_launch(platform):
    """A run submitted to the server directly (no `tp train` before it) and how it ended."""
    snapshot = build_snapshot("sklearn_digits", platform.home / "snapshots").snapshot_id
    spec = parse_spec({"name": "from-ui", "team": "ml-platform", "owner": "ci", "dataset": {"snapshot_id": snapshot}})
    client = PlatformClient(platform.url)
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


def test_a_retrain_over_budget_is_refused_before_anything_is_queued(platform):
    client = PlatformClient(platform.url)
    before = len(client.runs())
    proc = platform.tp("retrain", "--from", "2026-01-01", "--to", "2026-01-03", "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    refusal = last_json(proc)
    assert refusal["status"] == "REFUSED"
    for figure in (*FIGURES, "3 day(s) x 300 steps", "nothing was queued"):
        assert figure in refusal["error"], refusal["error"]
    assert len(client.runs()) == before
