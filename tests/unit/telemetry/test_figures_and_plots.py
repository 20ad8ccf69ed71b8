"""Run figures from a real clock, and the PNG plots people look at."""

import time

import pytest
from PIL import Image

from training_platform.spec import parse_spec
from training_platform.telemetry.figures import RunClock, cost_usd, hourly_rate, run_figures
from training_platform.telemetry.samplers import SystemSample
from training_platform.telemetry.worker import WorkerTelemetry


def spec(**resources):
    return parse_spec({"name": "f", "team": "t", "owner": "o", "resources": {"procs_per_node": 1, **resources}})


def test_clock_splits_time_into_data_wait_and_checkpoints():
    clock = RunClock(slow_data_s=0.0)
    for _ in range(4):
        with clock.data_wait():
            time.sleep(0.02)
        time.sleep(0.01)
    with clock.checkpoint():
        time.sleep(0.03)
    figures = run_figures(clock, spec(), [], rate_per_hour=3.6)
    assert figures.steps == 4
    assert len(clock.step_times) == 3 and figures.step_time_s >= 0.03
    assert 0.4 < figures.data_wait_fraction < 0.85
    assert 0.1 < figures.checkpoint_overhead < 0.4
    assert figures.samples_per_s > 0
    assert figures.cost_usd == pytest.approx(cost_usd(3.6, clock.elapsed()), rel=0.2)
    assert figures.mfu is None  # CPU: no honest peak


def test_slow_data_drill_counts_as_data_wait(monkeypatch):
    monkeypatch.setenv("TP_SLOW_DATA_SECONDS", "0.02")
    clock = RunClock()
    for _ in range(3):
        with clock.data_wait():
            pass
    assert clock.data_wait_s >= 0.06


def test_a_plain_scripts_after_step_counts_the_steps_its_loop_did_not(tmp_path):
    """A plain script calls only after_step; the template's data_wait (and adapters' step_started) count
    their own steps, which after_step must not count again. Resumed runs count from the restored step."""
    telemetry = WorkerTelemetry(spec(), "r", tmp_path, is_main=True, samples_node=False, start_step=10)
    telemetry.steps_done(10)
    assert telemetry.step == 10 and telemetry.clock.steps == 0
    telemetry.steps_done(11)
    telemetry.steps_done(14)  # a script reporting every few steps
    assert telemetry.step == 14 and telemetry.clock.steps == 4 and len(telemetry.clock.step_times) == 1
    with telemetry.clock.data_wait():
        pass
    telemetry.steps_done(15)
    assert telemetry.step == 15 and telemetry.clock.steps == 5


def test_mfu_on_a_known_gpu():
    clock = RunClock()
    with clock.data_wait():
        pass
    time.sleep(0.01)
    figures = run_figures(clock, spec(gpus_per_node=1, gpu_type="H100"), [], num_params=10**9, rate_per_hour=1)
    assert figures.mfu is not None and figures.mfu > 0


def test_hourly_rate_scales_with_the_request():
    one = hourly_rate(spec(gpus_per_node=1, gpu_type="H100"))
    eight = hourly_rate(spec(gpus_per_node=8, procs_per_node=8, gpu_type="H100"))
    assert one > 0 and eight == pytest.approx(8 * one)
    assert 0 < hourly_rate(spec()) < one


def _samples(n=20):
    return [
        SystemSample(t=100.0 + i, device="cpu", utilization_pct=10.0 * (i % 10), memory_used_mb=50, memory_pct=5)
        for i in range(n)
    ]


def test_plots_are_real_pngs(tmp_path):
    from training_platform.telemetry import plots  # matplotlib: imported by the worker that runs this test only

    history = [(s, {"train_loss": 2.0 / s, "val_accuracy": 1 - 1 / s, "epoch": 0.0}) for s in range(1, 40)]
    paths = [
        plots.loss_curves(history, tmp_path / "loss.png", title="run-1"),
        plots.utilization_over_time(_samples(), tmp_path / "util.png", threshold_pct=50),
        plots.cost_over_time([(0, 0.0), (10, 0.5), (20, 1.0)], tmp_path / "cost.png"),
    ]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 400 and image.height >= 150
            # Not a blank canvas: a curve was drawn.
            assert len(set(image.convert("RGB").getdata())) > 10
    markdown = plots.markdown_image(paths[0], "loss")
    assert markdown.startswith("![loss](data:image/png;base64,iVBOR")
