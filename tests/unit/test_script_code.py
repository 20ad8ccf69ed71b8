"""A user's script travels with its run's spec (entrypoint.code): to a server elsewhere, into the registry and to
every job, which runs the file where it has it and the shipped text where it does not."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from training_platform.errors import SpecError
from training_platform.policy.preflight import check_entrypoint, check_no_secrets
from training_platform.registry.tracking import spec_params
from training_platform.spec import MAX_SCRIPT_BYTES, load_spec, parse_spec
from training_platform.sweeps.spec import load_sweep
from training_platform.train.__main__ import script_to_run

SCRIPT = 'import os\nfrom huggingface_hub import login\nlogin(token=os.environ["HF_TOKEN"])\nprint("trained")\n'


def _user(tmp_path: Path, text: str | bytes = SCRIPT, **entrypoint) -> Path:
    user = tmp_path / "user"
    user.mkdir(exist_ok=True)
    script = user / "train.py"
    script.write_bytes(text if isinstance(text, bytes) else text.encode())
    spec = {"name": "own", "team": "ml-platform", "owner": "ada", "entrypoint": {"script": "train.py", **entrypoint}}
    (user / "spec.yaml").write_text(yaml.safe_dump(spec))
    return user


def test_tp_reads_the_script_beside_its_spec_into_the_spec(tmp_path):
    user = _user(tmp_path, SCRIPT.replace("\n", "\r\n"))  # the file's own bytes, line endings and all
    spec = load_spec(user / "spec.yaml")
    assert spec.entrypoint.script == str(user / "train.py")
    assert spec.entrypoint.code.text.encode() == (user / "train.py").read_bytes()
    assert spec.entrypoint.code.sha256 == hashlib.sha256((user / "train.py").read_bytes()).hexdigest()
    again = parse_spec(spec.model_dump(mode="json"))  # as the server reads it from the run config
    assert again.entrypoint.code == spec.entrypoint.code and again.spec_hash() == spec.spec_hash()


def test_shipped_text_that_is_not_what_its_hash_says_is_refused(tmp_path):
    spec = load_spec(_user(tmp_path) / "spec.yaml").model_dump(mode="json")
    spec["entrypoint"]["code"]["text"] += "import shutil; shutil.rmtree('/')\n"
    with pytest.raises(SpecError, match=r"entrypoint.code: sha256 is not the SHA-256 of text; let tp fill"):
        parse_spec(spec)


def test_a_script_too_big_to_ship_or_not_text_is_refused_with_the_fix(tmp_path):
    big = _user(tmp_path, "x = 1\n" * (MAX_SCRIPT_BYTES // 6 + 1))
    with pytest.raises(SpecError, match=r"256 KiB: build larger code into the image and run it with entrypoint.module"):
        load_spec(big / "spec.yaml")
    binary = _user(tmp_path, b"\xff\xfe\x00binary")
    with pytest.raises(SpecError, match=r"train.py is not UTF-8 text; name a Python script"):
        load_spec(binary / "spec.yaml")


def test_a_job_runs_the_file_when_it_holds_the_shipped_text_else_the_text_itself(tmp_path):
    user = _user(tmp_path)
    entrypoint = load_spec(user / "spec.yaml").entrypoint
    run_dir = tmp_path / "run"
    assert script_to_run(entrypoint, run_dir) == str(user / "train.py")  # its neighbours import as before

    (user / "train.py").write_text("print('edited after the run was submitted')\n")
    shipped = Path(script_to_run(entrypoint, run_dir))
    assert shipped == run_dir / "code" / entrypoint.code.sha256 / "train.py"
    assert shipped.read_text() == SCRIPT

    (user / "train.py").unlink()  # a pod, or a server on another machine: no such file there
    assert Path(script_to_run(entrypoint, tmp_path / "pod")).read_text() == SCRIPT
    check_entrypoint(load_spec(user / "spec.yaml").model_copy(update={"entrypoint": entrypoint}))  # not refused


def test_the_text_is_neither_an_mlflow_param_nor_scanned_as_a_setting(tmp_path):
    spec = load_spec(_user(tmp_path, args=["--epochs", "3"]) / "spec.yaml")
    params = spec_params(spec)
    assert params["entrypoint.code.sha256"] == spec.entrypoint.code.sha256
    assert "entrypoint.code.text" not in params
    check_no_secrets(spec)  # `token=os.environ[...]` in code reads a secret; it holds none
    leaky = spec.model_copy(
        update={"entrypoint": spec.entrypoint.model_copy(update={"args": ["--api-token", "hunter2hunter2"]})}
    )
    with pytest.raises(SpecError, match=r"entrypoint.args\[1\]: holds a secret"):
        check_no_secrets(leaky)


def test_a_sweeps_base_script_is_shipped_with_the_sweep(tmp_path):
    user = _user(tmp_path)
    base = yaml.safe_load((user / "spec.yaml").read_text())
    sweep = {
        "name": "own-sweep", "base": base, "objective": {"metric": "val_loss", "direction": "minimize"},
        "search_space": {"training.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
        "limits": {"max_trials": 2},
    }
    (user / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    trial = load_sweep(user / "sweep.yaml").trial_spec({"training.learning_rate": 0.01}, 0)
    assert trial.entrypoint.script == str(user / "train.py") and trial.entrypoint.code.text == SCRIPT
