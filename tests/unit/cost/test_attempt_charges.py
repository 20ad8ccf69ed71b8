"""Every attempt charged once from the run's event log; badput and goodput apart; estimates never $0."""

import json
import threading
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from training_platform.cli.main import app
from training_platform.cost import BudgetError, CostLedger, check_run_budget, estimate_run, load_price_model
from training_platform.cost.attempts import attempt_spans, resume_step
from training_platform.cost.budgets import DEFAULT_SECONDS_PER_STEP
from training_platform.cost.charges import charge, run_money, settle
from training_platform.spec import parse_spec

T0 = datetime(2026, 11, 24, 4, tzinfo=UTC).timestamp()  # Tuesday 04:00 UTC


def spec(**overrides):
    data = {"name": "r", "team": "vision", "owner": "me", "training": {"max_steps": 100},
            "resources": {"nodes": 1, "procs_per_node": 2}} | overrides
    return parse_spec(data)


def ev(kind, at, **fields):
    return {"kind": kind, "at": T0 + at, **fields}


# Two Dagster runs: the first preempted on spot (emergency checkpoint at 27); the second on on-demand,
# where a rank dies at step 55 (last checkpoint 40) and torchrun restarts the group, which finishes.
PREEMPTED_TWICE = [
    ev("submitted", 0, backend="local", job_id="1:x", dagster_run_id="d1", spot=True), ev("job_running", 0.5),
    ev("started", 2), ev("first_step", 4), ev("progress", 6, step=10), ev("checkpoint", 8, step=20),
    ev("progress", 9, step=25), ev("checkpoint", 10, step=27), ev("preempted", 10, step=27),
    ev("job_ended", 11, state="PREEMPTED"),
    ev("submitted", 20, backend="local", job_id="2:x", dagster_run_id="d2", spot=False), ev("job_running", 20.5),
    ev("started", 22), ev("resumed", 23, step=27), ev("first_step", 24), ev("checkpoint", 30, step=40),
    ev("progress", 38, step=55),
    ev("started", 40, restarts=1), ev("resumed", 41, step=40), ev("first_step", 42), ev("progress", 60, step=100),
    ev("finished", 60, step=100), ev("job_ended", 61, state="SUCCEEDED"),
]


def test_a_run_preempted_twice_has_three_attempts_with_their_capacity_outcome_and_lost_steps():
    first, second, third = attempt_spans(PREEMPTED_TWICE)
    assert [s.outcome for s in (first, second, third)] == ["preempted", "killed", "succeeded"]
    assert [s.spot for s in (first, second, third)] == [True, False, False]
    # From when each job was seen running; the restart within the allocation is the killed attempt's time.
    assert [s.wall_seconds for s in (first, second, third)] == pytest.approx([11 - 0.5, 40 - 20.5, 61 - 40])
    assert [s.lost_steps for s in (first, second, third)] == [0, 15, 0]  # 55 reached, 40 kept
    assert second.lost_seconds == pytest.approx((38 - 24) * 15 / 28)  # its stepping time x the share lost
    assert third.useful_seconds == pytest.approx(60 - 42)
    assert resume_step(PREEMPTED_TWICE[:16]) == 40


def test_an_attempt_is_charged_only_once_closed_and_ends_when_its_job_was_seen_to_end():
    running = PREEMPTED_TWICE[:4]
    (open_span,) = attempt_spans(running)
    assert not open_span.closed and open_span.outcome == "running"
    cancelled = [*running, ev("job_ended", 7, state="CANCELLED"), ev("preempted", 12, step=12)]  # ranks leave late
    (span,) = attempt_spans(cancelled)
    assert (span.outcome, span.wall_seconds) == ("cancelled", 7 - 0.5)
    never_started = [ev("submitted", 0, spot=False), ev("job_running", 1), ev("job_ended", 3, state="FAILED")]
    (span,) = attempt_spans(never_started)
    assert (span.outcome, span.wall_seconds, span.steps) == ("failed", 2, 0)
    (span,) = attempt_spans([never_started[0], never_started[2]])  # cancelled while queued: it held nothing
    assert span.wall_seconds == 0


def test_a_requeued_job_waiting_in_the_queue_is_not_charged():
    requeued = [
        ev("submitted", 0, spot=True), ev("job_running", 5), ev("started", 7), ev("first_step", 8),
        ev("checkpoint", 9, step=10), ev("preempted", 10, step=10), ev("job_running", 130, again=True),
        ev("started", 132), ev("resumed", 133, step=10), ev("first_step", 133), ev("finished", 150, step=50),
        ev("job_ended", 151, state="SUCCEEDED"),
    ]
    first, second = attempt_spans(requeued)
    assert (first.outcome, first.wall_seconds) == ("preempted", 10 - 5)  # ended with its last event
    assert (second.outcome, second.wall_seconds, second.start_step) == ("succeeded", 151 - 130, 10)


def test_an_attempt_after_the_job_moved_to_on_demand_is_priced_on_demand():
    moved = [
        ev("submitted", 0, spot=True), ev("job_running", 5), ev("started", 7), ev("preempted", 10, step=0),
        ev("moved_to_on_demand", 40, reason="requeued twice"), ev("job_running", 60, again=True),
        ev("started", 62), ev("finished", 80, step=50), ev("job_ended", 81, state="SUCCEEDED"),
    ]
    assert [span.spot for span in attempt_spans(moved)] == [True, False]


