"""Which rows each rank reads at each step: a pure function of (seed, step), so resume is exact."""

from __future__ import annotations

import torch


class StepSampler:
    """Deterministic per-epoch shuffling, sharded across ranks, addressable by global step.

    Epoch ``e`` uses the permutation drawn from ``seed + e``; step ``s`` of the run reads the
    ``s % steps_per_epoch``-th global batch of that permutation, and rank ``r`` takes its slice.
    The data position in a checkpoint is therefore just the step.
    """

    def __init__(self, num_rows: int, batch_size: int, rank: int, world_size: int, seed: int):
        self.global_batch = batch_size * world_size
        if num_rows < self.global_batch:
            raise ValueError(
                f"the training split has {num_rows} rows, fewer than one global batch "
                f"({batch_size} x {world_size} processes); lower training.batch_size"
            )
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.rank = rank
        self.seed = seed
        self.steps_per_epoch = num_rows // self.global_batch
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within the epoch) of the batch read at 0-based step."""
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int) -> torch.Tensor:
        epoch, batch = self.position(step)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = torch.randperm(self.num_rows, generator=generator)
            self._epoch = epoch
        start = batch * self.global_batch + self.rank * self.batch_size
        return self._perm[start : start + self.batch_size]
