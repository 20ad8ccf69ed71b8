"""Evaluate a run's lineage-linked checkpoint on the held-out test split of its snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from training_platform.checkpoints import CheckpointManifest, open_store
from training_platform.datasets import load_manifest, read_split
from training_platform.errors import CheckpointError
from training_platform.spec import TrainSpec
from training_platform.train.loop import evaluate
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


def find_checkpoint(store_uri: str | Path, run_id: str, step: int, manifest_sha256: str) -> CheckpointManifest:
    """The exact checkpoint recorded in the run's lineage, never 'the latest file on disk'."""
    for manifest in open_store(store_uri).list(run_id):
        if manifest.step == step and manifest.manifest_sha256 == manifest_sha256:
            return manifest
    raise CheckpointError(
        f"checkpoint step {step} (sha256 {manifest_sha256[:12]}) of run {run_id} is not in {store_uri}; "
        "it may have been deleted by retention: re-run the training_run partition"
    )


def load_model(spec: TrainSpec, snapshot_root: Path, store_uri: str | Path, manifest: CheckpointManifest) -> nn.Module:
    snapshot = load_manifest(snapshot_root, spec.dataset.snapshot_id)
    model = get_template(spec.model.template).build_model(spec, snapshot.num_features, snapshot.num_classes)
    state = open_store(store_uri).load(manifest)
    model.load_state_dict(state["user"]["model"])
    return model.eval()


def evaluate_checkpoint(
    spec: TrainSpec, snapshot_root: Path, store_uri: str | Path, manifest: CheckpointManifest
) -> tuple[Evaluation, nn.Module]:
    model = load_model(spec, snapshot_root, store_uri, manifest)
    features, labels = (torch.from_numpy(a) for a in read_split(snapshot_root, spec.dataset.snapshot_id, "test"))
    metrics = evaluate(model, features, labels)
    evaluation = Evaluation(
        test_accuracy=metrics["accuracy"],
        test_loss=metrics["loss"],
        test_rows=len(labels),
        checkpoint_uri=manifest.uri,
        checkpoint_step=manifest.step,
        weights_sha256=weights_sha256(model.state_dict()),
    )
    return evaluation, model
