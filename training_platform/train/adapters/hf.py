"""A Hugging Face `TrainerCallback` on the worker SDK: metrics, checkpoints through the store, preemption.

    session = TrainingSession.start()
    callback = PlatformCallback(session)
    trainer = Trainer(..., callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume_from(args.output_dir))
    session.finish(trainer.model, trainer.state.global_step, metrics)
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from training_platform.train.adapters.directories import restore_directory, save_directory
from training_platform.train.session import TrainingSession


class PlatformCallback(TrainerCallback):
    def __init__(self, session: TrainingSession):
        if session.spec.checkpoint.every_steps == "auto":
            raise ValueError(
                "checkpoint.every_steps: auto cannot drive the Trainer, which saves every save_steps steps: "
                "set every_steps to a number and pass it as TrainingArguments(save_steps=...)"
            )
        self.session = session
        self.preempted = False

    def resume_from(self, output_dir: str | Path) -> str | None:
        """The newest verified checkpoint, written back into output_dir for `trainer.train(resume_from_checkpoint=)`."""
        path = restore_directory(self.session, Path(output_dir))
        return str(path) if path else None

    def on_log(self, args, state, control, logs=None, **kwargs):
        numbers = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
        if numbers:
            self.session.report(state.global_step, numbers)

    def on_step_end(self, args, state, control, **kwargs):
        # Every rank calls this together, so the collective inside should_stop() is safe.
        if state.global_step < state.max_steps and self.session.should_stop():
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        save_directory(self.session, directory, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.preempted:
            self.session.exit_preempted(state.global_step)
