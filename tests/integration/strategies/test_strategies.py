"""DDP, FSDP2 and DeepSpeed ZeRO 1/2/3 under a real 2-process torchrun (gloo, CPU).

Equivalence: the same model, data and seed trained 20 steps with each strategy reach the
same validation loss as DDP within a relative tolerance of 1e-5 (on this CPU they agree
bitwise: with two ranks every reduction is a single, commutative addition).

Resume: a run stopped at step 10 and resumed from its checkpoint (written through the
strategy's own format: replicated state, DCP shards, DeepSpeed files) ends with bitwise the
same weights as the uninterrupted run, for every strategy.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.fixtures.crafted import Payload
from tests.fixtures.worker import job_pid, launch, wait, wait_for_step
from tests.integration.strategies.runs import make_spec, train
from training_platform.checkpoints import open_store
from training_platform.checkpoints.layout import manifest_key
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.local import LOG_FILE, LocalLauncher

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("warm_launches")]

RTOL = 1e-5
STRATEGIES = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "zero1": ("deepspeed", {"deepspeed": {"zero_stage": 1}}),
    "zero2": ("deepspeed", {"deepspeed": {"zero_stage": 2}}),
    "zero3": ("deepspeed", {"deepspeed": {"zero_stage": 3}}),
    "zero3-offload": ("deepspeed", {"deepspeed": {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}}),
}
RESUMED = ("ddp", "fsdp", "zero1", "zero2", "zero3")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tp-strategies")


@pytest.fixture(scope="module")
def snapshot_id(home) -> str:
    return build_snapshot("sklearn_digits", home / "snapshots").snapshot_id


@pytest.fixture(scope="module")
def straight(home, snapshot_id) -> dict[str, dict]:
    """Each strategy trained 20 steps without interruption (checkpoints at 10 and 20)."""
    results = {}
    for label, (strategy, extra) in STRATEGIES.items():
        results[label] = train(home, f"straight-{label}", make_spec(home, snapshot_id, strategy, **extra))
    return results


@pytest.mark.parametrize("label", [name for name in STRATEGIES if name != "ddp"])
def test_losses_match_ddp(straight, label):
    reference, result = straight["ddp"]["metrics"], straight[label]["metrics"]
    assert result["val_loss"] == pytest.approx(reference["val_loss"], rel=RTOL)
    assert result["val_accuracy"] == pytest.approx(reference["val_accuracy"], abs=1e-6)
    assert straight[label]["final_step"] == 20 and straight[label]["world_size"] == 2


def test_strategies_write_their_own_checkpoint_formats(home, straight):
    store = open_store(home / "checkpoints")
    formats = {
        label: {(m.kind, m.attributes.get("format")) for m in store.list(f"straight-{label}")} for label in STRATEGIES
    }
    assert formats["ddp"] == {("state", None)}
    assert formats["fsdp"] == {("files", "torch.distributed.checkpoint")}
    assert formats["zero3"] == {("files", "deepspeed")}
    steps = [m.step for m in store.list("straight-zero2")]
    assert steps == [10, 20]
    for label in ("fsdp", "zero2", "zero3"):  # the final checkpoint also holds the weights its workers gathered
        assert [m.skeleton is not None for m in store.list(f"straight-{label}")] == [False, True]


@pytest.mark.parametrize("label", RESUMED)
def test_resume_is_exact(home, snapshot_id, straight, label):
    strategy, extra = STRATEGIES[label]
    run_id = f"resumed-{label}"
    first = train(home, run_id, make_spec(home, snapshot_id, strategy, training={"max_steps": 10}, **extra))
    assert first["final_step"] == 10
    resumed = train(home, run_id, make_spec(home, snapshot_id, strategy, **extra))
    assert resumed["resumed_from_step"] == 10
    assert resumed["final_weights_sha256"] == straight[label]["final_weights_sha256"]


@pytest.mark.parametrize("label", ["fsdp", "zero2"])
def test_a_periodic_save_is_written_in_the_background_and_resumes_exactly(home, snapshot_id, straight, label):
    """The loop waits only for the copy of the state (FSDP: each rank's shard; DeepSpeed: its files, staged);
    the last save, the run's result, is written before the run ends. With the last checkpoint gone, a run
    resumes from the one written in the background."""
    periodic, last = open_store(home / "checkpoints").list(f"straight-{label}")
    assert periodic.save.stall_seconds > 0 and periodic.save.background_seconds > 0, periodic.save
    # Written while the loop waited: FSDP records it all as stall, DeepSpeed's file store all as background.
    assert (last.save.background_seconds if label == "fsdp" else last.save.stall_seconds) == 0, last.save

    strategy, extra = STRATEGIES[label]
    run_id, spec = f"background-{label}", make_spec(home, snapshot_id, strategy, **extra)
    assert train(home, run_id, spec)["final_weights_sha256"] == straight[label]["final_weights_sha256"]
    (home / "checkpoints" / manifest_key(run_id, 20)).unlink()
    resumed = train(home, run_id, spec)
    assert resumed["resumed_from_step"] == 10
    assert resumed["final_weights_sha256"] == straight[label]["final_weights_sha256"]


@pytest.mark.parametrize("label", ["fsdp", "zero2"])
def test_a_preempted_run_leaves_once_its_emergency_checkpoint_is_durable(home, snapshot_id, label):
    """SIGTERM while periodic saves are written in the background: the run waits for the one in flight, writes
    the emergency checkpoint, leaves as preempted, and its next attempt resumes from exactly that step."""
    strategy, extra = STRATEGIES[label]
    run_id = f"preempted-{label}"
    spec = make_spec(home, snapshot_id, strategy, training={"max_steps": 400, "eval_every": 400},
                     checkpoint={"every_steps": 25}, **extra)
    launcher = LocalLauncher(visible_gpus=0)
    handle = launch(home, run_id, spec, launcher)
    wait_for_step(home, run_id, 60)
    os.killpg(job_pid(handle), signal.SIGTERM)
    assert wait(launcher, handle).state == JobState.PREEMPTED
    stopped = max(m.step for m in open_store(home / "checkpoints").list(run_id))
    log = (home / "runs" / run_id / LOG_FILE).read_text()
    assert f"preempted at step {stopped}: emergency checkpoint written" in log, log[-3000:]
    resumed = train(home, run_id, spec)
    assert resumed["resumed_from_step"] == stopped and resumed["final_step"] == 400


@pytest.mark.parametrize("label", list(STRATEGIES))
def test_every_format_consolidates_to_the_final_weights(home, straight, label):
    from training_platform.train.strategies.consolidate import full_model_state
    from training_platform.train.weights import weights_sha256

    store = open_store(home / "checkpoints")
    final = next(m for m in store.list(f"straight-{label}") if m.step == 20)
    assert weights_sha256(full_model_state(store, final)) == straight[label]["final_weights_sha256"]


@pytest.mark.parametrize("label", ["fsdp", "zero2"])
def test_a_crafted_checkpoint_fails_the_resume_and_never_runs(home, snapshot_id, straight, label, tmp_path):
    """A checkpoint a job published (so signed) whose DCP metadata or DeepSpeed file is a crafted pickle."""
    strategy, extra = STRATEGIES[label]
    store = open_store(home / "checkpoints")
    final = store.list(f"straight-{label}")[-1]
    files = store.restore_files(final, tmp_path / "files")
    marker = tmp_path / "ran"
    if label == "fsdp":
        files[".metadata"].write_bytes(pickle.dumps(Payload(marker)))
    else:
        torch.save({"module": {}, "rng": Payload(marker)}, files["checkpoint/mp_rank_00_model_states.pt"])
    store.save_files(f"crafted-{label}", 10, files, attributes=dict(final.attributes))

    launcher = LocalLauncher(visible_gpus=0)
    spec = make_spec(home, snapshot_id, strategy, **extra)
    status = wait(launcher, launch(home, f"crafted-{label}", spec, launcher))

    log = (home / "runs" / f"crafted-{label}" / LOG_FILE).read_text()
    assert status.state == JobState.FAILED, log[-3000:]
    assert "none restores" in log and re.search(r"refers to (builtins\.)?exec\b", log)
    assert not marker.exists()
