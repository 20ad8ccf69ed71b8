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

from training_platform.train.session import TrainingSession


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=48, help="hidden units")
    args = parser.parse_args()

    with TrainingSession.start() as session:  # the spec the launcher wrote; the process group; seeds
        cfg = session.spec.training
        data = session.dataset("train")  # data[step]: this rank's batch, reshuffled each epoch from the seed

        hidden = nn.Linear(data.num_features, args.hidden)
        model = nn.Sequential(hidden, nn.Tanh(), nn.Linear(args.hidden, data.num_classes))
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
            features, labels = data[step]  # the data's position is the step: a resume reads what it would have
            loss = F.cross_entropy(trained(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            # Reports every log_every steps, checkpoints when due; True on a preemption notice, state saved.
            if session.after_step(step, state, {"train_loss": loss.detach()}):
                break
        session.finish(model, step, {"train_loss": loss.item()})  # the model: evaluated and registered


if __name__ == "__main__":
    main()
