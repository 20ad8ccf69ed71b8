"""Which frameworks a run's ranks import past torch, and the standby that loaded them (launch/frameworks.py)."""

import hashlib

import pytest

from training_platform.launch import RunRequest, standby
from training_platform.launch.frameworks import PRELOAD_ENV, frameworks_of, named
from training_platform.launch.local import LocalLauncher
from training_platform.spec import ScriptCode, parse_spec

LIGHTNING_SCRIPT = "import os\nimport lightning as L\nfrom transformers.trainer import Trainer\n"


def _spec(strategy: str = "ddp", script: str | None = None):
    raw = {"name": "r", "team": "t", "owner": "o", "strategy": strategy}
    if script is not None:
        code = ScriptCode(sha256=hashlib.sha256(script.encode()).hexdigest(), text=script)
        raw["entrypoint"] = {"script": "/code/train.py", "code": code.model_dump()}
    return parse_spec(raw)


@pytest.mark.parametrize(
    ("strategy", "script", "expected"),
    [
        ("ddp", None, ()),
        ("deepspeed", None, ("deepspeed",)),
        ("ddp", LIGHTNING_SCRIPT, ("lightning", "transformers")),
        ("deepspeed", "import torch\n", ("deepspeed",)),
        # Only what the script imports as it starts: not an import inside a function, not a relative one.
        ("ddp", "def main():\n    import lightning\nfrom .lightning import x\n", ()),
        ("ddp", "import lightning as L\ndef broken(:\n", ()),  # the run reports the error, as it starts
    ],
)
def test_a_runs_frameworks_come_from_its_strategy_and_its_scripts_imports(strategy, script, expected):
    assert frameworks_of(_spec(strategy, script)) == expected


def test_only_known_frameworks_are_named_in_one_order():
    assert named("transformers,os,deepspeed,,lightning") == ("deepspeed", "lightning", "transformers")


def test_a_framework_runs_standby_has_its_import_time_variables_and_falls_back_to_the_plain_one():
    environ = {"TP_HOME": "/h", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "AWS_SECRET_ACCESS_KEY": "s"}
    # A run that does not use them starts from a standby that never read them.
    assert standby.import_environment(environ) == {"TP_HOME": "/h"}
    hf = environ | {PRELOAD_ENV: "transformers"}
    assert standby.import_environment(hf) == {"TP_HOME": "/h", "HF_HUB_OFFLINE": "1", PRELOAD_ENV: "transformers"}
    # Jobs whose import-time settings differ are served by different standbys, each loaded with its own.
    online = hf | {"HF_HUB_OFFLINE": "0"}
    assert standby.shared_address(hf) != standby.shared_address(online)
    # Where that standby is not up yet, the plain one forks the run (its ranks import the framework themselves).
    assert standby.shared_addresses(hf) == [standby.shared_address(hf), standby.shared_address(environ)]
    assert standby.shared_addresses(environ) == [standby.shared_address(environ)]


def test_the_launcher_names_the_frameworks_only_for_runs_a_standby_serves(tmp_path, monkeypatch):
    request = RunRequest(spec=_spec("deepspeed"), run_id="r-1", run_dir=tmp_path, env={"TP_HOME": str(tmp_path)})
    monkeypatch.delenv(standby.SHARED_OWNER_ENV, raising=False)
    assert PRELOAD_ENV not in LocalLauncher(visible_gpus=0).plan(request).env  # cold: nothing loads them first
    monkeypatch.setenv(standby.SHARED_OWNER_ENV, "4242")
    assert LocalLauncher(visible_gpus=0).plan(request).env[PRELOAD_ENV] == "deepspeed"
