"""A user's script, run again to evaluate one checkpoint: the worker's side of `evaluated_model`.

The platform starts the script as it started it for training, in one process, with TP_EVALUATION naming a
request. `session.restore()` then returns that exact checkpoint (the run's final one, by its lineage), so a
script that resumes correctly trains no further step; `session.finish(model, ...)` hands over the model,
which is measured on the test split of the snapshot the request names (by the function the script gave
`session.evaluate_with`, else as a classifier: accuracy and loss of its logits) and, for the candidate,
logged to the run's MLflow run: with the pytorch flavour, or the flavour a framework adapter sets
(`session.hooks.log_model_with`: the HF adapter's is transformers). The script's own code runs only here, never
in the Dagster process.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from training_platform.runs.layout import EVALUATION_FILE

if TYPE_CHECKING:
    from training_platform.checkpoints import CheckpointManifest, CheckpointStore
    from training_platform.train.split_data import SplitBatches

EVALUATION_ENV = "TP_EVALUATION"
"""Path of the request (JSON): set only in an evaluation process."""

Evaluator = Callable[[nn.Module, "SplitBatches"], Mapping[str, float]]
ModelLogger = Callable[[nn.Module, "SplitBatches"], str]
"""Logs the model into the active MLflow run under the name "model"; returns its model URI."""
Example = Callable[["SplitBatches"], torch.Tensor]
"""One input as the model takes it, made from the test split (the registry traces the model on it)."""


class EvaluationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint_key: str = Field(..., description="the run's key in the checkpoint store")
    step: int = Field(..., ge=0, description="the checkpoint's step")
    manifest_sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$", description="the checkpoint's manifest hash")
    store_uri: str
    tracking_uri: str | None = Field(None, description="MLflow, where the measured model is logged")
    log_model_to: str | None = Field(None, description="the MLflow run to log the model into (the candidate's)")

    @classmethod
    def from_env(cls) -> EvaluationRequest | None:
        path = os.environ.get(EVALUATION_ENV)
        return cls.model_validate_json(Path(path).read_text()) if path else None


def exact_checkpoint(store: CheckpointStore, request: EvaluationRequest) -> CheckpointManifest:
    """The checkpoint the request names."""
    return store.find(request.checkpoint_key, request.step, request.manifest_sha256)


def evaluate_model(
    model: Any,
    test: SplitBatches,
    evaluator: Evaluator | None,
    request: EvaluationRequest,
    run_dir: Path,
    step: int,
    logger: ModelLogger | None = None,
) -> dict:
    """Measure MODEL on the test split, log it when asked, and write the result the platform reads back."""
    from training_platform.train.weights import weights_sha256

    if not isinstance(model, nn.Module):
        raise TypeError(
            "in an evaluation, session.finish needs the model itself, not its state_dict: call "
            "session.finish(model, step, metrics) so the platform can measure and register it"
        )
    model = getattr(model, "module", model)  # DistributedDataParallel and the like wrap the module
    if step != request.step:
        raise RuntimeError(
            f"the script finished at step {step}, but it was evaluating the checkpoint of step {request.step}: "
            "resume from session.restore() and train only while step < training.max_steps"
        )
    model.eval()
    metrics = _metrics(evaluator(model, test) if evaluator is not None else _classifier_metrics(model, test))
    result = {
        "metrics": metrics,
        "test_rows": len(test),
        "step": step,
        "weights_sha256": weights_sha256(model.state_dict()),
        "model_uri": _log_model(model, test, request, logger or log_pytorch_model) if request.log_model_to else None,
    }
    (run_dir / EVALUATION_FILE).write_text(json.dumps(result, indent=2))
    return result


def _classifier_metrics(model: nn.Module, test: SplitBatches) -> Mapping[str, float]:
    from training_platform.train.classifier_metrics import classifier_metrics

    if not test.features.shape[1]:
        raise ValueError(
            "the snapshot has no numeric features for the default evaluation (model(features)): measure your model "
            "on the test split's text or images with session.evaluate_with(evaluate), evaluate(model, test) "
            "returning the spec's evaluation.metrics"
        )
    return classifier_metrics(model, test.features, test.labels)


def _metrics(reported: Mapping[str, Any]) -> dict[str, float]:
    metrics = {}
    for name, value in dict(reported).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"the evaluation reported {name}={value!r}; report numbers (float)") from None
        if not math.isfinite(number):
            raise ValueError(f"the evaluation reported {name}={number}; a metric must be a finite number")
        metrics[str(name)] = number
    return metrics


def _log_model(model: nn.Module, test: SplitBatches, request: EvaluationRequest, logger: ModelLogger) -> str:
    """The measured model in the candidate's MLflow run; registered_model registers it."""
    import mlflow

    mlflow.set_tracking_uri(request.tracking_uri)
    with mlflow.start_run(run_id=request.log_model_to):
        return logger(model, test)


def log_pytorch_model(model: nn.Module, test: SplitBatches, example: Example | None = None) -> str:
    """The pytorch flavour's safe format (torch.export, no pickle), traced on one input: `example(test)`, else the
    first test row's features."""
    import mlflow.pytorch

    from training_platform.train.model_requirements import model_requirements

    if example is not None:
        sample = example(test)
    elif test.features.shape[1]:
        sample = test.features[:1]
    else:
        raise ValueError(
            "the snapshot has no numeric features to trace the model on for the registry: give one input as the model "
            "takes it, session.evaluate_with(evaluate, example=lambda test: ...), e.g. your encoding of test.text[:1]"
        )
    sample = sample.detach().cpu().numpy() if isinstance(sample, torch.Tensor) else sample
    info = mlflow.pytorch.log_model(model, name="model", input_example=sample, pip_requirements=model_requirements())
    return info.model_uri
