"""Strategy choice in the spec, the DeepSpeed config derived from it, and the loop's step meter."""

from __future__ import annotations

import time

import pytest

from training_platform.errors import SpecError
from training_platform.spec import parse_spec
from training_platform.train.meter import StepMeter
from training_platform.train.strategies import STRATEGIES
from training_platform.train.strategies.deepspeed import deepspeed_config
from training_platform.train.strategies.fsdp import layers_of


def _spec(**fields):
    return parse_spec({"name": "s", "team": "qa", "owner": "ci", **fields})


def test_every_spec_strategy_is_registered():
    from training_platform.spec import STRATEGIES as SPEC_STRATEGIES

    assert set(SPEC_STRATEGIES) == set(STRATEGIES) == {"ddp", "fsdp", "deepspeed"}


def test_deepspeed_config_follows_the_spec():
    spec = _spec(strategy="deepspeed", training={"batch_size": 8}, deepspeed={"zero_stage": 3, "offload_params": True})
    config = deepspeed_config(spec)
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["zero_optimization"] == {"stage": 3, "offload_param": {"device": "cpu"}}
    assert deepspeed_config(_spec(strategy="deepspeed"))["zero_optimization"] == {"stage": 2}


def test_bad_strategy_settings_are_refused_with_the_fix():
    with pytest.raises(SpecError, match="offload_params needs zero_stage 3"):
        _spec(strategy="deepspeed", deepspeed={"zero_stage": 2, "offload_params": True})
    with pytest.raises(SpecError, match="deepspeed.zero_stage"):
        _spec(strategy="deepspeed", deepspeed={"zero_stage": 4})
    with pytest.raises(SpecError, match="unknown strategy 'horovod'; use one of: ddp, fsdp, deepspeed"):
        _spec(strategy="horovod")


def test_fsdp_shards_blocks_or_children_with_weights():
    from torch import nn

    from training_platform.train.templates import get_template

    gpt = get_template("gpt").build_model(_spec(model={"template": "gpt", "size": "tiny"}), 129, 40)
    assert layers_of(gpt) == list(gpt.blocks)
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert layers_of(mlp) == [mlp[0], mlp[2]]


def test_step_meter_reports_throughput_wait_and_mfu():
    meter = StepMeter(samples_per_step=10, tokens_per_sample=4, flops_per_sample=1e6, peak_flops=1e9)
    for _ in range(3):
        with meter.waiting_for_data():
            time.sleep(0.01)
        meter.step_done()
    report = meter.report()
    assert report["step_time_s"] >= 0.01
    assert report["samples_per_s"] == pytest.approx(10 / report["step_time_s"])
    assert report["tokens_per_s"] == pytest.approx(4 * report["samples_per_s"])
    assert report["mfu"] == pytest.approx(10 * 1e6 / report["step_time_s"] / 1e9)
    assert 0.5 < report["data_wait_fraction"] <= 1.0
    assert "mfu" not in StepMeter(10).report()  # peak unknown (CPU): no MFU rather than a made-up one
