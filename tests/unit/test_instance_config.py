"""The instance config tp server start writes: the shipped queue, on SQLite in the Dagster home (with connections
kept open), on PostgreSQL when TP_DAGSTER_DATABASE_URL is set."""

import dagster as dg
import pytest
import yaml

from training_platform.server.local import DATABASE_ENV, ServerError, instance_config
from training_platform.shipped import INSTANCE_CONFIG


def test_without_a_database_the_instance_is_the_shipped_queue_on_sqlite_with_kept_connections(tmp_path, monkeypatch):
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    home = tmp_path / "a home: with 'quotes' and spaces"
    text = instance_config(home)
    assert text.startswith(INSTANCE_CONFIG.read_text())
    config = yaml.safe_load(text)
    for key, cls in (("run_storage", "RunStorage"), ("event_log_storage", "EventLogStorage"),
                     ("schedule_storage", "ScheduleStorage")):
        assert config[key] == {"module": "training_platform_dagster.sqlite_storage", "class": cls,
                               "config": {"base_dir": str(home)}}


def test_a_database_url_puts_every_storage_on_postgres_and_keeps_the_password_out_of_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DATABASE_ENV, "postgresql+psycopg2://tp:s3cret-pw@127.0.0.1:5432/dagster")
    text = instance_config(tmp_path)
    config = yaml.safe_load(text)
    for key, cls in (("run_storage", "RunStorage"), ("event_log_storage", "EventLogStorage"),
                     ("schedule_storage", "ScheduleStorage")):
        assert config[key] == {"module": "training_platform_dagster.postgres_storage", "class": cls,
                               "config": {"postgres_url": {"env": DATABASE_ENV}}}
    assert config["run_coordinator"] == yaml.safe_load(INSTANCE_CONFIG.read_text())["run_coordinator"]
    assert "s3cret-pw" not in text


@pytest.mark.parametrize("url", ["postgresql://tp:pw@h/db", "postgres://tp:pw@h/db", "sqlite:///x.db"])
def test_a_url_dagster_cannot_use_is_refused_naming_the_scheme_to_write(tmp_path, monkeypatch, url):
    monkeypatch.setenv(DATABASE_ENV, url)
    with pytest.raises(ServerError, match=r"postgresql\+psycopg2://") as refused:
        instance_config(tmp_path)
    assert "pw@" not in str(refused.value)  # the message never repeats the password


def test_the_shipped_instance_shows_no_onboarding_dialog(tmp_path, monkeypatch):
    """Dagster's "Join the Dagster community" dialog (asking for an e-mail address) stays off a team's UI."""
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    (tmp_path / "dagster.yaml").write_text(instance_config(tmp_path))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.nux_enabled is False
