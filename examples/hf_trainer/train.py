"""A Hugging Face Trainer script on the platform: a tiny GPT-2 learns Python source, one character at a time.

    tp train examples/hf_trainer/spec.yaml

The model is built from a config in this file (no weights are downloaded); the data is the run's text
snapshot, the standard library's own source as windows of character ids, read with `session.dataset`.
`PlatformCallback` sends the Trainer's logs to MLflow and Dagster, routes its checkpoints through the
platform's store and turns a preemption notice into "save, stop, exit for requeue". Once the run is done
the platform starts this script again to evaluate the final checkpoint: `callback.train` then loads it
without training, `evaluate` below measures it on the test split, and the model is registered with
MLflow's transformers flavour, the snapshot's tokenizer beside it.
"""

import math

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from training_platform.train.adapters.hf import PlatformCallback, snapshot_tokenizer
from training_platform.train.session import TrainingSession

CONTEXT = 64  # characters the model reads at once: the first CONTEXT of each snapshot row


class Windows(Dataset):
    """Each row of a split as a causal LM example (the model shifts the labels by one itself)."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens[:, :CONTEXT]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids}


@torch.no_grad()
def evaluate(model: GPT2LMHeadModel, test) -> dict[str, float]:
    """Next-character loss over the test split, its perplexity, and how often the likeliest character is right."""
    total_loss, hits, count = 0.0, 0, 0
    for rows in test.features[:, :CONTEXT].split(256):
        logits, targets = model(input_ids=rows).logits[:, :-1], rows[:, 1:]
        total_loss += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        hits += (logits.argmax(-1) == targets).sum().item()
        count += targets.numel()
    loss = total_loss / count
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": hits / count}


def main() -> None:
    with TrainingSession.start() as session:
        cfg = session.spec.training
        session.evaluate_with(evaluate)
        callback = PlatformCallback(session)  # first: it refuses a spec it cannot follow (every_steps: auto)
        tokenizer = snapshot_tokenizer(session)
        torch.manual_seed(cfg.seed)
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tokenizer),
                n_positions=CONTEXT,
                n_embd=64,
                n_layer=2,
                n_head=2,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        )
        args = TrainingArguments(
            output_dir=str(session.run_dir / "hf-output"),
            max_steps=cfg.max_steps,
            per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.learning_rate,
            logging_steps=cfg.log_every,
            save_strategy="steps",
            save_steps=session.spec.checkpoint.every_steps,
            save_total_limit=2,
            seed=cfg.seed,
            data_seed=cfg.seed,
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Windows(session.dataset("train").features),
            processing_class=tokenizer,
            callbacks=[callback],
        )
        output = callback.train(trainer)
        session.finish(trainer.model, trainer.state.global_step, output.metrics)


if __name__ == "__main__":
    main()
