"""Bring your own training code: a plain PyTorch script on the platform's worker SDK.

    tp train examples/byo_torch/spec.yaml

The platform starts this script under torchrun (or srun, or a Kubernetes pod) exactly as it starts
a template. Through the session it gets the spec, the process group and seeds, metrics in MLflow
and Dagster, atomic deduplicated checkpoints, and preemption safety (SIGTERM or a spot notice).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training_platform.datasets import read_split
from training_platform.train.session import TrainingSession


def batch_indices(rows: int, batch: int, seed: int, step: int, rank: int) -> torch.Tensor:
    """The rows read at `step` on `rank`: a pure function of its inputs, so a resume reads the same."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    return torch.randint(rows, (batch,), generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=48, help="hidden units")
    args = parser.parse_args()

    session = TrainingSession.start()  # reads the spec the launcher wrote; joins the process group
    cfg = session.spec.training
    features, labels = (
        torch.from_numpy(a) for a in read_split(session.snapshot_root, session.spec.dataset.snapshot_id, "train")
    )

    model = nn.Sequential(nn.Linear(features.shape[1], args.hidden), nn.Tanh(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate, momentum=0.9)
    step = 0
    if (restored := session.restore()) is not None:  # newest verified checkpoint, RNG included
        state, step = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    trained = DistributedDataParallel(model) if session.dist.world_size > 1 else model

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    loss = torch.tensor(0.0)
    while step < cfg.max_steps:
        rows = batch_indices(len(labels), cfg.batch_size, cfg.seed, step, session.dist.rank)
        loss = F.cross_entropy(trained(features[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % cfg.log_every == 0:
            session.report(step, {"train_loss": loss.item()})
        if session.should_checkpoint(step):
            session.save(state(), step)
        if step < cfg.max_steps and session.should_stop():  # preemption notice: save, exit for requeue
            session.save(state(), step)
            session.exit_preempted(step)
    session.finish(model.state_dict(), step, {"train_loss": loss.item()})


if __name__ == "__main__":
    main()
