"""Secrets are found by content, not only by the name of the variable that holds them."""

from pathlib import Path

import pytest

from training_platform.errors import SpecError
from training_platform.launch.base import RunRequest
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.policy.preflight import check_no_secrets
from training_platform.redaction import MASK, Redactor
from training_platform.registry.tracking import spec_params
from training_platform.spec import parse_spec

SECRET = "s3cr3t-in-env-and-args"
URL_PASSWORD = "pa55-in-url"


@pytest.fixture(autouse=True)
def orchestrator_secrets(monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://bob:{URL_PASSWORD}@mlflow.example:5000")


def _leaky_spec():
    return parse_spec({
        "name": "leaky", "team": "qa", "owner": "ci",
        "entrypoint": {"script": "train.py", "args": ["--lr", "0.1", "--data-key", SECRET, "--hf-token", "hf_lit3ral"]},
        "preemption": {"notice_provider": "aws", "notice_url": f"http://u:{URL_PASSWORD}@169.254.169.254/latest"},
    })


def test_mlflow_params_hold_no_secret_of_the_environment_args_or_urls():
    params = spec_params(_leaky_spec())
    flat = " ".join(params.values())
    for secret in (SECRET, URL_PASSWORD, "hf_lit3ral"):
        assert secret not in flat
    assert MASK in params["entrypoint.args"] and "'--lr', '0.1'" in params["entrypoint.args"]


def test_a_spec_holding_a_secret_is_refused_without_repeating_it():
    with pytest.raises(SpecError) as refused:
        check_no_secrets(_leaky_spec())
    message = str(refused.value)
    assert message.startswith("entrypoint.args[3]: holds a secret (the value of a secret environment variable)")
    assert SECRET not in message and "\n" not in message


def test_a_credential_in_an_innocently_named_variable_is_not_written_into_a_job():
    # MLFLOW_TRACKING_URI passed the name-only filter and landed in the Job's env, password and all.
    spec = parse_spec({"name": "r", "team": "qa", "owner": "ci", "backend": "k8s"})
    env = {"MLFLOW_TRACKING_URI": f"https://bob:{URL_PASSWORD}@mlflow.example:5000"}
    with pytest.raises(SpecError, match="MLFLOW_TRACKING_URI holds or looks like a secret") as refused:
        KubernetesLauncher().plan(RunRequest(spec=spec, run_id="r-1", run_dir=Path("/r"), env=env))
    assert URL_PASSWORD not in str(refused.value)


def test_ordinary_values_are_left_alone():
    redactor = Redactor(environ={})
    text = "--max-tokens 512 lr: 0.1 http://169.254.169.254/latest/meta-data s3://bucket/prefix tokens=9"
    assert redactor.text(text) == text
    args = ["--max-tokens", "512", "--tokenizer", "gpt2"]
    assert redactor.args(args) == args
