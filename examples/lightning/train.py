"""A Lightning script on the platform: an MLP LightningModule on the digits snapshot.

    tp train examples/lightning/spec.yaml

`PlatformCallback` reports metrics to MLflow and Dagster, checkpoints through the platform's store
and saves-and-stops on a preemption notice. The spec's `evaluation` has the platform evaluate and
register the module (pytorch flavour) once training ends. Batches come from a sampler addressed by global step,
so a resumed run reads exactly what the interrupted one would have.
"""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from training_platform.train.adapters.lightning import PlatformCallback
from training_platform.train.sampler import StepSampler
from training_platform.train.session import TrainingSession


class Classifier(L.LightningModule):
    def __init__(self, features: int, learning_rate: float):
        super().__init__()
        self.learning_rate = learning_rate
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)  # logits: how the platform's evaluation measures a classifier

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        loss = F.cross_entropy(self(inputs), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class StepBatches(Sampler):
    """The batches of steps [start, stop): this rank's rows of each global batch.

    Its length is the whole run (`stop`): a resumed Lightning loop counts the restored batch index
    against it, so with `start` batches already done it expects exactly the ones yielded here.
    """

    def __init__(self, sampler: StepSampler, start: int, stop: int):
        self.sampler, self.start, self.stop = sampler, start, stop

    def __iter__(self):
        return (self.sampler.indices(step).tolist() for step in range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop


def main() -> None:
    session = TrainingSession.start()
    cfg = session.spec.training
    data = session.dataset("train")  # its sampler: this rank's rows at each step, reshuffled each epoch
    torch.manual_seed(cfg.seed)
    module = Classifier(data.num_features, cfg.learning_rate)

    callback = PlatformCallback(session, session.run_dir / "lightning")
    ckpt_path = callback.resume_from()
    batches = StepBatches(data.sampler, callback.start_step, cfg.max_steps)
    loader = DataLoader(TensorDataset(data.features, data.labels), batch_sampler=batches)
    trainer = L.Trainer(
        max_steps=cfg.max_steps,
        max_epochs=-1,
        accelerator="cpu",
        devices=session.dist.local_world_size,
        num_nodes=session.spec.resources.nodes,
        strategy="ddp" if session.dist.world_size > 1 else "auto",
        callbacks=[callback],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        use_distributed_sampler=False,
        deterministic=True,
        enable_model_summary=False,
    )
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    # The module itself: evaluated on the test split (the script runs again on its final checkpoint, and
    # fit() has no step left to train, nor a loss to log) and registered.
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items() if name == "train_loss"}
    session.finish(module, trainer.global_step, metrics)


if __name__ == "__main__":
    main()
