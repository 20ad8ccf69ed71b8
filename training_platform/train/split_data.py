"""One split of a run's snapshot for a user's script: this rank's batch at each step, the same after a resume.

`session.dataset("train")` gives a script the data path the templates use: rows sharded across ranks and
reshuffled every epoch from the spec's seed, addressed by the step. The step a checkpoint holds is therefore
the data's position too, and a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import NamedTuple

import torch

from training_platform.datasets import load_manifest, read_split
from training_platform.datasets.store import SnapshotRoot
from training_platform.datasets.text import holds_tokens
from training_platform.train.sampler import StepSampler

Batch = tuple[torch.Tensor, torch.Tensor]


class Sampling(NamedTuple):
    """StepSampler's arguments after the row count."""

    batch_size: int
    rank: int
    world_size: int
    seed: int


class SplitBatches:
    """`batches[step]`: (features, labels) this rank trains on at 0-based `step`; `features`/`labels`: the whole
    split (for an evaluation). Features are float32 in [0, 1] (each by its range), labels int64 class ids; a text
    snapshot's features are its int64 token ids (a window of text per row), its label the token that follows."""

    def __init__(
        self, features: torch.Tensor, labels: torch.Tensor, sampling: Sampling, label_names: list[str], split: str
    ):
        self.features, self.labels, self._sampling = features, labels, sampling
        self.label_names = label_names
        """Class i's name: the snapshot's string labels, else "0", "1", ..."""
        self.split = split

    @cached_property
    def sampler(self) -> StepSampler:
        """Built at the first batch: a split read whole (an evaluation's) may hold fewer rows than one batch."""
        try:
            return StepSampler(len(self.labels), *self._sampling)
        except ValueError as exc:
            raise ValueError(str(exc).replace("the training split", f"the {self.split} split")) from None

    @classmethod
    def load(
        cls, root: SnapshotRoot, snapshot_id: str, split: str, *, batch_size: int, rank: int, world_size: int, seed: int
    ) -> SplitBatches:
        manifest = load_manifest(root, snapshot_id)
        arrays = read_split(root, snapshot_id, split, scaled=not holds_tokens(manifest))
        features, labels = (torch.from_numpy(array) for array in arrays)
        names = manifest.label_names or [str(index) for index in range(manifest.num_classes)]
        return cls(features, labels, Sampling(batch_size, rank, world_size, seed), names, split)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, step: int) -> Batch:
        rows = self.sampler.indices(step)
        return self.features[rows], self.labels[rows]

    def from_step(self, step: int) -> Iterator[Batch]:
        """Batches for `step`, `step` + 1, ... without end (the loop decides when to stop)."""
        while True:
            yield self[step]
            step += 1

    def epoch(self, step: int) -> int:
        return self.sampler.position(step)[0]

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)
