"""The lifecycle's settings file and the stores of a home it finds."""

from __future__ import annotations

import json

import pytest

from training_platform.errors import SpecError
from training_platform.lifecycle.settings import LifecycleSettings, load_settings
from training_platform.lifecycle.stores import home_store_uris
from training_platform.paths import PlatformHome


def test_a_home_without_a_settings_file_gets_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("TP_CHECKPOINT_LIFECYCLE", raising=False)
    assert load_settings(tmp_path) == LifecycleSettings()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("grace_hours: -1\n", "grace_hours: Input should be greater than or equal to 0"),
        ("tier_after_days: 0\n", "tier_after_days"),
        ("cold_tiers: {default: /cold, s3://b/p: /cold}\n", "is named for two stores"),
        ("cold_tiers: {default: gs://b/cold}\n", "use a local directory or s3://"),
        ("keep_hot: 2\n", "unknown field"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, monkeypatch, text, names):
    monkeypatch.delenv("TP_CHECKPOINT_LIFECYCLE", raising=False)
    (tmp_path / "checkpoint-lifecycle.yaml").write_text(text)
    with pytest.raises(SpecError, match="checkpoint-lifecycle.yaml") as excinfo:
        load_settings(tmp_path)
    assert names in str(excinfo.value)


def test_the_stores_of_a_home_are_its_own_those_runs_named_and_those_settings_name(tmp_path):
    home = PlatformHome(tmp_path / "home").ensure()
    for run, store in (("a", tmp_path / "team-store"), ("b", None), ("c", tmp_path / "team-store")):
        (home.run_dir(run)).mkdir(parents=True)
        spec = {"checkpoint": {"store_uri": str(store)} if store else {}}
        (home.run_dir(run) / "submitted_spec.json").write_text(json.dumps(spec))
    (home.run_dir("d")).mkdir()
    (home.run_dir("d") / "record.json").write_text("{torn")
    settings = LifecycleSettings(cold_tiers={str(tmp_path / "other"): str(tmp_path / "other-cold")})
    assert home_store_uris(home, settings) == [
        str(home.checkpoints),
        str(tmp_path / "other"),
        str(tmp_path / "team-store"),
    ]
