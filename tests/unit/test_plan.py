"""`tp plan` arithmetic against hand-computed examples (ZeRO paper Figure 1, Korthikanti et al.)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from training_platform.cost.plan import (
    GIB,
    USABLE_FRACTION,
    estimate,
    model_shape,
    model_state_bytes,
    plan_spec,
    transformer_activation_bytes,
)
from training_platform.hardware import GPUS, gpu_for_device_name
from training_platform.spec import GPU_TYPES, parse_spec

PSI = 7.5e9  # the ZeRO paper's 7.5B-parameter example on 64 GPUs


def _spec(**fields):
    return parse_spec({"name": "plan", "team": "qa", "owner": "ci", **fields})


def test_mixed_precision_adam_is_16_bytes_per_param_without_sharding():
    weights, grads, optim, offloaded = model_state_bytes(1000, 8, strategy="ddp")
    assert (weights, grads, optim, offloaded) == (2000, 2000, 12000, 0)


@pytest.mark.parametrize(
    ("strategy", "stage", "gigabytes"),
    [("ddp", 0, 120.0), ("deepspeed", 1, 31.4), ("deepspeed", 2, 16.6), ("deepspeed", 3, 1.9), ("fsdp", 0, 1.9)],
)
def test_zero_paper_figure_1(strategy, stage, gigabytes):
    total = sum(model_state_bytes(int(PSI), 64, strategy=strategy, zero_stage=stage)[:3])
    assert total / 1e9 == pytest.approx(gigabytes, abs=0.05)


def test_zero3_divides_everything_by_the_data_parallel_size():
    one = sum(model_state_bytes(10**9, 1, strategy="deepspeed", zero_stage=3)[:3])
    eight = sum(model_state_bytes(10**9, 8, strategy="deepspeed", zero_stage=3)[:3])
    assert one == 16e9 and eight == 2e9


def test_offload_moves_optimizer_and_weights_to_the_host():
    weights, grads, optim, offloaded = model_state_bytes(
        800, 4, strategy="deepspeed", zero_stage=3, offload_optimizer=True, offload_params=True
    )
    assert (weights, grads, optim) == (0, 400, 0)
    assert offloaded == 800 * 12 / 4 + 800 * 2 / 4


def test_sgd_keeps_only_fp32_master_weights():
    assert model_state_bytes(100, 1, optimizer="sgd")[2] == 400


def test_transformer_activations_by_hand():
    # s=4, b=2, h=8, a=2: per layer 4*2*8*(34 + 5*2*4/8) = 64*39 = 2496; 3 layers; logits 4*4*2*10 = 320.
    assert transformer_activation_bytes(4, 2, 8, 2, 3, 10) == 3 * 2496 + 320
    # GPT-3 175B layer at s=2048, b=1: s*b*h*(34 + 5*a*s/h) = 2048*12288*114 bytes.
    assert transformer_activation_bytes(2048, 1, 12288, 96, 1, 0) == 2048 * 12288 * 114


def test_gpt_tiny_parameter_count_and_estimate():
    spec = _spec(model={"template": "gpt", "size": "tiny", "seq_len": 64}, training={"batch_size": 4})
    shape = model_shape(spec, num_features=65, num_classes=256)
    # embeddings 256*64 + 64*64; per block 49,984 (2 LayerNorms, qkv, proj, 4x MLP); final LayerNorm; head 64*256
    assert shape.params == 256 * 64 + 64 * 64 + 2 * 49_984 + 128 + 64 * 256 == 136_960
    memory = estimate(shape, spec, dp=2)
    assert memory.model_states == 16 * 136_960
    assert memory.activations == transformer_activation_bytes(64, 4, 64, 2, 2, 256)


def test_recommendation_is_the_smallest_count_that_fits():
    big = {"template": "gpt", "size": "base", "seq_len": 512, "layers": 48, "width": 8192, "heads": 64}
    spec = _spec(model=big, training={"batch_size": 1}, strategy="deepspeed", deepspeed={"zero_stage": 3})
    shape = model_shape(spec)
    assert shape.params > 38e9
    result = plan_spec(spec, shape)
    h100 = next(o for o in result["options"] if o["gpu_type"] == "H100")
    budget = USABLE_FRACTION * GPUS["H100"].memory_gib * GIB
    assert estimate(shape, spec, h100["count"]).total <= budget < estimate(shape, spec, h100["count"] // 2).total
    assert result["recommendation"] is not None and result["recommendation"]["count"] >= 4
    # The same model under DDP never fits: nothing is sharded, so more GPUs do not help.
    assert plan_spec(spec.model_copy(update={"strategy": "ddp"}), shape)["recommendation"] is None
    # At 2048 tokens the activations alone (about 92 GB, not sharded by ZeRO) exceed an H100 at any count.
    long = spec.model_copy(update={"model": spec.model.model_copy(update={"seq_len": 2048})})
    assert "H100" not in {o["gpu_type"] for o in plan_spec(long, model_shape(long))["options"]}


def test_gpu_table_covers_the_spec_and_names_devices():
    assert set(GPUS) == set(GPU_TYPES)
    assert gpu_for_device_name("NVIDIA L40S").name == "L40S"
    assert gpu_for_device_name("NVIDIA L4").name == "L4"
    assert gpu_for_device_name("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert gpu_for_device_name("NVIDIA H100 80GB HBM3").bf16_tflops == 989
    assert gpu_for_device_name("AMD Instinct MI300X") is None


def test_tp_plan_json(tmp_path, monkeypatch):
    from training_platform.cli.main import app

    monkeypatch.setenv("TP_HOME", str(tmp_path))
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: p\nteam: qa\nowner: ci\nmodel: {template: gpt, size: tiny, seq_len: 64}\n"
        "training: {batch_size: 4}\nstrategy: fsdp\n"
    )
    result = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output.strip().splitlines()[-1])
    assert body["strategy"] == "fsdp" and body["data_parallel_size"] == 2
    assert body["per_gpu_bytes"]["optimizer"] == 12 * body["params"] / 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\nteam: qa\nowner: ci\nstrategy: horovod\n")
    refused = CliRunner().invoke(app, ["plan", str(bad), "--json"])
    assert refused.exit_code == 2 and "strategy" in refused.output
