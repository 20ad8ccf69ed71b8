"""A Hugging Face Trainer script on the platform: a tiny BERT reads each 8x8 digit as 64 pixel tokens.

    tp train examples/hf_trainer/spec.yaml

The model is built from a config in this file (no weights are downloaded). `PlatformCallback` sends
the Trainer's logs to MLflow and Dagster, routes its checkpoints through the platform's store, and
turns a preemption notice into "save, stop, exit for requeue".
"""

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from training_platform.datasets import read_split
from training_platform.train.adapters.hf import PlatformCallback
from training_platform.train.session import TrainingSession


class PixelTokens(Dataset):
    """Each image as 64 tokens: pixel intensity 0..16 becomes token id 1..17 (0 is padding)."""

    def __init__(self, features, labels):
        self.input_ids = torch.from_numpy(features * 16).round().long() + 1
        self.labels = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        ids = self.input_ids[index]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[index]}


def main() -> None:
    session = TrainingSession.start()
    spec, cfg = session.spec, session.spec.training
    callback = PlatformCallback(session)  # first: it refuses a spec it cannot follow (every_steps: auto)
    train_split = PixelTokens(*read_split(session.snapshot_root, spec.dataset.snapshot_id, "train"))

    config = BertConfig(
        vocab_size=18,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=10,
    )
    torch.manual_seed(cfg.seed)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=str(session.run_dir / "hf-output"),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        logging_steps=cfg.log_every,
        save_strategy="steps",
        save_steps=spec.checkpoint.every_steps,
        save_total_limit=2,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_split, callbacks=[callback])
    output = trainer.train(resume_from_checkpoint=callback.resume_from(args.output_dir))
    session.finish(model.state_dict(), trainer.state.global_step, {"train_loss": output.training_loss})


if __name__ == "__main__":
    main()
