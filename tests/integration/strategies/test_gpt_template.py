"""The GPT template on the standard-library text snapshot, under a real 2-process torchrun (CPU)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.integration.strategies.runs import make_spec, train
from training_platform.datasets import build_snapshot, load_manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("warm_launches")]
GPT = {"template": "gpt", "size": "tiny", "seq_len": 32}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tp-gpt")


@pytest.fixture(scope="module")
def snapshot_id(home) -> str:
    return build_snapshot("python_stdlib_text", home / "snapshots").snapshot_id


def test_loss_falls_within_a_few_hundred_steps(home, snapshot_id):
    training = {"max_steps": 200, "batch_size": 16, "eval_every": 100, "log_every": 20, "learning_rate": 3e-3}
    spec = make_spec(home, snapshot_id, "fsdp", model=GPT, training=training, checkpoint={"every_steps": 200})
    result = train(home, "gpt-falls", spec)
    vocab = load_manifest(home / "snapshots", snapshot_id).num_classes
    uniform = math.log(vocab)  # the loss of a model that knows nothing
    assert result["metrics"]["val_loss"] < 0.65 * uniform, result["metrics"]
    # Telemetry reached the report: throughput in tokens and the time spent waiting for data.
    reports = [
        dict(re.findall(r"(\w+)=([-\d.e+]+)", line)) for line in re.findall(r"^step \d+: .*$", result["log"], re.M)
    ]
    assert len(reports) == 10
    assert all(float(r["tokens_per_s"]) > 0 and 0 <= float(r["data_wait_fraction"]) < 1 for r in reports)


def test_mid_epoch_resume_through_the_streaming_reader_is_exact(home, snapshot_id):
    def spec(steps: int):
        training = {"max_steps": steps, "batch_size": 8, "eval_every": 20, "log_every": 10}
        return make_spec(home, snapshot_id, "ddp", model=GPT, training=training, checkpoint={"every_steps": 20})

    straight = train(home, "gpt-straight", spec(40))
    assert train(home, "gpt-resumed", spec(20))["final_step"] == 20
    resumed = train(home, "gpt-resumed", spec(40))
    assert resumed["resumed_from_step"] == 20
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