def test_each_attempt_is_priced_at_its_wall_time_units_and_capacity():
    model = load_price_model()
    run = spec()
    first, second, _ = (charge(s, run, "r1", model=model) for s in attempt_spans(PREEMPTED_TWICE))
    cpu = model.base_price(None, spot=False)
    assert second["compute_usd"] == pytest.approx(19.5 / 3600 * 2 * cpu) and second["capacity"] == "on_demand"
    spot_price = model.price_at(None, True, datetime.fromtimestamp(T0, UTC))
    assert first["compute_usd"] == pytest.approx(10.5 / 3600 * 2 * spot_price) and first["capacity"] == "spot"
    assert second["lost_work_usd"] == pytest.approx(second["compute_usd"] * second["lost_seconds"] / 19.5)
    assert second["lost_work_usd"] > 0 and second["badput_usd"] > second["lost_work_usd"]  # restart time is badput
    assert first["lost_work_usd"] == 0 and first["badput_usd"] > 0  # the emergency checkpoint kept every step


def _settled_home(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in PREEMPTED_TWICE))
    return run_dir


def test_settling_twice_or_by_many_settlers_at_once_charges_each_attempt_once(tmp_path):
    run_dir = _settled_home(tmp_path)
    threads = [threading.Thread(target=settle, args=(tmp_path, run_dir, "r1", spec())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert settle(tmp_path, run_dir, "r1", spec()) == []
    rows = CostLedger(tmp_path / "cost").records(run="r1")
    assert sorted(r["key"] for r in rows) == ["r1#1", "r1#2", "r1#3"]
    money = run_money(tmp_path, "r1")
    assert money["attempts"] == 3 and money["cost_total_usd"] == pytest.approx(sum(r["total_usd"] for r in rows))
    assert 0 < money["goodput"] < 1


def test_the_cost_report_total_is_every_attempts_wall_time_times_price(tmp_path, monkeypatch):
    _settled_home(tmp_path)
    settle(tmp_path, tmp_path / "runs" / "r1", "r1", spec())
    monkeypatch.setenv("TP_HOME", str(tmp_path))
    rows = CostLedger(tmp_path / "cost").records()
    expected = sum(r["wall_seconds"] / 3600 * r["units"] * r["usd_per_unit_hour"] for r in rows)
    for by in ("team", "run", "day"):
        done = CliRunner().invoke(app, ["cost", "report", "--by", by, "--since", "2026-11-01", "--json"])
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["total"]["compute_usd"] == pytest.approx(expected)
        assert report["total"]["attempts"] == 3
    assert set(report["totals"]) == {"2026-11-24"}


def test_an_estimate_is_never_zero_and_learns_the_step_time_of_earlier_runs(tmp_path):
    cpu = load_price_model().base_price(None, spot=False)
    fresh = estimate_run(spec(), tmp_path)
    assert fresh.usd == pytest.approx(100 * DEFAULT_SECONDS_PER_STEP / 3600 * 2 * cpu) and "default" in fresh.basis
    settle(tmp_path, _settled_home(tmp_path), "r1", spec())
    rows = CostLedger(tmp_path / "cost").records()
    per_step = sum(r["wall_seconds"] for r in rows) / sum(r["steps"] - r["lost_steps"] for r in rows)
    measured = estimate_run(spec(training={"max_steps": 1000, "seed": 7}), tmp_path)  # same shape, longer
    assert measured.usd == pytest.approx(1000 * per_step / 3600 * 2 * cpu) and "this spec" in measured.basis
    wider = estimate_run(spec(training={"max_steps": 1000, "batch_size": 64}), tmp_path)
    assert "template digits_mlp:small" in wider.basis  # another shape of the same template
    resumed = estimate_run(spec(training={"max_steps": 1000, "seed": 7}), tmp_path, from_step=900)
    assert resumed.usd == pytest.approx(measured.usd / 10)


def test_a_run_over_budget_is_refused_with_spend_budget_estimate_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("TP_TEAMS")
    (tmp_path / "teams.yaml").write_text("teams:\n  vision: {monthly_usd: 1}\n")
    CostLedger(tmp_path / "cost").record_once([{"key": "old#1", "kind": "attempt", "run_id": "old", "team": "vision",
                                                "at": datetime.now(UTC).isoformat(), "total_usd": 0.99}])
    with pytest.raises(BudgetError) as refused:  # 1000 CPU steps at the default rate: $0.03, over what is left
        check_run_budget(spec(training={"max_steps": 1000}), tmp_path, stage="launched")
    message = str(refused.value)
    for figure in ("spent $0.99 of $1.00", "estimated at $0.03: 1000 steps x 1 s/step", "nothing was launched",
                   "Raise teams.vision.monthly_usd", "lower training.max_steps"):
        assert figure in message
    assert check_run_budget(spec(training={"max_steps": 1}), tmp_path).allowed  # a step fits what is left


def test_the_cost_report_piped_to_a_file_keeps_every_column_whole(tmp_path, monkeypatch):
    """Not a terminal (a pipe, a log): the table is not squeezed into 80 columns with its headers and ids elided."""
    _settled_home(tmp_path)
    settle(tmp_path, tmp_path / "runs" / "r1", "r1", spec())
    monkeypatch.setenv("TP_HOME", str(tmp_path))
    done = CliRunner().invoke(app, ["cost", "report", "--by", "run", "--since", "2026-11-01"])
    assert done.exit_code == 0, done.output
    assert "…" not in done.output, done.output
    for header in ("attempts", "accel-hours", "compute $", "badput $", "lost work $", "storage $", "goodput"):
        assert header in done.output, done.output
