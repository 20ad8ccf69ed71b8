"""A team's own model on its own files: a small classifier of the wine measurements in ./data.

    tp train examples/own_data/spec.yaml

The platform snapshots the files, checks the spec's expectations, and runs this script under torchrun. When
training ends it runs the script once more to evaluate: `session.restore()` then returns the final
checkpoint (the loop below has nothing left to do) and `session.finish(model, ...)` measures the model with
`evaluate` on the snapshot's test split. The metrics the spec's `evaluation` names go to MLflow and decide,
through the gate, whether the registered model becomes the champion.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training_platform.train.session import TrainingSession
from training_platform.train.split_data import SplitBatches


def evaluate(model: nn.Module, test: SplitBatches) -> dict[str, float]:
    """Accuracy, loss and macro-averaged F1 (each class counts the same, however few its rows)."""
    with torch.no_grad():
        logits = model(test.features)
    predicted = logits.argmax(dim=1)
    f1 = []
    for label in range(test.num_classes):
        hits = ((predicted == label) & (test.labels == label)).sum().item()
        guessed, actual = (predicted == label).sum().item(), (test.labels == label).sum().item()
        f1.append(2 * hits / (guessed + actual) if guessed + actual else 1.0)
    return {
        "accuracy": (predicted == test.labels).float().mean().item(),
        "loss": F.cross_entropy(logits, test.labels).item(),
        "f1_macro": sum(f1) / len(f1),
    }


def main() -> None:
    with TrainingSession.start() as session:
        session.evaluate_with(evaluate)
        cfg = session.spec.training
        data = session.dataset("train")  # features scaled to [0, 1]; labels are the cultivars' class ids

        model = nn.Sequential(nn.Linear(data.num_features, 32), nn.ReLU(), nn.Linear(32, data.num_classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
        step = 0
        if (restored := session.restore()) is not None:
            state, step = restored
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        trained = DistributedDataParallel(model) if session.dist.world_size > 1 else model

        def state() -> dict:
            return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

        loss = torch.tensor(0.0)
        while step < cfg.max_steps:
            features, labels = data[step]
            loss = F.cross_entropy(trained(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if session.after_step(step, state, {"train_loss": loss.detach()}):
                break  # preempted: saved, and the platform resumes the run from here
        session.finish(model, step, {"train_loss": loss.item()})


if __name__ == "__main__":
    main()
