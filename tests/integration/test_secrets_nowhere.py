"""A secret set in the orchestrator's environment and written into a spec's arguments is found nowhere:
not in MLflow (a real SQLite store), not in `tp`'s output or the run files (the run is refused), not in
rendered plans, not in `tp doctor`'s report of a tracking URI with user:password@."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training_platform.registry import tracking
from training_platform.spec import parse_spec

pytestmark = pytest.mark.integration
TP = str(Path(sys.executable).with_name("tp"))
SECRET = "s3cr3t-set-in-env-and-args"
URL_PASSWORD = "pa55-in-the-tracking-uri"
SPEC = {
    "name": "leaky",
    "team": "qa",
    "owner": "ci",
    "entrypoint": {"script": "train.py", "args": ["--lr", "0.1", "--data-key", SECRET]},
    "preemption": {"notice_provider": "aws", "notice_url": f"http://u:{URL_PASSWORD}@169.254.169.254/latest"},
}


def _nowhere(root: Path, *outputs: str) -> None:
    for text in outputs:
        assert SECRET not in text and URL_PASSWORD not in text
    for path in (p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        assert SECRET.encode() not in data and URL_PASSWORD.encode() not in data, path


def test_mlflow_params_of_a_run_hold_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    spec = parse_spec(SPEC)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, tmp_path / "artifacts", spec, {"training_run": "leaky-1"})
    from mlflow.tracking import MlflowClient

    params = MlflowClient(uri).get_run(run_id).data.params
    assert params["entrypoint.args"].startswith("['--lr', '0.1', '--data-key', '***'")
    assert "u:***@169.254.169.254" in params["preemption.notice_url"]
    _nowhere(tmp_path, *params.values())


def test_tp_refuses_the_spec_and_shows_and_keeps_the_secret_nowhere(tmp_path):
    (tmp_path / "train.py").write_text("print('never run')\n")
    spec = tmp_path / "leaky.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    home = tmp_path / "home"
    env = {**os.environ, "MY_API_TOKEN": SECRET, "TP_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    train = subprocess.run([TP, "train", str(spec), "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 2, train.stderr[-2000:]
    assert "entrypoint.args[3]: holds a secret" in train.stdout.splitlines()[-1]
    outputs = [train.stdout, train.stderr]
    for args in (["--launcher", "slurm"], ["--launcher", "slurm", "--json"], ["--launcher", "local"]):
        render = subprocess.run([TP, "render", str(spec), *args], env=env, capture_output=True, text=True, timeout=120)
        assert render.returncode == 0, render.stderr[-2000:]
        outputs += [render.stdout, render.stderr]
    assert "--data-key" in outputs[2] and "***" in outputs[2]  # the plan is shown, the secret is not
    _nowhere(home, *outputs)


def test_doctor_does_not_print_the_tracking_uris_password(tmp_path):
    uri = f"http://bob:{URL_PASSWORD}@127.0.0.1:9/"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "TP_HOME": str(tmp_path), "DAGSTER_HOME": str(tmp_path / "d")}
    env |= {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    doctor = subprocess.run([TP, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert "bob:***@127.0.0.1:9" in doctor.stdout, doctor.stdout[-2000:]
    _nowhere(tmp_path, doctor.stdout, doctor.stderr)
