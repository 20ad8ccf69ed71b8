"""The run registry in the home and in the platform's database (TP_DATABASE_URL): the same answers, a run's spec
written once however many machines register it, run ids checked on the way in, and a database that cannot be
reached named without its password. SQLite here; the team stack's test runs it on PostgreSQL."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest

from training_platform.errors import SharedStateError, SpecError
from training_platform.lifecycle.settings import LifecycleSettings
from training_platform.lifecycle.stores import home_store_uris
from training_platform.paths import PlatformHome
from training_platform.runs.backends import open_run_registry
from training_platform.runs.registry import FileRunRegistry
from training_platform.runs.registry_db import DatabaseRunRegistry
from training_platform.runs.specs import is_registered, load_run_spec, register_run, register_submitted
from training_platform.spec import parse_spec
from training_platform.telemetry.records import load_run_records


def spec(name="r", lr=0.1, store=None):
    checkpoint = {"store_uri": store} if store else {}
    return parse_spec({"name": name, "team": "vision", "owner": "me", "training": {"learning_rate": lr},
                       "checkpoint": checkpoint})


@pytest.fixture
def home(tmp_path) -> PlatformHome:
    return PlatformHome(tmp_path / "home").ensure()


@pytest.fixture(params=["file", "database"])
def deployment(request, home, tmp_path, monkeypatch) -> PlatformHome:
    """A home on the embedded default, or one whose registry is the platform's database."""
    if request.param == "database":
        monkeypatch.setenv("TP_DATABASE_URL", f"sqlite:///{tmp_path / 'platform.db'}")
    else:
        monkeypatch.delenv("TP_DATABASE_URL", raising=False)
    return home


def test_the_setting_picks_where_specs_are(deployment):
    registry = open_run_registry(deployment)
    in_database = isinstance(registry, DatabaseRunRegistry)
    assert in_database != isinstance(registry, FileRunRegistry)
    register_run(deployment, spec(), "r-1")
    assert (deployment.runs / "r-1" / "submitted_spec.json").is_file() != in_database


def test_a_run_keeps_the_spec_it_was_registered_with(deployment):
    assert not is_registered(deployment, "r-1")
    assert register_run(deployment, spec(lr=0.1), "r-1") == "r-1"
    assert register_run(deployment, spec(lr=0.1), "r-1") == "r-1"  # the same spec again: nothing changes
    with pytest.raises(SpecError, match="registered with another spec.*tp resume r-1"):
        register_run(deployment, spec(lr=0.5), "r-1")
    with pytest.raises(SpecError, match="registered with another spec"):
        register_submitted(deployment, "r-1", spec(lr=0.5).model_dump_json())
    assert load_run_spec(deployment, "r-1") == spec(lr=0.1)
    assert is_registered(deployment, "r-1")
    assert register_submitted(deployment, "r-2", spec(name="q").model_dump_json()) == spec(name="q")
    assert sorted(open_run_registry(deployment).specs()) == ["r-1", "r-2"]


def test_an_unknown_run_names_where_the_registry_looked(deployment):
    where = "platform.db" if isinstance(open_run_registry(deployment), DatabaseRunRegistry) else "runs"
    with pytest.raises(SpecError, match=rf"no recorded spec in .*{where}.*tp train SPEC"):
        load_run_spec(deployment, "never-registered")


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "", "x\n", "-rf", "a" * 200])
def test_run_ids_are_checked_on_the_way_in(deployment, run_id):
    with pytest.raises(SpecError, match="is not allowed"):
        register_run(deployment, spec(), run_id)
    with pytest.raises(SpecError, match="is not allowed"):
        load_run_spec(deployment, run_id)
    assert open_run_registry(deployment).specs() == {}


def test_listings_and_stores_read_the_registry(deployment, tmp_path):
    register_run(deployment, spec(store=str(tmp_path / "team-store")), "queued-1")
    records = load_run_records(deployment)
    assert [(r.run_id, r.family, r.status) for r in records] == [("queued-1", "r", "QUEUED")]
    uris = home_store_uris(deployment, LifecycleSettings())
    assert any(uri.endswith("team-store") for uri in uris), uris


def _register(url: str, lr: float, barrier, out) -> None:
    barrier.wait()
    try:
        out.put(DatabaseRunRegistry(url).add("raced", "vision", spec(lr=lr).model_dump_json()))
    except Exception as exc:  # reported to the test, which names it
        out.put(repr(exc))


def test_machines_registering_one_run_at_once_all_find_the_same_spec(tmp_path):
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    DatabaseRunRegistry(url).specs()  # the table exists before the race, as on a deployment that ran before
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(4), context.Queue()
    racers = [context.Process(target=_register, args=(url, 0.1 * (i + 1), barrier, out)) for i in range(4)]
    for process in racers:
        process.start()
    recorded = [out.get(timeout=120) for _ in racers]
    for process in racers:
        process.join(timeout=60)
    assert len(set(recorded)) == 1, recorded  # one spec won, and every racer was told which
    assert DatabaseRunRegistry(url).specs() == {"raced": recorded[0]}


def test_an_unreachable_database_is_named_without_its_password(home, monkeypatch):
    monkeypatch.setenv("TP_DATABASE_URL", "postgresql+psycopg2://tp:s3cret-pw@127.0.0.1:1/platform")
    with pytest.raises(SharedStateError, match=r"run registry in the platform's database .*127\.0\.0\.1:1") as caught:
        load_run_spec(home, "r-1")
    assert "s3cret-pw" not in str(caught.value)


def test_a_sweep_trials_context_is_registered_with_its_run(deployment):
    from training_platform.sweeps import TrialContext

    context = TrialContext(sweep="s", storage="sqlite:///x.db", trial_id=7, trial_number=3, metric="val_accuracy",
                           direction="maximize", pruner={"type": "none"})
    register_run(deployment, spec(), "s-t003", trial=dataclasses.asdict(context))
    register_run(deployment, spec(), "plain")
    assert TrialContext.read(deployment, "s-t003") == context
    assert TrialContext.read(deployment, "plain") is None
