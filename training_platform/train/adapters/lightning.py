"""A Lightning `Callback` on the worker SDK: metrics, checkpoints through the store, preemption.

    session = TrainingSession.start()
    callback = PlatformCallback(session, checkpoint_dir)
    trainer = L.Trainer(max_steps=..., callbacks=[callback], enable_checkpointing=False)
    trainer.fit(module, loader, ckpt_path=callback.resume_from())
    session.finish(module, trainer.global_step, metrics)

Lightning restarts a dataloader from its first batch on resume: give it a sampler addressed by
global step (see examples/lightning/train.py) and the continuation is exact.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import lightning as L

from training_platform.train.adapters.directories import restore_directory, save_directory
from training_platform.train.session import TrainingSession

CHECKPOINT_FILE = "last.ckpt"


class PlatformCallback(L.Callback):
    def __init__(self, session: TrainingSession, checkpoint_dir: str | Path):
        self.session = session
        self.checkpoint_dir = Path(checkpoint_dir)
        self.preempted = False
        self.start_step = 0
        """The step resume_from restored (0: a fresh start): where a step-addressed sampler starts."""

    def resume_from(self) -> str | None:
        """The newest verified checkpoint as a path for `trainer.fit(ckpt_path=...)`."""
        directory = restore_directory(self.session, self.checkpoint_dir / "restored", "step-{step}")
        if directory is None:
            return None
        self.start_step = int(directory.name.removeprefix("step-"))
        return str(directory / CHECKPOINT_FILE)

    def on_train_start(self, trainer, pl_module):
        # Lightning installs its own SIGTERM handler at fit start; the platform's must win, so that a
        # notice becomes "checkpoint at a step boundary (ranks agree within ~0.2 s), then exit for requeue".
        self.session.hooks.take_signals()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # Lightning fetches its batches itself: steps and their pace are counted, data wait is not measured.
        self.session.hooks.step_started()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % self.session.spec.training.log_every == 0:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
            self.session.report(step, metrics)
        saved = self.session.hooks.should_checkpoint(step)
        if saved:
            self._save(trainer, step)
        if step < trainer.max_steps and self.session.should_stop():
            if not saved:
                self._save(trainer, step)
            self.preempted = True
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        if self.preempted:
            self.session.hooks.exit_preempted(trainer.global_step)

    def _save(self, trainer, step: int) -> None:
        directory = self.checkpoint_dir / f"step-{step}"
        began = time.monotonic()
        trainer.save_checkpoint(directory / CHECKPOINT_FILE)  # collective: every rank calls it
        save_directory(self.session, directory, step, began=began)
        if self.session.dist.is_main:
            shutil.rmtree(directory, ignore_errors=True)  # the store holds it now
