"""One split of a run's snapshot for a user's script: this rank's batch at each step, the same after a resume.

`session.dataset("train")` gives a script the data path the templates use: rows sharded across ranks and
reshuffled every epoch from the spec's seed, addressed by the step. The step a checkpoint holds is therefore
the data's position too, and a resumed run reads exactly the batches it would have read. SplitBatches holds
the split in memory (a script may also take it whole); SplitStream (`stream=True`) reads it shard by shard,
for snapshots larger than memory (the GPT template's path).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from typing import NamedTuple

import torch

from training_platform.datasets import SnapshotManifest, load_manifest
from training_platform.datasets.manifest import IMAGE, LABEL, TEXT
from training_platform.datasets.reader import read_split_table, scale_features, split_arrays
from training_platform.datasets.store import SnapshotRoot
from training_platform.datasets.stream import StepBatches, StreamPlan, batch_loader
from training_platform.datasets.text import holds_tokens
from training_platform.train.sampler import StepSampler

MAX_PREFETCH_WORKERS = 2


class Batch(tuple):
    """`features, labels = batch`, as always; `batch.text` / `batch.image`: the rows' text (str) and encoded
    images (bytes), in the same order, where the snapshot has a text or image column (else None)."""

    text: list[str] | None
    image: list[bytes] | None

    def __new__(
        cls,
        features: torch.Tensor,
        labels: torch.Tensor,
        text: list[str] | None = None,
        image: list[bytes] | None = None,
    ) -> Batch:
        batch = super().__new__(cls, (features, labels))
        batch.text, batch.image = text, image
        return batch

    def __getnewargs__(self) -> tuple:  # a pickled batch (torch.save, a worker process) keeps its text and images
        return (self[0], self[1], self.text, self.image)

    @property
    def features(self) -> torch.Tensor:
        return self[0]

    @property
    def labels(self) -> torch.Tensor:
        return self[1]


def prefetch_workers(procs_per_node: int, cores: int | None = None) -> int:
    """DataLoader processes per rank for a streamed split: up to two where the node has cores to spare, none
    where every core already runs a rank (there they take CPU from the ranks they feed: 8% slower GPT steps
    with 2 ranks on 2 cores, at the same data wait)."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(0, min(MAX_PREFETCH_WORKERS, cores // procs_per_node - 1))


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
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        sampling: Sampling,
        label_names: list[str],
        split: str,
        roles: dict[str, list] | None = None,
    ):
        self.features, self.labels, self._sampling = features, labels, sampling
        self.label_names = label_names
        """Class i's name: the snapshot's string labels, else "0", "1", ..."""
        self.split = split
        roles = roles or {}
        self.text: list[str] | None = roles.get(TEXT)
        """The whole split's text, where the snapshot has a text column."""
        self.image: list[bytes] | None = roles.get(IMAGE)
        """The whole split's encoded images, where the snapshot has an image column."""

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
        table = read_split_table(root, manifest, split)
        arrays = split_arrays(table, manifest, split, scaled=not holds_tokens(manifest))
        features, labels = (torch.from_numpy(array) for array in arrays)
        names = manifest.label_names or [str(index) for index in range(manifest.num_classes)]
        roles = {name: table.column(name).to_pylist() for name in manifest.role_columns}
        return cls(features, labels, Sampling(batch_size, rank, world_size, seed), names, split, roles)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, step: int) -> Batch:
        rows = self.sampler.indices(step)
        picked = rows.tolist()
        text = [self.text[row] for row in picked] if self.text is not None else None
        image = [self.image[row] for row in picked] if self.image is not None else None
        return Batch(self.features[rows], self.labels[rows], text, image)

    def from_step(self, step: int, stop: int | None = None) -> Iterator[Batch]:
        """Batches for steps [step, stop); without `stop`, without end (the loop decides when to stop)."""
        while stop is None or step < stop:
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


class SplitStream:
    """A split read shard by shard through the node's shard cache, never whole in memory (`session.dataset(split,
    stream=True)`): `data[step]` is this rank's (features, labels) batch at 0-based `step`, and `data.from_step(step,
    stop)` yields the batches of steps [step, stop), decoded ahead in worker processes where the node has cores
    to spare. Order: the split's shards permuted per epoch from the seed, each rank its own shards, each shard's
    rows permuted (datasets/stream.py); like SplitBatches, the step alone is the data's position."""

    def __init__(self, batches: StepBatches, manifest: SnapshotManifest, workers: int):
        self.batches, self.manifest, self.workers = batches, manifest, workers
        self._tokens = holds_tokens(manifest)

    @classmethod
    def load(
        cls,
        root: SnapshotRoot,
        snapshot_id: str,
        split: str,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        columns: list[str] | None = None,
        workers: int = 0,
    ) -> SplitStream:
        """COLUMNS: the feature columns to read (default all), e.g. the first tokens of a long text row."""
        manifest = load_manifest(root, snapshot_id)
        if split not in manifest.splits:
            raise ValueError(f"snapshot {snapshot_id} has no split {split!r}; valid: {', '.join(manifest.split_names)}")
        if manifest.role_columns:
            raise ValueError(
                f"snapshot {snapshot_id} has {' and '.join(manifest.role_columns)}: a streamed split reads numeric "
                "columns only; read it with session.dataset(split) (in memory: batch.text, batch.image)"
            )
        features = columns or manifest.feature_columns
        unknown = [name for name in features if name not in manifest.feature_columns]
        if unknown:
            raise ValueError(
                f"snapshot {snapshot_id} has no feature column(s) {', '.join(unknown)}; its features are "
                f"{', '.join(manifest.feature_columns[:8])}{', ...' if len(manifest.feature_columns) > 8 else ''}"
            )
        plan = StreamPlan(tuple(ref.rows for ref in manifest.splits[split]), batch_size, rank, world_size, seed)
        return cls(StepBatches(root, manifest, split, plan, columns=[*features, LABEL]), manifest, workers)

    def __len__(self) -> int:
        return self.batches.num_rows

    def __getitem__(self, step: int) -> Batch:
        return self._batch(self.batches[step])

    def from_step(self, step: int, stop: int) -> Iterator[Batch]:
        if not self.workers:  # read in this process: decode now, before the first step, not between steps
            self.batches.preload(step)
        for rows in batch_loader(self.batches, step, stop, workers=self.workers):
            yield self._batch(rows)

    def epoch(self, step: int) -> int:
        return self.batches.plan.position(step)[0]

    @property
    def num_features(self) -> int:
        return len(self.batches.columns) - 1

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    def _batch(self, rows: torch.Tensor) -> Batch:
        features, labels = rows[:, :-1], rows[:, -1].long()
        if self._tokens:
            return Batch(features, labels)
        names = self.batches.columns[:-1]
        scaled = scale_features(features.numpy().astype("float32"), self.manifest, names)
        return Batch(torch.from_numpy(scaled), labels)
