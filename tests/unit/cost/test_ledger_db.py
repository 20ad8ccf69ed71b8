"""The cost ledger in the platform's database (TP_DATABASE_URL): the same answers as the file ledger, each charge
written once by settlers racing in several processes, and a database that cannot be reached named without its
password. SQLite here; the team stack's test runs it on PostgreSQL."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta

import pytest

from training_platform.cost import BudgetError, CostError, check_budget, run_cost
from training_platform.cost.accounting import CostLedger
from training_platform.cost.backends import open_ledger
from training_platform.cost.ledger_db import DatabaseLedger
from training_platform.spec import parse_spec

NIGHT = datetime(2026, 11, 24, 4, tzinfo=UTC)


def spec(team="vision"):
    return parse_spec({
        "name": "r", "team": team, "owner": "me",
        "resources": {"nodes": 1, "procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100", "spot": True},
    })


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'platform.db'}"


def _rows(n: int, team: str = "a", sweep: str | None = None) -> list[dict]:
    costs = [run_cost(spec(team=team), f"{team}-r{i}", 360 * (i + 1), sweep=sweep, ended=NIGHT) for i in range(n)]
    return [{"key": f"{c.run_id}#1", "kind": "attempt", **vars(c)} for c in costs]


def test_the_database_ledger_answers_as_the_file_ledger_does(url, tmp_path):
    rows = _rows(3, "a", sweep="s1") + _rows(2, "b")
    on_disk, in_db = CostLedger(tmp_path / "cost"), DatabaseLedger(url)
    for ledger in (on_disk, in_db):
        assert ledger.record_once(rows) == rows
        assert ledger.record_once(rows + rows[:1]) == []  # each charge once, however often it is settled
    assert in_db.records() == on_disk.records() == rows  # in the order they were charged
    assert in_db.records(team="b", run="b-r1") == rows[4:]
    assert in_db.records(sweep="s1") == rows[:3]
    assert in_db.records(since=NIGHT + timedelta(seconds=1)) == []
    assert in_db.keys() == on_disk.keys() and in_db.totals("team") == on_disk.totals("team")
    assert in_db.spend("a", NIGHT - timedelta(days=1)) == pytest.approx(on_disk.spend("a", NIGHT - timedelta(days=1)))


def _settle(url: str, rows: list[dict], barrier, out) -> None:
    barrier.wait()
    out.put(len(DatabaseLedger(url).record_once(rows)))


def test_settlers_racing_in_four_processes_write_each_charge_once(url):
    rows = _rows(6)
    DatabaseLedger(url).records()  # the table exists before the race, as on a deployment that ran before
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(4), context.Queue()
    settlers = [context.Process(target=_settle, args=(url, rows[i % 3 :], barrier, out)) for i in range(4)]
    for process in settlers:
        process.start()
    written = [out.get(timeout=120) for _ in settlers]
    for process in settlers:
        process.join(timeout=60)
    assert sum(written) == len(rows)
    assert sorted(row["key"] for row in DatabaseLedger(url).records()) == sorted(row["key"] for row in rows)


def test_the_setting_picks_the_database_and_budgets_read_it(url, tmp_path, monkeypatch):
    monkeypatch.setenv("TP_DATABASE_URL", url)
    (tmp_path / "teams.yaml").write_text("teams:\n  a: {monthly_usd: 10}\n")
    monkeypatch.delenv("TP_TEAMS", raising=False)
    ledger = open_ledger(tmp_path)
    assert isinstance(ledger, DatabaseLedger)
    rows = _rows(1)
    rows[0] |= {"at": datetime.now(UTC).isoformat(), "total_usd": 25.0}
    ledger.record_once(rows)
    with pytest.raises(BudgetError, match=r"\$25.00"):
        check_budget(tmp_path, "a", 0.0)
    assert not (tmp_path / "cost").exists()  # nothing in the home


def test_a_database_that_cannot_be_reached_is_named_without_its_password():
    ledger = DatabaseLedger("postgresql+psycopg2://tp:s3cret-pw@127.0.0.1:1/platform")
    with pytest.raises(CostError) as failed:
        ledger.records()
    message = str(failed.value)
    assert "TP_DATABASE_URL" in message and "127.0.0.1:1/platform" in message and "s3cret-pw" not in message
