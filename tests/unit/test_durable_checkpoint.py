"""Each new durable checkpoint of a running job is published on the job (checkpoints/durable.py, LiveRun)."""

from __future__ import annotations

from types import SimpleNamespace

from resources.live_run import LiveRun
from training_platform.checkpoints.durable import DurableCheckpoint, newest_checkpoint
from training_platform.launch.base import JobHandle
from training_platform.runs.events import RunEvents


class _Publishing:
    """A launcher that publishes checkpoints; it fails when told to, as an API server or slurmctld may."""

    def __init__(self):
        self.published: list[DurableCheckpoint] = []
        self.failing = False

    def logs(self, handle):
        return ""

    def publish_checkpoint(self, handle, checkpoint):
        if self.failing:
            raise RuntimeError("slurmctld busy")
        self.published.append(checkpoint)


def _live(tmp_path, launcher) -> LiveRun:
    context = SimpleNamespace(
        instance=SimpleNamespace(add_run_tags=lambda *_: None), run_id="r", log=SimpleNamespace(debug=lambda *_: None)
    )
    return LiveRun(context, launcher, JobHandle("slurm", "42", "r"), tmp_path, 100)


def test_each_new_checkpoint_is_published_once_and_a_failed_publish_is_tried_again(tmp_path):
    launcher, events = _Publishing(), RunEvents(tmp_path)
    live = _live(tmp_path, launcher)
    events.append("progress", step=10)
    live.poll()
    assert launcher.published == []  # no checkpoint yet
    events.append("checkpoint", step=50, uri="s3://b/c")
    events.append("progress", step=60)
    live.poll()
    live.poll()
    assert [c.step for c in launcher.published] == [50]

    launcher.failing = True
    events.append("checkpoint", step=100, uri="s3://b/c")
    live.poll()  # the run goes on: the failure is the view's, not the run's
    launcher.failing = False
    live.poll(final=True)
    assert [c.step for c in launcher.published] == [50, 100]


def test_the_published_forms_name_the_step_and_when_it_was_saved():
    checkpoint = newest_checkpoint([
        {"kind": "checkpoint", "step": 40, "at": 1_790_000_000.0},
        {"kind": "checkpoint", "step": 80, "at": 1_790_000_100.5},
        {"kind": "progress", "step": 90, "at": 1_790_000_120.0},
    ])
    assert checkpoint == DurableCheckpoint(step=80, saved_at=1_790_000_100.5)
    assert checkpoint.slurm_comment() == "tp-checkpoint:step=80;saved_at=2026-09-21T14:15:00Z"
    assert " " not in checkpoint.slurm_comment()  # one word in `scontrol show job -o`
    assert checkpoint.job_annotations() == {
        "training-platform.io/checkpoint-step": "80",
        "training-platform.io/checkpoint-saved-at": "2026-09-21T14:15:00Z",
    }
    assert newest_checkpoint([{"kind": "progress", "step": 3, "at": 1.0}]) is None


def test_a_published_checkpoint_is_published_again_as_its_work_at_risk_grows(tmp_path, monkeypatch):
    import resources.live_run as live_run

    launcher, events = _Publishing(), RunEvents(tmp_path)
    live = _live(tmp_path, launcher)
    events.append("checkpoint", step=50, uri="s3://b/c")
    live.poll()
    live.poll()
    assert len(launcher.published) == 1
    monkeypatch.setattr(live_run, "CHECKPOINT_REFRESH_S", 0.0)
    live.poll()
    assert [c.step for c in launcher.published] == [50, 50]
