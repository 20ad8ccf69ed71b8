"""Evaluate a run's lineage-linked checkpoint on the held-out test split of its snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training_platform.checkpoints import CheckpointManifest, open_store
from training_platform.datasets import load_manifest, read_split
from training_platform.datasets.reader import read_split_table
from training_platform.spec import TrainSpec
from training_platform.train.classifier_metrics import classifier_metrics
from training_platform.train.strategies.consolidate import full_model_state
from training_platform.train.templates import get_template
from training_platform.train.weights import weights_sha256


@dataclass(frozen=True)
class Evaluation:
    test_accuracy: float
    test_loss: float
    test_rows: int
    checkpoint_uri: str
    checkpoint_step: int
    weights_sha256: str

    @property
    def metrics(self) -> dict[str, float]:
        """By the names the spec's `evaluation.metrics` uses (spec.TEMPLATE_METRICS)."""
        return {"accuracy": self.test_accuracy, "loss": self.test_loss}


def find_checkpoint(store_uri: str | Path, run_id: str, step: int, manifest_sha256: str) -> CheckpointManifest:
    """The exact checkpoint recorded in the run's lineage, never 'the latest file on disk'."""
    return open_store(store_uri).find(run_id, step, manifest_sha256)


def load_model(
    spec: TrainSpec, snapshot_root: Path | str, store_uri: str | Path, manifest: CheckpointManifest
) -> nn.Module:
    """The template's model with the checkpoint's full weights (from any strategy's checkpoint format)."""
    snapshot = load_manifest(snapshot_root, spec.dataset.snapshot_id)
    model = get_template(spec.model.template).build_model(spec, snapshot.num_features, snapshot.num_classes)
    model.load_state_dict(full_model_state(open_store(store_uri), manifest))
    return model.eval()


def evaluate_checkpoint(
    spec: TrainSpec, snapshot_root: Path | str, store_uri: str | Path, manifest: CheckpointManifest
) -> tuple[Evaluation, nn.Module]:
    model = load_model(spec, snapshot_root, store_uri, manifest)
    template = get_template(spec.model.template)
    snapshot = load_manifest(snapshot_root, spec.dataset.snapshot_id)
    if hasattr(template, "evaluate_split"):  # templates with their own metric (language models)
        metrics = template.evaluate_split(model, snapshot_root, snapshot, "test", spec)
    else:
        features, labels = (torch.from_numpy(a) for a in read_split(snapshot_root, spec.dataset.snapshot_id, "test"))
        metrics = classifier_metrics(model, features, labels)
    evaluation = Evaluation(
        test_accuracy=metrics["accuracy"],
        test_loss=metrics["loss"],
        test_rows=snapshot.rows["test"],
        checkpoint_uri=manifest.uri,
        checkpoint_step=manifest.step,
        weights_sha256=weights_sha256(model.state_dict()),
    )
    return evaluation, model


def input_example(spec: TrainSpec, snapshot_root: Path | str) -> np.ndarray:
    """One test row as the model takes it: token ids for language models, features otherwise."""
    template = get_template(spec.model.template)
    snapshot = load_manifest(snapshot_root, spec.dataset.snapshot_id)
    if hasattr(template, "split_batch"):
        table = read_split_table(snapshot_root, snapshot, "test").slice(0, 1)
        row = torch.tensor([[table.column(c)[0].as_py() for c in snapshot.feature_columns[: spec.model.seq_len + 1]]])
        return template.split_batch(row, spec)[0].numpy()
    features, _ = read_split(snapshot_root, spec.dataset.snapshot_id, "test")
    return features[:1]
