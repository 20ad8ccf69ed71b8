"""A Hugging Face `TrainerCallback` on the worker SDK: metrics, checkpoints through the store, preemption,
and the platform's evaluation of the run.

    with TrainingSession.start() as session:
        callback = PlatformCallback(session)
        trainer = Trainer(..., processing_class=tokenizer, callbacks=[callback])
        output = callback.train(trainer)
        session.finish(trainer.model, trainer.state.global_step, output.metrics)

`callback.train(trainer)` resumes from the run's newest verified checkpoint. When the platform starts the
script again to evaluate the run, it loads the evaluated checkpoint's weights and trains nothing (the
Trainer, resumed at max_steps, would still take a step), and the model is logged with MLflow's
transformers flavour, with the Trainer's `processing_class` as its tokenizer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast, Trainer, TrainerCallback
from transformers.trainer_utils import TrainOutput

from training_platform.datasets import load_manifest
from training_platform.datasets.text import load_tokenizer
from training_platform.errors import CheckpointError
from training_platform.train.adapters.directories import restore_directory, save_directory
from training_platform.train.session import TrainingSession
from training_platform.train.split_data import SplitBatches

TRANSFORMERS_REQUIREMENTS = ("transformers", "tokenizers", "safetensors")


class PlatformCallback(TrainerCallback):
    def __init__(self, session: TrainingSession):
        if session.spec.checkpoint.every_steps == "auto":
            raise ValueError(
                "checkpoint.every_steps: auto cannot drive the Trainer, which saves every save_steps steps: "
                "set every_steps to a number and pass it as TrainingArguments(save_steps=...)"
            )
        self.session = session
        self.preempted = False

    def train(self, trainer: Trainer) -> TrainOutput:
        """`trainer.train()`, resumed from the run's newest verified checkpoint (a fresh start without one).
        In the platform's evaluation of the run: the evaluated checkpoint's weights, no step trained."""
        checkpoint = restore_directory(self.session, Path(trainer.args.output_dir))
        if self.session.hooks.evaluation is None:
            return trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        if checkpoint is None:
            raise CheckpointError(
                f"the checkpoint of step {self.session.hooks.evaluation.step} this evaluation names did not restore; "
                "see the log above for why"
            )
        return self._load_evaluated(trainer, checkpoint)

    def _load_evaluated(self, trainer: Trainer, checkpoint: Path) -> TrainOutput:
        model = trainer.model
        if not isinstance(model, PreTrainedModel):
            raise TypeError(
                f"the Trainer's model is a {type(model).__name__}; the platform evaluates a transformers "
                "PreTrainedModel, whose checkpoints it reads with from_pretrained"
            )
        # Safetensors only: a pickled pytorch_model.bin from storage is never loaded.
        saved = type(model).from_pretrained(checkpoint, use_safetensors=True)
        model.load_state_dict(saved.state_dict())
        step = self.session.hooks.evaluation.step
        trainer.state.global_step = step
        if isinstance(trainer.processing_class, PreTrainedTokenizerBase):
            self.session.hooks.log_model_with(_transformers_logger(trainer.processing_class))
        return TrainOutput(global_step=step, training_loss=math.nan, metrics={})

    def on_log(self, args, state, control, logs=None, **kwargs):
        numbers = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
        if numbers:
            self.session.report(state.global_step, numbers)

    def on_step_begin(self, args, state, control, **kwargs):
        # The Trainer fetches its batches itself: steps and their pace are counted, data wait is not measured.
        self.session.hooks.step_started()

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
            self.session.hooks.exit_preempted(state.global_step)


def _transformers_logger(tokenizer: PreTrainedTokenizerBase):
    def log(model: PreTrainedModel, test: SplitBatches) -> str:
        import mlflow.transformers

        from training_platform.train.model_requirements import model_requirements

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # MLflow looks for a model card on the hub: nothing to fetch
        info = mlflow.transformers.log_model(
            {"model": model, "tokenizer": tokenizer},
            name="model",
            task=pipeline_task(model),
            pip_requirements=model_requirements(*TRANSFORMERS_REQUIREMENTS),
        )
        return info.model_uri

    return log


def pipeline_task(model: PreTrainedModel) -> str:
    """The transformers pipeline a model class serves (MLflow asks the hub otherwise: a model built from a
    config is on no hub)."""
    from transformers.models.auto import modeling_auto

    heads = {
        "text-generation": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "text-classification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "token-classification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        "fill-mask": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "text2text-generation": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "question-answering": modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    }
    name = type(model).__name__
    for task, classes in heads.items():
        if any(name in ((entry,) if isinstance(entry, str) else entry) for entry in classes.values()):
            return task
    raise TypeError(
        f"{name} serves none of the text pipelines ({', '.join(heads)}) MLflow's transformers flavour logs with "
        "a tokenizer: give the Trainer a model with such a head, or no processing_class (the pytorch flavour)"
    )


def snapshot_tokenizer(session: TrainingSession) -> PreTrainedTokenizerFast:
    """The run's text snapshot's character tokenizer as a transformers tokenizer: the same ids the snapshot
    holds, so a model trained on the snapshot generates text through it (and is logged with it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    root = session.hooks.snapshot_root
    chars = load_tokenizer(root, load_manifest(root, session.spec.dataset.snapshot_id)).chars
    unknown = chars[0]
    tokenizer = Tokenizer(models.WordLevel(vocab={char: i for i, char in enumerate(chars)}, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token=unknown, pad_token=unknown, eos_token=unknown, bos_token=unknown
    )
